"""A Prediction as the JSON written per record: pure functions, no model.

Per tagging task: ``tags`` (one per word), ``entities`` (type, start, end, text) and ``windows``; for raw
text also ``words`` and ``offsets`` (each word's [start, end) character offsets), and entity offsets are
characters, so ``text[start:end] == entity["text"]`` always; for token input entity offsets are token
indices (end exclusive) and the entity text is its tokens joined by spaces; ``untagged`` only where some word
was longer than the model's maximum length on its own (the count of such words: they reached the model in no
window, and their tag 'O' is not a prediction). Per classification task:
``label``, ``probs`` (label -> probability) and ``truncated`` (the input was cut to the model's length).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mtl_decoder.config import TAGGING
from mtl_decoder.data.iob import entities
from mtl_decoder.errors import UserError
from mtl_decoder.files import FILE, STDOUT, STREAM, check_writable_parent, output_kind
from mtl_decoder.inference import Prediction
from mtl_decoder.paths import check_outside_model


def errors_path(output: str | Path) -> Path:
    """Where skipped records go: OUT.errors.jsonl for OUT.jsonl."""
    output = Path(output)
    return output.with_name((output.stem if output.suffix else output.name) + ".errors.jsonl")


ERROR_FIELDS = {"line", "reason", "field", "raw"}
"""The fields of an errors-file entry (``common.set_aside``): how a file this tool wrote is told from another."""


def is_errors_file(path: Path) -> bool:
    """Whether a path is an errors file as ``predict`` writes them.

    Whether ``path`` is a regular file whose every line is an errors-file entry as ``predict`` writes them (an
    empty one too: a skip run without bad records). Only such a file is ever removed for being stale."""
    if output_kind(path) != FILE:
        return False
    try:
        with open(path, encoding="utf-8") as f:
            return all(_is_error_entry(line) for line in f)
    except (OSError, UnicodeDecodeError):
        return False


def _is_error_entry(line: str) -> bool:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(entry, dict)
        and set(entry) <= ERROR_FIELDS
        and isinstance(entry.get("line"), int)
        and isinstance(entry.get("reason"), str)
    )


def check_targets(
    input_path: str | Path, output: Path, errors: Path, skip: bool, force: bool, model: Any = None
) -> None:
    """Check the output and its errors file before any work.

    Before any work: ``check_output`` for the output and its errors file. A device or FIFO output has no
    folder for skip mode's errors file. The errors file of an earlier skip run counts in fail mode too:
    ``predict`` removes it once the new output is written, so that it never describes another output; a file of that
    name that this tool did not write (``is_errors_file``) is no concern of a fail-mode run and is left alone."""
    if check_output(input_path, output, force, model) == STREAM and skip:
        raise UserError(
            f"{output}: a device or pipe; --on-error skip writes {errors.name} beside the output, which needs a "
            "folder: give a file as --output, or use --on-error fail"
        )
    if not skip and not is_errors_file(errors):
        return  # fail mode writes no errors file and touches none it did not write
    if not skip and not force:
        raise UserError(
            f"{errors}: already exists, from an earlier --on-error skip run; use --force to remove it with the new "
            "output, or move it away"
        )
    check_output(input_path, errors, force, model)


def check_output(input_path: str | Path, target: Path, force: bool, model: Any = None) -> str:
    """Check one output path before any work.

    Before any work, one output path: its folder can be written; it is not the input, not inside the model's
    folder (``model``: its path or a SavedModel), not a folder, a link or a socket, and (without ``force``) not an
    existing file. Returns its ``files.output_kind``: a device or FIFO is written straight through, and so is
    standard output (``files.STDOUT``), whatever it leads to."""
    if str(target) == STDOUT:
        return STREAM
    check_writable_parent(target, "--output")
    kind = output_kind(target)
    if kind == STREAM:
        return kind
    if str(input_path) != "-" and target.resolve() == Path(input_path).resolve():
        raise UserError(f"{target}: the output would overwrite the input; choose another --output")
    check_outside_model(target, getattr(model, "directory", model))
    if kind == FILE and not force:
        raise UserError(f"{target}: already exists (use --force to overwrite)")
    return kind


def word_spans(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each word's span, widened over adjacent uncovered characters.

    Each word's span, widened over the characters right after it that no word covers and that are not
    spaces. The tokenizer's normalizer can merge characters (NFC: 'e' + U+0301 -> 'é'; Hangul jamo) and then
    reports the merged character's end as that of its first part, cutting the word short."""
    out: list[tuple[int, int]] = []
    for i, (start, end) in enumerate(spans):
        limit = spans[i + 1][0] if i + 1 < len(spans) else len(text)
        while end < limit and not text[end].isspace():
            end += 1
        out.append((start, end))
    return out


def entity_dicts(
    tags: list[str], words: list[str], spans: list[tuple[int, int]] | None, text: str | None
) -> list[dict[str, Any]]:
    """The entities of an IOB2 tag sequence.

    Character offsets into ``text`` when ``spans`` are given (raw
    text), else token indices with the tokens joined by spaces."""
    found = []
    for kind, first, last in entities(tags):
        if spans is None or text is None:
            found.append({"type": kind, "start": first, "end": last, "text": " ".join(words[first:last])})
        else:
            start, end = spans[first][0], spans[last - 1][1]
            found.append({"type": kind, "start": start, "end": end, "text": text[start:end]})
    return found


def prediction_dict(pred: Prediction, item: str | list[str], tasks: list[str], kinds: dict[str, str]) -> dict:
    """Task name -> its prediction, for one input (a raw text or a token list)."""
    text = item if isinstance(item, str) else None
    spans = word_spans(text, pred.spans) if text is not None and pred.spans is not None else None
    words = [text[s:e] for s, e in spans] if text is not None and spans is not None else pred.words
    out: dict[str, Any] = {}
    for task in tasks:
        if kinds[task] == TAGGING:
            out[task] = _tagging(pred, task, words, spans, text)
        else:
            out[task] = {"label": pred.labels[task], "probs": pred.probs[task], "truncated": pred.truncated}
    return out


def _tagging(
    pred: Prediction, task: str, words: list[str], spans: list[tuple[int, int]] | None, text: str | None
) -> dict[str, Any]:
    tags = pred.tags.get(task, ["O"] * len(words))
    entry: dict[str, Any] = {}
    if spans is not None:
        entry["words"] = words
        entry["offsets"] = [[s, e] for s, e in spans]
    entry["tags"] = tags
    entry["entities"] = entity_dicts(tags, words, spans, text)
    entry["windows"] = pred.windows
    if pred.untagged:
        entry["untagged"] = pred.untagged
    return entry
