"""Output files that appear whole or not at all: written under a temporary name in the same folder (same file
system, so the rename is atomic) and renamed into place only when the run succeeds."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mtl_decoder.errors import UserError


def errors_path(output: str | Path) -> Path:
    """Where skipped records go: OUT.errors.jsonl for OUT.jsonl."""
    output = Path(output)
    return output.with_name((output.stem if output.suffix else output.name) + ".errors.jsonl")


def check_targets(input_path: str | Path, targets: list[Path], force: bool) -> None:
    """Refuse to overwrite an existing file without ``force``, and to write over the input."""
    source = Path(input_path).resolve()
    for target in targets:
        if target.resolve() == source:
            raise UserError(f"{target}: the output would overwrite the input")
        if target.is_dir():
            raise UserError(f"{target}: is a directory")
        if target.exists() and not force:
            raise UserError(f"{target}: already exists (use --force to overwrite)")


class AtomicJsonl:
    """A JSON-lines file written to a temporary file beside ``path``; ``commit`` renames it into place,
    ``discard`` removes it. Used as a context manager, an exception discards it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        self.tmp = Path(tmp)
        self.file = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        self.lines = 0

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.lines += 1

    def commit(self) -> Path:
        self.file.close()
        os.chmod(self.tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicJsonl:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.file.closed:  # not committed: an error, or the caller never got to commit
            self.discard()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
