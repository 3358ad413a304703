"""The experiment configuration's sections: typed dataclasses, a docstring per field, every value checked in
``__post_init__`` with an error naming its key (the loader adds the section's prefix)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtl_decoder.config.checks import check_choice, check_positive
from mtl_decoder.config.kinds import DEFAULT_PRIMARY_METRIC, METRICS, TASK_KINDS
from mtl_decoder.config.trunk import TrunkConfig, check_trunk_model
from mtl_decoder.config.variants import VARIANTS, Variant
from mtl_decoder.errors import ConfigError
from mtl_decoder.files import atomic_write_text

POSITION_EMBEDDINGS = ("rope", "linear", "linear_only")


@dataclass
class ModelConfig:
    d_model: int = 256
    """Width of the residual stream."""
    n_layers: int = 4
    """Number of decoder layers."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    attention: str = "causal"
    """'causal' (the decoder form) or 'bidirectional' (every token sees the whole sentence)."""
    norm: str = "rmsnorm"
    """Pre-LN normalisation: 'rmsnorm' or 'layernorm'."""
    ffn: str = "ple"
    """The expert blocks (config/variants.py): 'ple' (PLE, in every layer), 'cgc' (single-level CGC) or 'mmoe' (MMoE),
    both in the top layer over a shared bottom of plain MLPs, 'cgc_stacked' / 'mmoe_stacked' (in every layer, task
    streams from layer 0: ablations), or 'mlp' (hard sharing)."""
    n_shared_experts: int = 2
    """Shared experts per expert layer (every gated variant)."""
    n_task_experts: int = 2
    """Experts per task per expert layer (ple, cgc, cgc_stacked)."""
    expert_hidden: int = 512
    """Hidden size of each SwiGLU expert."""
    mlp_hidden: int | None = None
    """Hidden size of the plain SwiGLU MLPs (every layer of 'mlp', the shared bottom of 'cgc' and 'mmoe'); None = what
    one route sees in a CGC layer ((n_task_experts + n_shared_experts) x expert_hidden), so they compare at equal
    width."""
    initial_shared_weight: float = 0.7
    """Share of every gate's mass on the shared experts at initialisation (0 < w < 1)."""
    dropout: float = 0.1
    """Dropout on the embedding and on each residual branch."""
    rope_base: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
    position_embedding: str = "rope"
    """How positions enter: 'rope' (rotary positions in attention), 'linear' (RoPE plus the position-aware linear
    sub-layer x_i * (1 + alpha_i) + beta_i, (alpha_i, beta_i) read from a learned position table through a linear
    map that starts at zero: the identity at initialisation) or 'linear_only' (the sub-layer without RoPE)."""
    position_embedding_where: str = "input"
    """Where the linear sub-layer sits: 'input' (once, before the first layer) or 'every_layer' (before each)."""
    position_max_length: int = 512
    """Rows of the linear sub-layer's position table: the longest sequence it can place (at least data.max_length;
    a longer one is an error, never interpolated)."""
    position_scale_bound: float | None = None
    """Bound b on the linear sub-layer's scale: alpha = b * tanh(raw / b), so the factor stays in (1 - b, 1 + b)
    (None: unbounded; b <= 1 keeps it positive)."""
    char_embedding: int = 0
    """Width of a character-CNN feature per word added to its sub-words (0 = off). Helps unseen names."""
    word_features: bool = False
    """Add an embedding of each word's shape/case class (Xxxx, XXXX, xxxx, dd, ...) to its sub-words."""
    word_hash_buckets: int = 0
    """Hashed sparse features per word (the word, lower-cased, its 2-4 letter prefixes and suffixes) in this many
    buckets, summed and added to the word's sub-words, as a feature-based CRF tagger sees words (0 = off)."""
    word_hash_dim: int = 64
    """Width of the hashed-feature embedding (projected to d_model)."""
    tagging_decoder: str = "softmax"
    """How tag sequences are decoded: 'softmax' (per token) or 'crf' (linear-chain CRF, Viterbi)."""
    word_token: str = "auto"
    """Which sub-word of a word carries its tag and is read for it: 'first', 'last', or 'auto' (default: the last
    with causal attention, where only a word's last sub-word has seen the whole word; the first otherwise). A lone
    whitespace piece (byte-level 'Ġ' before a number, SentencePiece '▁') is never read (data/alignment.py). Model
    folders saved before 'auto' was the default read as 'first', as they were trained."""
    trunk: TrunkConfig = field(default_factory=TrunkConfig)
    """A pretrained trunk; with one, d_model/n_heads/norm describe only the native layers of mode 'frozen', and the
    tokenizer and maximum length come from the checkpoint."""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "expert_hidden"):
            check_positive(name, getattr(self, name), allow_zero=name == "n_layers" and self.trunk.mode == "hybrid")
        check_trunk_model(self)
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError("n_heads", f"d_model {self.d_model} / n_heads {self.n_heads} must be an even integer")
        check_choice("attention", self.attention, ("causal", "bidirectional"))
        check_choice("norm", self.norm, ("rmsnorm", "layernorm"))
        check_choice("ffn", self.ffn, tuple(VARIANTS))
        check_choice("tagging_decoder", self.tagging_decoder, ("softmax", "crf"))
        check_choice("word_token", self.word_token, ("first", "last", "auto"))
        check_choice("position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        check_choice("position_embedding_where", self.position_embedding_where, ("input", "every_layer"))
        check_positive("position_max_length", self.position_max_length)
        if self.position_scale_bound is not None:
            check_positive("position_scale_bound", self.position_scale_bound)
        if self.variant.gated:
            check_positive("n_shared_experts", self.n_shared_experts)
        if self.variant.task_experts:
            check_positive("n_task_experts", self.n_task_experts)
        if self.mlp_hidden is not None:
            check_positive("mlp_hidden", self.mlp_hidden)
        if not 0.0 < self.initial_shared_weight < 1.0:
            raise ConfigError(
                "initial_shared_weight", f"must lie strictly between 0 and 1, got {self.initial_shared_weight}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", f"must lie in [0, 1), got {self.dropout}")
        if 0.0 < self.dropout < 2.0**-16:  # the model's dropout draws 16 bits per element (model/layers.py)
            raise ConfigError("dropout", f"{self.dropout} is below 1/65,536, the smallest dropout drawn; use 0 or more")
        check_positive("char_embedding", self.char_embedding, allow_zero=True)
        check_positive("word_hash_buckets", self.word_hash_buckets, allow_zero=True)
        if self.word_hash_buckets == 1:
            raise ConfigError("word_hash_buckets", "must be 0 (off) or at least 2")
        check_positive("word_hash_dim", self.word_hash_dim)

    @property
    def word_token_position(self) -> str:
        """'first' or 'last': ``word_token`` with 'auto' resolved by the attention mode."""
        if self.word_token == "auto":
            return "last" if self.attention == "causal" else "first"
        return self.word_token

    @property
    def variant(self) -> Variant:
        return VARIANTS[self.ffn]

    @property
    def mlp_width(self) -> int:
        return self.mlp_hidden or (self.n_task_experts + self.n_shared_experts) * self.expert_hidden


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
    """Gradient clipping norm (0 = off)."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step."""
    mixed_precision: str = "no"
    """'no', 'bf16' or 'fp16' (autocast through Accelerate)."""
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
    """Distillation (``mtl-decoder distill``): the student learns each task from a teacher model's soft targets
    mixed with the gold labels. Defaults from the literature (Hinton et al. 2015: T=2, an even mix), to be
    measured on the benchmark."""

    teacher: str | None = None
    """The teacher's saved model folder (RUN/best); --teacher sets it."""
    teacher_hash: str | None = None
    """Fingerprint of the teacher folder the targets come from; set by distill and kept in the run's config, so a
    resume (or a run from a stored config) refuses a teacher that changed since."""
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

    def __post_init__(self) -> None:
        check_positive("temperature", self.temperature)
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError("alpha", f"must lie in [0, 1], got {self.alpha}")
        if self.unlabelled_limit is not None:
            check_positive("unlabelled_limit", self.unlabelled_limit)


@dataclass
class TaskDataConfig:
    train: str | None = None
    """Training data: a local file (.jsonl .json .csv .tsv .parquet .conll) or, with hub_id, a split name."""
    validation: str | None = None
    """Validation data (used for selection and early stopping)."""
    test: str | None = None
    """Test data (used only by evaluate)."""
    hub_id: str | None = None
    """A Hugging Face dataset id; the split fields then name its splits."""
    hub_config: str | None = None
    """The dataset's configuration name, if it has several."""


@dataclass
class ColumnsConfig:
    tokens: str = "tokens"
    """Column with a list of words (pre-tokenised input)."""
    tags: str = "ner_tags"
    """Column with one IOB2 tag per word (token_tagging)."""
    text: str = "text"
    """Column with raw text (sentence_classification)."""
    label: str = "label"
    """Column with the class label (sentence_classification)."""


@dataclass
class TaskConfig:
    name: str
    """Unique task name; heads, metrics and overrides (tasks.NAME.field=...) use it."""
    kind: str
    """'token_tagging' (IOB2 tags per word) or 'sentence_classification' (one label per example)."""
    data: TaskDataConfig = field(default_factory=TaskDataConfig)
    """Where each split comes from."""
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    """Column names in the data files."""
    labels: list[str] | None = None
    """The label set (tags for tagging, classes for classification); None = inferred from train."""
    primary_metric: str | None = None
    """Metric used for selection: default 'f1' for tagging, 'accuracy' for classification."""
    loss_weight: float = 1.0
    """Weight of the task's loss under balancing.method 'static'."""
    metric_weight: float = 1.0
    """Weight of the task's primary metric in the selection score (weighted mean)."""

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, TASK_KINDS)
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError("name", f"{self.name!r} must be a non-empty identifier (letters, digits, _ or -)")
        if self.primary_metric is None:
            self.primary_metric = DEFAULT_PRIMARY_METRIC[self.kind]
        check_choice("primary_metric", self.primary_metric, METRICS[self.kind])
        check_positive("loss_weight", self.loss_weight, allow_zero=True)
        check_positive("metric_weight", self.metric_weight, allow_zero=True)
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ConfigError("labels", "contains duplicates")


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
