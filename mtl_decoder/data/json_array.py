"""The .json format: the objects of one top-level JSON array, each with the line it starts on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from mtl_decoder.data.records import BadRecord, Record
from mtl_decoder.data.safejson import MAX_JSON_DEPTH, json_depth_exceeds, json_kind
from mtl_decoder.errors import DataError


def read_json_array(path: str) -> Iterator[Record | BadRecord]:
    """The records of a .json file's top-level array.

    The records of a .json file: the objects of its top-level array, each with the line it starts on;
    an element that is not an object is a ``BadRecord``, a broken array a ``DataError``."""
    # A JSON array cannot be streamed with the standard library: decode element by element to keep lines.
    # A broken array cannot be resynchronised, so its errors concern the file from that point on.
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(path, None, f"not valid UTF-8 ({err.reason} at byte {err.start + 1})") from None
    if json_depth_exceeds(text, MAX_JSON_DEPTH + 1):
        raise DataError(path, None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    decoder = json.JSONDecoder()
    pos = _skip_space(text, 0)
    if pos >= len(text) or text[pos] != "[":
        raise DataError(path, text.count("\n", 0, pos) + 1, "expected a JSON array of objects")
    lineno, counted = 1, 0  # line of text[counted], advanced incrementally (no rescans from the start)

    def line_at(p: int) -> int:
        nonlocal lineno, counted
        lineno += text.count("\n", counted, p)
        counted = p
        return lineno

    pos = _skip_space(text, pos + 1)
    first = True
    while pos < len(text) and text[pos] != "]":
        if not first:
            if text[pos] != ",":
                raise DataError(path, line_at(pos), "malformed JSON (expected ',' or ']' after an object)")
            pos = _skip_space(text, pos + 1)
        first = False
        line = line_at(pos)
        try:
            data, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise DataError(path, err.lineno, f"malformed JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(data, dict):
            yield BadRecord(line, f"expected a JSON object, got {json_kind(data)}", text[pos:end])
        else:
            yield Record(line, data)
        pos = _skip_space(text, end)
    if pos >= len(text):
        raise DataError(path, text.count("\n") + 1, "malformed JSON (unterminated array)")
    if _skip_space(text, pos + 1) < len(text):
        raise DataError(path, line_at(pos), "malformed JSON (text after the closing ']')")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
