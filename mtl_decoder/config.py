"""Experiment configuration: typed dataclasses loaded from YAML, with dotted ``key=value`` overrides.

Every field carries a docstring; every value is validated in ``__post_init__`` with an error that names the
full dotted key. ``load_config`` is the one entry point: YAML file -> task files -> overrides -> dataclasses.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtl_decoder.errors import ConfigError, did_you_mean

TAGGING = "token_tagging"
CLASSIFICATION = "sentence_classification"
TASK_KINDS = (TAGGING, CLASSIFICATION)
SPLITS = ("train", "validation", "test")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, f"{value!r} is not one of {', '.join(choices)}{did_you_mean(str(value), choices)}")


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")


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
    """Expert block in every layer: 'ple' (paper-faithful), 'cgc', 'mmoe' or 'mlp' (hard sharing)."""
    n_shared_experts: int = 2
    """Shared experts per layer (ple, cgc, mmoe)."""
    n_task_experts: int = 2
    """Experts per task per layer (ple, cgc)."""
    expert_hidden: int = 512
    """Hidden size of each SwiGLU expert."""
    mlp_hidden: int | None = None
    """Hidden size of the 'mlp' variant's SwiGLU; None = what one route sees in 'cgc'
    ((n_task_experts + n_shared_experts) x expert_hidden), so the variants compare at equal width."""
    initial_shared_weight: float = 0.7
    """Share of every gate's mass on the shared experts at initialisation (0 < w < 1)."""
    dropout: float = 0.1
    """Dropout on the embedding and on each residual branch."""
    rope_base: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
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

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "expert_hidden"):
            _positive(name, getattr(self, name))
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ConfigError("n_heads", f"d_model {self.d_model} / n_heads {self.n_heads} must be an even integer")
        _choice("attention", self.attention, ("causal", "bidirectional"))
        _choice("norm", self.norm, ("rmsnorm", "layernorm"))
        _choice("ffn", self.ffn, ("ple", "cgc", "mmoe", "mlp"))
        _choice("tagging_decoder", self.tagging_decoder, ("softmax", "crf"))
        if self.ffn != "mlp":
            _positive("n_shared_experts", self.n_shared_experts)
        if self.ffn in ("ple", "cgc"):
            _positive("n_task_experts", self.n_task_experts)
        if self.mlp_hidden is not None:
            _positive("mlp_hidden", self.mlp_hidden)
        if not 0.0 < self.initial_shared_weight < 1.0:
            raise ConfigError(
                "initial_shared_weight", f"must lie strictly between 0 and 1, got {self.initial_shared_weight}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError("dropout", f"must lie in [0, 1), got {self.dropout}")
        _positive("char_embedding", self.char_embedding, allow_zero=True)
        _positive("word_hash_buckets", self.word_hash_buckets, allow_zero=True)
        if self.word_hash_buckets == 1:
            raise ConfigError("word_hash_buckets", "must be 0 (off) or at least 2")
        _positive("word_hash_dim", self.word_hash_dim)

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
        _choice("kind", self.kind, ("bpe", "wordpiece", "wordlevel", "pretrained"))
        _positive("vocab_size", self.vocab_size)
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
    """How batches draw from the task sources: 'proportional', 'temperature' or 'round_robin'."""
    temperature: float = 2.0
    """T for temperature sampling: source k is drawn with probability proportional to n_k^(1/T)."""
    group_by_length: bool = True
    """Form batches of similar length (less padding) within a window of batches."""
    repair_iob: bool = False
    """Repair invalid IOB2 tags (an I-X without B-X/I-X before it becomes B-X) instead of failing."""
    word_dropout: float = 0.0
    """Training only: probability of replacing all sub-words of a word with [UNK] (labels kept)."""

    def __post_init__(self) -> None:
        for name in ("max_length", "batch_size", "eval_batch_size", "temperature"):
            _positive(name, getattr(self, name))
        if self.max_length < 4:
            raise ConfigError("max_length", f"must be at least 4, got {self.max_length}")
        _choice("sampling", self.sampling, ("proportional", "temperature", "round_robin"))
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
    """Stop (validate, keep the best, checkpoint) once training has taken this long, validations included."""
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

    def __post_init__(self) -> None:
        for name in ("epochs", "lr", "grad_accum_steps", "log_every", "keep_checkpoints"):
            _positive(name, getattr(self, name))
        for name in ("weight_decay", "max_grad_norm", "eval_every", "patience"):
            _positive(name, getattr(self, name), allow_zero=True)
        if self.max_steps is not None:
            _positive("max_steps", self.max_steps)
        if self.max_minutes is not None:
            _positive("max_minutes", self.max_minutes)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError("warmup_ratio", f"must lie in [0, 1), got {self.warmup_ratio}")
        _choice("schedule", self.schedule, ("linear", "cosine", "constant"))
        _choice("mixed_precision", self.mixed_precision, ("no", "bf16", "fp16"))


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
    """Guard for 'ema': floor on a task's weight relative to the mean weight (e.g. 0.5)."""
    max_weight: float | None = None
    """Guard for 'ema': cap on a task's weight relative to the mean weight (e.g. 2.0)."""

    def __post_init__(self) -> None:
        _choice("method", self.method, ("ema", "equal", "static", "dwa", "uncertainty"))
        if not 0.0 <= self.beta < 1.0:
            raise ConfigError("beta", f"must lie in [0, 1), got {self.beta}")
        _positive("scale", self.scale)
        _positive("temperature", self.temperature)
        for name in ("min_weight", "max_weight"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.min_weight and self.max_weight and self.min_weight > self.max_weight:
            raise ConfigError("min_weight", f"{self.min_weight} is above max_weight {self.max_weight}")


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
        _choice("kind", self.kind, TASK_KINDS)
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError("name", f"{self.name!r} must be a non-empty identifier (letters, digits, _ or -)")
        if self.primary_metric is None:
            self.primary_metric = "f1" if self.kind == TAGGING else "accuracy"
        allowed = (
            ("f1", "f1_strict", "precision", "recall", "token_accuracy")
            if self.kind == TAGGING
            else ("accuracy", "macro_f1")
        )
        _choice("primary_metric", self.primary_metric, allowed)
        _positive("loss_weight", self.loss_weight, allow_zero=True)
        _positive("metric_weight", self.metric_weight, allow_zero=True)
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

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError("tasks", "at least one task is required")
        for key, task in self.tasks.items():
            if key != task.name:
                raise ConfigError(f"tasks.{key}.name", f"task listed as '{key}' is named '{task.name}'")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["tasks"] = [dataclasses.asdict(t) for t in self.tasks.values()]
        return out

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")


# --------------------------------------------------------------------------------------------------
# Building dataclasses from plain dicts, with type coercion and key-naming errors.


def _coerce(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null", "~"))
        if is_none and len(args) < len(typing.get_args(tp)):
            return None
        return _coerce(key, value, args[0])
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(key, f"expected a list, got {value!r}")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(key, f"expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, (bool, list, dict)):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        try:
            if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
                return int(value)
            number = float(value) if isinstance(value, (str, float)) else value
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            return int(number)  # YAML reads 1e3 as a string: accept it when it is a whole number
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(key, f"expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, (bool, list, dict)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        try:
            number = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; float() takes it
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(key, f"expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return str(value)
    return value


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a dict; errors name the full dotted key."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            dotted = [f"{prefix}.{n}" if prefix else n for n in names]
            raise ConfigError(full, f"unknown key{did_you_mean(full, dotted)}")
        kwargs[key] = _coerce(full, value, hints[key])
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{prefix}.{missing[0]}" if prefix else missing[0], "is required")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.under(prefix) if prefix else err from None


# --------------------------------------------------------------------------------------------------
# YAML files, task files and overrides.


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("", f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError("", f"{where}: invalid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", f"{path}: expected a mapping at the top level")
    return data


def load_task_file(path: str | Path) -> dict[str, Any]:
    """A task YAML as a dict, with relative data paths made absolute against the task file's folder."""
    path = Path(path)
    task = _read_yaml(path)
    return _resolve_task_paths(task, path.parent)


def load_task(path: str | Path) -> TaskConfig:
    """One task file, validated (errors name tasks.NAME.field); its data files are not opened."""
    task = load_task_file(path)
    name = task.get("name")
    if not isinstance(name, str):
        raise ConfigError("name", f"{path}: a task file needs a name")
    return build(TaskConfig, task, f"tasks.{name}")


def _resolve_task_paths(task: dict[str, Any], base: Path) -> dict[str, Any]:
    data = task.get("data")
    if isinstance(data, dict) and not data.get("hub_id"):
        for split in SPLITS:
            value = data.get(split)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                data[split] = str((base / value).resolve())
    return task


def _tasks_from_yaml(entries: Any, base: Path) -> dict[str, dict[str, Any]]:
    if isinstance(entries, dict):  # name -> path or inline mapping
        entries = [dict(v, name=k) if isinstance(v, dict) else v for k, v in entries.items()]
    if not isinstance(entries, list):
        raise ConfigError("tasks", "expected a list of task files or task mappings")
    tasks: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            task_path = base / entry if not Path(entry).is_absolute() else Path(entry)
            if not task_path.is_file():
                raise ConfigError(f"tasks[{i}]", f"task file not found: {task_path}")
            task = load_task_file(task_path)
        elif isinstance(entry, dict):
            task = _resolve_task_paths(dict(entry), base)
        else:
            raise ConfigError(f"tasks[{i}]", f"expected a task file path or mapping, got {entry!r}")
        name = task.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"tasks[{i}].name", "is required")
        if name in tasks:
            raise ConfigError(f"tasks.{name}", "is listed twice")
        tasks[name] = task
    return tasks


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.c=value' -> (['a', 'b', 'c'], parsed value); the value is read as YAML.

    YAML 1.1 reads ``1e-3`` as a string; the typed fields coerce it (``training.lr=1e-3`` is the float 0.001).
    """
    if "=" not in text:
        raise ConfigError(text, "an override must look like key=value (e.g. model.d_model=64)")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(key, "malformed key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_override(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    if parts[0] == "tasks" and len(parts) > 1:
        tasks = tree["tasks"]
        if parts[1] not in tasks:
            raise ConfigError(".".join(parts[:2]), f"no such task{did_you_mean(parts[1], tasks)}")
        if len(parts) == 2:
            raise ConfigError(".".join(parts), "name a task field, e.g. tasks.NAME.data.train=PATH")
        node, parts = tasks[parts[1]], parts[2:]
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is not a section")
        node = child
    node[parts[-1]] = value


def load_config(
    path: str | Path | None, overrides: list[str] = (), base: dict[str, Any] | None = None
) -> ExperimentConfig:
    """Read an experiment YAML (or start from ``base``), apply ``key=value`` overrides, validate."""
    tree: dict[str, Any] = copy.deepcopy(base or {})
    if path is not None:
        path = Path(path)
        tree.update(_read_yaml(path))
        tree["tasks"] = _tasks_from_yaml(tree.get("tasks", []), path.parent)
    elif isinstance(tree.get("tasks"), list):
        tree["tasks"] = _tasks_from_yaml(tree["tasks"], Path.cwd())
    tree.setdefault("tasks", {})
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(tree, parts, value)
    for task in tree["tasks"].values():  # paths given as overrides are relative to where the user is
        _resolve_task_paths(task, Path.cwd())
    tasks = {name: build(TaskConfig, task, f"tasks.{name}") for name, task in tree["tasks"].items()}
    return build(ExperimentConfig, {**tree, "tasks": tasks})


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Rebuild a saved (resolved) config: its tasks are a list of inline mappings with absolute paths."""
    tree = dict(data)
    tree["tasks"] = {t["name"]: build(TaskConfig, t, f"tasks.{t['name']}") for t in tree.get("tasks", [])}
    return build(ExperimentConfig, tree)
