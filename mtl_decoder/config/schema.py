"""The experiment configuration's sections as checked dataclasses.

The experiment configuration's sections: typed dataclasses, a docstring per field, every value checked in
``__post_init__`` with an error naming its key (the loader adds the section's prefix). ``model`` is in model.py
(``model.trunk`` in trunk.py), a task's section in task.py; ``ExperimentConfig`` puts them together."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtl_decoder.config.checks import check_choice, check_positive
from mtl_decoder.config.model import ModelConfig
from mtl_decoder.config.task import TaskConfig
from mtl_decoder.errors import ConfigError
from mtl_decoder.files import atomic_write_text


@dataclass
class TokenizerConfig:
    kind: str = "bpe"
    """'bpe', 'wordpiece' or 'wordlevel' (whole words, rare ones [UNK]) trained on the tasks' training texts, or
    'pretrained' (any HF tokenizer). 'bpe' and 'wordlevel' train deterministically; 'wordpiece' training in
    `tokenizers` varies run to run (ties broken in hash order), so only a saved run reproduces exactly with it."""
    vocab_size: int = 16000
    """Vocabulary size of a trained tokenizer."""
    pretrained: str | None = None
    """Hugging Face tokenizer id or local path, when kind is 'pretrained'."""
    lowercase: bool = False
    """Lower-case text before tokenising (the default keeps case: it is evidence for names)."""
    min_frequency: int = 2
    """A trained tokenizer's pieces must occur at least this often."""

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, ("bpe", "wordpiece", "wordlevel", "pretrained"))
        check_positive("vocab_size", self.vocab_size)
        if self.kind == "pretrained" and not self.pretrained:
            raise ConfigError("pretrained", "is required when tokenizer.kind is 'pretrained'")


@dataclass
class DataConfig:
    max_length: int = 128
    """Maximum sub-word tokens per example; longer examples are truncated and counted."""
    batch_size: int = 32
    """Examples per training batch (per process)."""
    eval_batch_size: int = 64
    """Examples per batch in validation, evaluate and predict (one setting, so their numbers agree)."""
    sampling: str = "proportional"
    """How batches draw from the task sources: 'proportional', 'temperature' or 'round_robin' (sources in turn:
    with two sources and an even batch size, every batch is exactly half each). Each source is read as one
    shuffled stream across epochs, so every example is seen once before any is seen twice."""
    temperature: float = 2.0
    """T for temperature sampling: source k is drawn with probability proportional to n_k^(1/T)."""
    group_by_length: bool = True
    """Form batches of similar length (less padding) within a window of 64 batches, each source sorted apart:
    a batch keeps exactly the task mix drawn for it (on the CoNLL + SST-2 benchmark, 76% of padded positions
    are real tokens with it, 33% without; benchmarks/results/batch_mix.json)."""
    repair_iob: bool = False
    """Repair invalid IOB2 tags (an I-X without B-X/I-X before it becomes B-X) instead of failing."""
    word_dropout: float = 0.0
    """Training only: probability of replacing all sub-words of a word with [UNK] (labels kept)."""

    def __post_init__(self) -> None:
        for name in ("max_length", "batch_size", "eval_batch_size", "temperature"):
            check_positive(name, getattr(self, name))
        if self.max_length < 4:
            raise ConfigError("max_length", f"must be at least 4, got {self.max_length}")
        check_choice("sampling", self.sampling, ("proportional", "temperature", "round_robin"))
        if not 0.0 <= self.word_dropout < 1.0:
            raise ConfigError("word_dropout", f"must lie in [0, 1), got {self.word_dropout}")


