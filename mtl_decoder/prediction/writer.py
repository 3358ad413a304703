"""The files of a ``predict`` run over several processes or shards, written by the main process alone (sharded.py):
OUT and OUT.errors.jsonl of one job, or one shard's part file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtl_decoder.data.inputs import BadRecord
from mtl_decoder.files import AtomicFile, remove
from mtl_decoder.prediction.common import PredictSummary, set_aside
from mtl_decoder.prediction.outputs import is_errors_file
from mtl_decoder.prediction.parts import PartWriter
from mtl_decoder.termination import shielded


class RunWriter:
    """The main process's files: OUT and OUT.errors.jsonl (one job), or one part file (a shard)."""

    def __init__(self, output: Path, errors: Path, skip: bool, part: bool):
        self.part = PartWriter(output) if part else None
        self.out = None if part else AtomicFile(output)
        try:
            self.bad = AtomicFile(errors) if skip and not part else None
        except BaseException:  # the errors file cannot be written: the output's temporary goes too
            self.bad = None
            self.discard()
            raise
        self.errors, self.skip = errors, skip

    def record(self, index: int, line: int, text: str) -> None:
        if self.part is not None:
            self.part.record(index, line, text)
        else:
            self.out.write_line(text)

    def error(self, index: int, record: BadRecord, path: str) -> None:
        """The errors-file entry of ``predict`` (its own rule: ``_set_aside``), to the errors file or the part."""
        target = self.bad if self.part is None else PartErrors(self.part, index)
        set_aside(record, path, target)

    def commit(self, footer: dict[str, Any], summary: PredictSummary) -> None:
        if self.part is not None:
            self.part.commit(footer)
            return
        if self.bad is not None:
            self.bad.commit()
        self.out.commit()
        if not self.skip and is_errors_file(self.errors):  # an earlier skip run's (force): it described another output
            remove(self.errors)
            summary.removed.append(str(self.errors))

    def discard(self) -> None:
        with shielded():  # a SIGTERM mid-way must not leave the errors file's temporary behind the output's
            for f in (self.part, self.out, self.bad):
                if f is not None:
                    f.discard()


@dataclass
class PartErrors:
    """``write_json`` of an errors-file entry into a part, with the record's input index."""

    part: PartWriter
    index: int

    def write_json(self, entry: dict[str, Any]) -> None:
        self.part.error(self.index, entry)
