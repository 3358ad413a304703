"""Part files of a sharded prediction and their merge.

Part files of a sharded prediction (``predict --shard K/N``) and putting them back together
(``merge-predictions``).

A part is JSON lines: one line per record of the shard, ``{"index": I, "line": L, "record": {...}}`` (the output
record, as ``predict`` writes it) or, in skip mode, ``{"index": I, "line": L, "error": {...}}`` (the errors-file
entry), where I counts every record of the input from 0 and L is the line it starts on (records in input order,
errors in input order, each error written when it is read); and last a footer ``{"part": {...}}`` (shard,
shards, block, input, counts, and the fingerprints of the model and of the input read: ``model_fingerprint`` and
``InputDigest``). A part is written whole and renamed into place, so a part that exists is
complete; its footer says so too.

``merge_predictions`` reads the parts side by side (constant memory), checks that they are the N shards of one
job (each once, the same model, input content, block, mode and tasks) and that their records are exactly the
input's, each once, and writes OUT (and OUT.errors.jsonl in skip mode) as one process would have.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from mtl_decoder.data.inputs import BadRecord, InputRecord
from mtl_decoder.data.tokenization import TOKENIZER_FILE
from mtl_decoder.errors import UserError
from mtl_decoder.files import STDOUT, STREAM, AtomicFile, check_writable_parent, output_kind
from mtl_decoder.hashing import files_fingerprint, sha256_file
from mtl_decoder.paths import check_outside_model
from mtl_decoder.prediction.common import PredictSummary
from mtl_decoder.prediction.outputs import errors_path
from mtl_decoder.saved import CONFIG_FILE, LABELS_FILE, TRUNK_DIR, TRUNK_FILE, WEIGHTS_FILE, SavedModel
from mtl_decoder.termination import terminate_unwinds

FOOTER = "part"
COUNTS = ("read", "predicted", "skipped", "truncated", "windowed", "tokens", "untagged_words")
"""The footer's per-part counts, summed by the merge (they are PredictSummary fields)."""
SAME = (
    "shards", "block", "input", "records", "empty_lines", "on_error", "tasks", "precision", "model", "input_sha256",
    "gate_table",
)  # fmt: skip
"""Footer fields every part of one job shares."""
MODEL_FILES = (WEIGHTS_FILE, CONFIG_FILE, LABELS_FILE, TOKENIZER_FILE, TRUNK_FILE, f"{TRUNK_DIR}/config.json")
"""The files of a model folder that decide its predictions (those present), hashed into its fingerprint."""


def model_fingerprint(saved: SavedModel) -> str:
    """A digest of a model folder's model files.

    A digest of the names and contents of a model folder's ``MODEL_FILES``: parts predicted by another model (or
    the same folder retrained) differ."""
    return files_fingerprint(saved.directory, MODEL_FILES)


def file_fingerprint(path: str | Path | None) -> str | None:
    """SHA-256 of a file given as an option (a gate table), or None when none is given."""
    return None if path is None else sha256_file(path)


class InputDigest:
    """A fingerprint of the input as it was read.

    Every record's line and content (a bad record's raw text), in
    order. Every shard reads the whole input, so the shards of one input agree, whatever its name or path."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def add(self, record: InputRecord | BadRecord) -> None:
        if isinstance(record, BadRecord):
            text = f"{record.line}\0bad\0{record.raw}"
        else:
            text = f"{record.line}\0{json.dumps(record.fields, sort_keys=True, ensure_ascii=False, default=str)}"
        self.digest.update(text.encode("utf-8", "surrogatepass") + b"\n")

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


FOOTER_BYTES = 1 << 16


class PartWriter:
    """Writes a part: records and errors as they come (in input order), then the footer on ``commit``."""

    def __init__(self, path: Path):
        self.file = AtomicFile(path)

    def record(self, index: int, line: int, text: str) -> None:
        """``text``: the output record's JSON line, as predict writes it."""
        self.file.write_line(f'{{"index": {index}, "line": {line}, "record": {text}}}')

    def error(self, index: int, entry: dict[str, Any]) -> None:
        self.file.write_json({"index": index, "line": entry["line"], "error": entry})

    def commit(self, footer: dict[str, Any]) -> None:
        self.file.write_json({FOOTER: footer})
        self.file.commit()

    def discard(self) -> None:
        self.file.discard()


def check_part_target(input_path: str | Path, output: Path, force: bool, model: Any = None) -> None:
    """Check a part's path.

    A part's path: writable, not the input, not inside the model's folder (``model``: its path or a SavedModel),
    not a folder, not (without ``force``) an existing file; standard output, a device or a FIFO is written through."""
    if str(output) == STDOUT:
        return
    check_writable_parent(output, "--output")
    if output_kind(output) == STREAM:
        return
    if output.resolve() == Path(input_path).resolve():
        raise UserError(f"{output}: the output would overwrite the input; choose another --output")
    check_outside_model(output, getattr(model, "directory", model))
    if output.is_dir():
        raise UserError(f"{output}: is a folder; choose another --output")
    if output.exists() and not force:
        raise UserError(f"{output}: already exists (use --force to overwrite)")


def read_footer(path: Path) -> dict[str, Any]:
    """A part's footer (its last line), checked to be one."""
    if not path.is_file():
        raise UserError(f"{path}: no such part file" + (" (it is a folder)" if path.is_dir() else ""))
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - FOOTER_BYTES))
        tail = f.read().decode("utf-8", "replace").rstrip("\n").rsplit("\n", 1)[-1]
    try:
        footer = json.loads(tail).get(FOOTER)
    except (json.JSONDecodeError, AttributeError):
        footer = None
    if not isinstance(footer, dict) or any(k not in footer for k in ("shard", *SAME, *COUNTS)):
        raise UserError(f"{path}: not a complete part written by predict --shard (no footer on its last line)")
    return footer