@dataclass
class TrainingConfig:
    output_dir: str = "runs/default"
    """Run directory: config, metrics.jsonl, best/ and checkpoints/."""
    seed: int = 0
    """Seed for initialisation, sampling and dropout."""
    epochs: int = 3
    """Passes over the training data (one epoch = the sum of the task sources' sizes, in batches)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs when set)."""
    max_minutes: float | None = None
    """Stop (validate, keep the best, checkpoint) once training has taken this long, validations included. A
    safety net for step-bound runs: while it is set, the learning-rate schedule runs on the larger of the step
    fraction (step / total steps) and the fraction of this budget spent, so a run it stops early still ends with
    the rate decayed; while the steps are ahead of the clock, the schedule is the plain step schedule."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to norms, biases and gates' biases)."""
    warmup_ratio: float = 0.06
    """Fraction of steps with linear warm-up."""
    schedule: str = "cosine"
    """Decay after warm-up: 'linear', 'cosine' or 'constant'."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 = off). Either way metrics.jsonl logs the norm before clipping (``grad_norm``, the
    mean over each logging window) and the share of the window's steps the clip scaled down (``clipped_share``)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step."""
    mixed_precision: str = "no"
    """'no', 'bf16' or 'fp16' (autocast through Accelerate). Validation during training runs under it too: the best
    checkpoint is chosen on what the model predicts in that precision (``evaluate --precision`` scores another)."""
    eval_every: int = 0
    """Validate every N optimizer steps (0 = at the end of every epoch)."""
    patience: int = 0
    """Stop after this many validations without improvement (0 = never)."""
    keep_checkpoints: int = 2
    """Resumable checkpoints kept in checkpoints/ (newest first)."""
    log_every: int = 20
    """Log losses and balancing weights every N optimizer steps."""
    resume_from: str | None = None
    """A checkpoint directory to resume from (or use --resume for the latest)."""
    progress: bool = True
    """Show tqdm progress bars."""
    keep_freed_memory: bool = False
    """Ask glibc (Linux) to keep freed memory for reuse instead of returning large blocks to the OS: faster steps
    when large gradient tensors are allocated afresh every step, at the cost of the process keeping its peak
    size. Process-wide, hence opt-in (the shipped configs turn it on)."""

    def __post_init__(self) -> None:
        for name in ("epochs", "lr", "grad_accum_steps", "log_every", "keep_checkpoints"):
            check_positive(name, getattr(self, name))
        for name in ("weight_decay", "max_grad_norm", "eval_every", "patience"):
            check_positive(name, getattr(self, name), allow_zero=True)
        if self.max_steps is not None:
            check_positive("max_steps", self.max_steps)
        if self.max_minutes is not None:
            check_positive("max_minutes", self.max_minutes)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError("warmup_ratio", f"must lie in [0, 1), got {self.warmup_ratio}")
        check_choice("schedule", self.schedule, ("linear", "cosine", "constant"))
        check_choice("mixed_precision", self.mixed_precision, ("no", "bf16", "fp16"))


