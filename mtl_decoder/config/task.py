"""One task's section (a task file, or an entry of ``tasks``): its kind, data splits, columns, labels and weights."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtl_decoder.config.checks import check_choice, check_positive
from mtl_decoder.config.kinds import DEFAULT_PRIMARY_METRIC, METRICS, TASK_KINDS
from mtl_decoder.errors import ConfigError


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
    sampling_weight: float = 1.0
    """How much batches draw on this task's training file relative to the others: it multiplies the file's weight
    under every ``data.sampling`` strategy (round_robin: a file of weight 2 fills twice the slots of one of weight
    1). Tasks that read the same file give it one weight."""

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, TASK_KINDS)
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError("name", f"{self.name!r} must be a non-empty identifier (letters, digits, _ or -)")
        if self.primary_metric is None:
            self.primary_metric = DEFAULT_PRIMARY_METRIC[self.kind]
        check_choice("primary_metric", self.primary_metric, METRICS[self.kind])
        check_positive("loss_weight", self.loss_weight, allow_zero=True)
        check_positive("metric_weight", self.metric_weight, allow_zero=True)
        check_positive("sampling_weight", self.sampling_weight)
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ConfigError("labels", "contains duplicates")
