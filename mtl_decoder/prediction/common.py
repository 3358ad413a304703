"""What single-process prediction (``predict``) and its multi-process and sharded form (``sharded``, ``parts``) share:
the run's summary, where a bad record goes, a model's tasks and a run's inference options. In its own module
so that ``predict`` can hand a launched or sharded run to ``sharded`` without the two importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mtl_decoder.config import parse_task_names
from mtl_decoder.data.inputs import BadRecord
from mtl_decoder.errors import DataError, UserError
from mtl_decoder.files import AtomicFile
from mtl_decoder.inference import InferenceOptions
from mtl_decoder.saved import SavedModel

ON_ERROR = ("fail", "skip")


@dataclass
class PredictSummary:
    """What a ``predict_file`` run did: every non-empty record read is either predicted or skipped."""

    input: str
    output: str
    errors: str | None
    """The skipped-records file (skip mode), else None."""
    read: int = 0
    predicted: int = 0
    skipped: int = 0
    truncated: int = 0
    """Records longer than the model's maximum length whose classification saw only the first window."""
    windowed: int = 0
    """Records tagged in more than one window (too long for one pass)."""
    untagged_words: int = 0
    """Words longer than the maximum length on their own: in no window whole, so left 'O' unread."""
    empty_lines: int = 0
    tokens: int = 0
    """Words predicted on: the input tokens, or the pre-tokenizer's words of a raw text."""
    seconds: float = 0.0
    precision: str = "fp32"
    """The model's inference precision (see mtl_decoder.inference.PRECISIONS)."""
    states: dict[str, int] | None = None
    """A frozen trunk's state cache: texts 'computed' by the trunk, found 'cached' (computed before this run),
    and 'repeated' inside the input (computed earlier in this run); None for other models."""
    removed: list[str] = field(default_factory=list)
    """Files removed on the way: temporaries of a killed run, an earlier run's errors file (fail mode, force)."""

    @property
    def all_failed(self) -> bool:
        """Records were read and none could be predicted (skip mode: every one went to the errors file)."""
        return self.read > 0 and self.predicted == 0

    @property
    def records_per_s(self) -> float:
        return self.predicted / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "records_per_s": self.records_per_s, "tokens_per_s": self.tokens_per_s}

    def report(self) -> str:
        lines = [
            f"read {self.read:,} records: predicted {self.predicted:,}, skipped {self.skipped:,}, "
            f"truncated {self.truncated:,}, tagged in windows {self.windowed:,}; "
            f"empty lines skipped {self.empty_lines:,}",
            f"{self.seconds:.1f} s ({self.precision}): {self.records_per_s:,.1f} records/s, "
            f"{self.tokens_per_s:,.0f} words/s",
            f"predictions -> {self.output}",
        ]
        if self.states is not None:
            s = self.states
            lines.insert(
                1,
                f"trunk states: {s['computed']:,} texts computed, {s['cached']:,} from the state cache, "
                f"{s['repeated']:,} repeats inside the input (the windows of a long text count apiece)",
            )
        if self.errors is not None:
            lines.append(f"skipped records ({self.skipped:,}) -> {self.errors}")
        if self.removed:
            lines.append(f"removed: {', '.join(self.removed)}")
        if self.read == 0:
            lines.append(f"warning: {self.input} holds no records")
        if self.truncated:
            lines.append(
                f"warning: {self.truncated:,} records were longer than the model's maximum length; their "
                'classification read only the beginning (marked "truncated": true)'
            )
        if self.untagged_words:
            lines.append(
                f"warning: {self.untagged_words:,} words were longer than the model's maximum length on their own: "
                'they are tagged "O" without being read (counted per record as "untagged")'
            )
        return "\n".join(lines)


def set_aside(record: BadRecord, path: str, bad: AtomicFile | None) -> None:
    """Fail mode (no errors file): raise the record's DataError; skip mode: write it to the errors file."""
    if bad is None:
        raise DataError(path, record.line, record.reason, record.field)
    entry: dict[str, Any] = {"line": record.line, "reason": record.reason}
    if record.field is not None:
        entry["reason"] = f"field '{record.field}': {record.reason}"
        entry["field"] = record.field
    entry["raw"] = record.raw
    bad.write_json(entry)


def resolve_tasks(saved: SavedModel, tasks: str | Sequence[str] | None) -> list[str]:
    """The tasks to predict: all of the model's, or the given names (a list or a comma-separated string)."""
    known = saved.model.task_names
    return parse_task_names(tasks, known) or list(known)


def resolve_options(options: InferenceOptions | None, given: dict[str, Any]) -> InferenceOptions:
    """A run's InferenceOptions.

    ``options`` when given (every keyword setting then left at its default), else those
    the keyword settings ``given`` make."""
    if options is None:
        return InferenceOptions(**given)
    defaults = InferenceOptions()
    changed = [key for key, value in given.items() if value != getattr(defaults, key)]
    if changed:
        raise UserError(f"give the inference settings as options or as keywords, not both ({', '.join(changed)})")
    return options