@dataclass
class BalancingConfig:
    method: str = "ema"
    """'ema' (loss / detached EMA of itself), 'equal', 'static' (task loss_weight), 'dwa' or 'uncertainty'."""
    beta: float = 0.98
    """EMA decay for 'ema'."""
    scale: float = 1.0
    """Global coefficient c in total = c * sum_k w_k * L_k."""
    temperature: float = 2.0
    """Temperature of 'dwa'."""
    min_weight: float | None = None
    """Guard for 'ema' (at most 1): with a guard set, the weights are divided by their geometric mean, then each
    is kept within [min_weight, max_weight] by water-filling so that the geometric mean stays 1 (e.g. 0.5 and
    2.0: EMA losses 0.01 and 1.0 give weights 2 and 0.5). Two tasks' weights then differ at most
    max_weight / min_weight times. Both bounds bind for any number of tasks (training/balancing.py)."""
    max_weight: float | None = None
    """Guard for 'ema' (at least 1): cap on a task's weight relative to the geometric mean; see min_weight."""

    def __post_init__(self) -> None:
        check_choice("method", self.method, ("ema", "equal", "static", "dwa", "uncertainty"))
        if not 0.0 <= self.beta < 1.0:
            raise ConfigError("beta", f"must lie in [0, 1), got {self.beta}")
        check_positive("scale", self.scale)
        check_positive("temperature", self.temperature)
        for name in ("min_weight", "max_weight"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.min_weight and self.max_weight and self.min_weight > self.max_weight:
            raise ConfigError("min_weight", f"{self.min_weight} is above max_weight {self.max_weight}")
        if self.min_weight is not None and self.min_weight > 1:
            raise ConfigError(
                "min_weight", f"must be at most 1 (a bound relative to the weights' mean), got {self.min_weight}"
            )
        if self.max_weight is not None and self.max_weight < 1:
            raise ConfigError(
                "max_weight", f"must be at least 1 (a bound relative to the weights' mean), got {self.max_weight}"
            )


@dataclass
class EvaluationConfig:
    position_buckets: list[int] = field(default_factory=lambda: [4, 8, 16, 32, 64])
    """Upper bounds (exclusive) of the token-position buckets for expert utilisation; the last bucket is open."""
    dead_expert_fraction: float = 0.25
    """An expert is dead when its mean gate weight is below this fraction of uniform."""

    def __post_init__(self) -> None:
        if sorted(set(self.position_buckets)) != self.position_buckets or any(b <= 0 for b in self.position_buckets):
            raise ConfigError("position_buckets", f"must be increasing positive integers, got {self.position_buckets}")


@dataclass
class DistillConfig:
    """The ``distill`` section: learning from a teacher model's soft targets.

    Distillation (``mtl-decoder distill``): the student learns each task from a teacher model's soft targets
    mixed with the gold labels. Defaults from the literature (Hinton et al. 2015: T=2, an even mix), to be
    measured on the benchmark."""

    teacher: str | None = None
    """The teacher's saved model folder (RUN/best); --teacher sets it."""
    teacher_hash: str | None = None
    """Fingerprint of the teacher folder the targets come from; set by distill and kept in the run's config, so a
    resume (or a run from a stored config) refuses a teacher that changed since."""
    teacher_precision: str = "fp32"
    """How the teacher runs when it labels: 'fp32', or 'int8' (on a CPU: W8A8 with the SmoothQuant scales that
    ``mtl-decoder quantize`` stored in the teacher's folder, else dynamic int8), about three times as fast for a
    pretrained trunk, its targets cached apart (the fingerprint covers the precision and the scales)."""
    temperature: float = 2.0
    """Softening temperature T of teacher and student distributions; the divergence is scaled by T^2."""
    alpha: float = 0.5
    """Weight of the teacher term in each task's loss: alpha * T^2 * KL + (1 - alpha) * gold loss (where a gold
    label exists; texts without one carry only the teacher term)."""
    soft: bool = True
    """false: train on the teacher's hard labels (its most probable tag / class) instead of its distributions."""
    unlabelled: list[str] = field(default_factory=list)
    """Files of unlabelled text (any input format predict reads) the teacher labels for the transfer set."""
    unlabelled_limit: int | None = None
    """Read at most this many texts from each unlabelled file (None: all)."""
    cache_dir: str | None = None
    """Where teacher targets are kept (default: $MTL_DECODER_CACHE/targets, else ~/.cache/mtl-decoder/targets)."""
    state_weight: float = 0.0
    """> 0: each tagging task's loss gains this weight times the mean squared difference between the student's
    state of each word and the teacher's, projected to the student's width (TinyBERT's intermediate-layer loss;
    distill/states.py); the teacher's word states are cached beside its targets. 0: off."""
    sentence_state_weight: float = 0.0
    """> 0: each classification task's loss gains this weight times the mean squared difference between the
    student's pooled sentence state (its head's input) and the teacher's, on a projection of its own to the
    student's width (distill/states.py); cached beside the targets in a store of their own. 0: off."""

    def __post_init__(self) -> None:
        check_choice("teacher_precision", self.teacher_precision, ("fp32", "int8"))
        check_positive("temperature", self.temperature)
        for key in ("state_weight", "sentence_state_weight"):
            if not getattr(self, key) >= 0:
                raise ConfigError(key, f"must be 0 (off) or positive, got {getattr(self, key)}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError("alpha", f"must lie in [0, 1], got {self.alpha}")
        if self.unlabelled_limit is not None:
            check_positive("unlabelled_limit", self.unlabelled_limit)


@dataclass
class ExperimentConfig:
    tasks: dict[str, TaskConfig]
    """The tasks, by name (in the YAML: a list of task files, or of inline task mappings)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The decoder trunk and its expert blocks."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """How text becomes ids."""
    data: DataConfig = field(default_factory=DataConfig)
    """Batching, sampling and input checks."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Optimisation, validation and checkpoints."""
    balancing: BalancingConfig = field(default_factory=BalancingConfig)
    """How task losses are combined."""
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    """Evaluation and expert-utilisation settings."""
    distill: DistillConfig | None = None
    """Distillation from a teacher model (set by ``mtl-decoder distill``; None for plain training)."""

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError("tasks", "at least one task is required")
        for key, task in self.tasks.items():
            if key != task.name:
                raise ConfigError(f"tasks.{key}.name", f"task listed as '{key}' is named '{task.name}'")
        model = self.model
        if model.position_embedding != "rope" and self.data.max_length > model.position_max_length:
            raise ConfigError(
                "model.position_max_length",
                f"{model.position_max_length} rows cannot place data.max_length {self.data.max_length} positions: "
                f"set model.position_max_length={self.data.max_length} or more",
            )
        trunk = self.model.trunk
        if trunk.enabled and trunk.mode != "frozen" and model.position_embedding != "rope":
            raise ConfigError(
                "model.position_embedding",
                f"'{model.position_embedding}' needs native layers: a pretrained trunk in mode '{trunk.mode}' places "
                "positions itself (use 'rope', or model.trunk.mode=frozen)",
            )
        if trunk.caches_states and self.data.word_dropout:
            raise ConfigError(
                "data.word_dropout",
                f"must be 0 with model.trunk.mode={trunk.mode}: the frozen trunk's states are cached per token "
                "sequence, and dropped words would make every sequence new",
            )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["tasks"] = [dataclasses.asdict(t) for t in self.tasks.values()]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def save(self, path: str | Path) -> None:
        """Write the resolved config as YAML (whole or not at all)."""
        atomic_write_text(path, self.to_yaml())
