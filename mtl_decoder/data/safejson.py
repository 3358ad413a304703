"""Bounded JSON parsing for untrusted files.

JSON from untrusted files, bounded: nesting depth is checked before Python's recursive parser sees the text, and
a record that is not one JSON object says what it is instead."""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 64
"""Deepest JSON nesting accepted in a record (Python's parser recurses once per level)."""


def json_depth_exceeds(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON ``text`` nests deeper than ``limit`` (brackets inside strings do not count)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def parse_json_object(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(object, None) or (None, why ``text`` is not one JSON object)."""
    if json_depth_exceeds(text):
        return None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"malformed JSON ({err.msg} at column {err.colno})"
    except RecursionError:
        return None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    if not isinstance(data, dict):
        return None, f"expected a JSON object, got {json_kind(data)}"
    return data, None


def json_kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def json_list_cell(value: Any) -> Any:
    """A CSV/TSV cell holding a JSON list (tokens, tags) as that list; anything else unchanged."""
    if not isinstance(value, str):
        return value
    stripped = value.strip()
    if stripped.startswith("[") and stripped.endswith("]") and not json_depth_exceeds(stripped):
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, list) else value
    return value