def check_parts(parts: Sequence[Path]) -> list[dict[str, Any]]:
    """The footers of ``parts``, checked to be the N shards of one job, each once (in the order given)."""
    if not parts:
        raise UserError("merge-predictions: no parts given")
    footers = [read_footer(p) for p in parts]
    first = footers[0]
    for path, footer in zip(parts, footers, strict=True):
        for key in SAME:
            if footer[key] != first[key]:
                raise UserError(f"{path}: {_differs(key, footer[key], first[key], parts[0])}: not parts of one job")
    seen: dict[int, Path] = {}
    for path, footer in zip(parts, footers, strict=True):
        if footer["shard"] in seen:
            raise UserError(f"{path}: shard {footer['shard']}/{first['shards']} again (also {seen[footer['shard']]})")
        seen[footer["shard"]] = path
    n = first["shards"]
    missing = [k for k in range(n) if k not in seen]
    if missing:
        given = ", ".join(f"{k}/{n}" for k in sorted(seen))
        raise UserError(f"merge-predictions: shard {missing[0]}/{n} is missing ({len(missing)} of {n}; given: {given})")
    return footers


def _differs(key: str, value: Any, first: Any, first_path: Path) -> str:
    if key == "model":
        return f"predicted by another model (fingerprint {value[:12]}, {first_path}: {first[:12]})"
    if key == "input_sha256":
        return f"read another input (content fingerprint {value[:12]}, {first_path}: {first[:12]})"
    return f"{key} is {value!r}, but {first_path} has {first!r}"


def _entries(path: Path, kind: str, k: int) -> Iterator[tuple[int, int, int, str, Any]]:
    """The entries of a part's lines of one kind.

    (index, part number, file line, kind, value) of a part's lines of one ``kind`` ('record' or 'error'), in
    order. The two kinds are read apart: a part writes a bad record when it is read, before the records of the
    blocks around it are predicted, so each kind is in input order but not the two together."""
    previous = -1
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            entry = _parse(path, number, text)
            if entry is None:  # the footer
                return
            if kind not in entry:
                continue
            index = entry["index"]
            if index <= previous:
                raise UserError(f"{path}:{number}: record index {index} after {previous}: the part is out of order")
            previous = index
            yield index, k, number, kind, entry[kind]


def _parse(path: Path, number: int, text: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{number}: not valid JSON ({err.msg})") from None
    if isinstance(entry, dict) and FOOTER in entry:
        return None
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("index"), int)
        and isinstance(entry.get("line"), int)
        and (isinstance(entry.get("record"), dict) or isinstance(entry.get("error"), dict))
    )
    if not ok:
        raise UserError(f"{path}:{number}: not a line of a prediction part (expected index, line and record or error)")
    return entry


def merge_predictions(output: str | Path, parts: Sequence[str | Path], force: bool = False) -> PredictSummary:
    """Merge the parts of ``predict --shard K/N`` into one output.

    Put the parts of ``predict --shard K/N`` (all N, any order) back into one output in input order, checking
    that every record of the input is there exactly once; OUT.errors.jsonl too when the parts ran with
    ``--on-error skip``. Returns the PredictSummary of the whole job (prediction seconds summed over the parts)."""
    output, parts = Path(output), [Path(p) for p in parts]
    footers = check_parts(parts)
    first = footers[0]
    skip = first["on_error"] == "skip"
    errors = errors_path(output)
    _check_output(output, errors if skip else None, parts, force)
    summary = PredictSummary(first["input"], str(output), str(errors) if skip else None, precision=first["precision"])
    summary.empty_lines = first["empty_lines"]
    for key in COUNTS:
        setattr(summary, key, sum(f[key] for f in footers))
    summary.seconds = sum(float(f.get("seconds", 0.0)) for f in footers)
    with (
        terminate_unwinds() as unwinder,
        AtomicFile(output) as out,
        AtomicFile(errors) if skip else nullcontext() as bad,
    ):
        _write_merged(parts, first["records"], out, bad)
        with unwinder.deferred():  # the files go into place together
            if bad is not None:
                bad.commit()
            out.commit()
    return summary


def _write_merged(parts: list[Path], records: int, out: AtomicFile, bad: AtomicFile | None) -> None:
    streams = [_entries(p, kind, k) for k, p in enumerate(parts) for kind in ("record", "error")]
    expected, last_part = 0, None
    for index, k, number, kind, value in heapq.merge(*streams):
        if index < expected:
            raise UserError(f"{parts[k]}:{number}: record index {index} is repeated (also in {parts[last_part]})")
        if index > expected:
            raise UserError(f"merge-predictions: record index {expected} is in no part (next: {index}, in {parts[k]})")
        if index >= records:
            raise UserError(f"{parts[k]}:{number}: record index {index}, but the input has {records} records")
        if kind == "record":
            out.write_line(json.dumps(value, ensure_ascii=False))
        elif bad is None:
            raise UserError(f"{parts[k]}:{number}: an error entry in a part of a fail-mode run")
        else:
            bad.write_json(value)
        expected, last_part = index + 1, k
    if expected != records:
        raise UserError(f"merge-predictions: the input has {records} records, the parts hold {expected}")


def _check_output(output: Path, errors: Path | None, parts: list[Path], force: bool) -> None:
    check_writable_parent(output, "OUT")
    for target in (output, errors):
        if target is None:
            continue
        if any(target.resolve() == p.resolve() for p in parts):
            raise UserError(f"{target}: is one of the parts; choose another OUT")
        if target.is_dir():
            raise UserError(f"{target}: is a folder; choose another OUT")
        if target.exists() and not force:
            raise UserError(f"{target}: already exists (use --force to overwrite)")
