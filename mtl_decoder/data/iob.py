"""IOB2 tag sequences: validity, repair and entity spans."""

from __future__ import annotations


def is_tag(tag: str) -> bool:
    """Whether ``tag`` is O, B-X or I-X (X non-empty, with no white space at either end)."""
    kind = tag[2:]
    return tag == "O" or (tag.startswith(("B-", "I-")) and bool(kind) and kind == kind.strip())


def first_invalid(tags: list[str]) -> int | None:
    """Index of the first tag that breaks IOB2 (I-X not after B-X/I-X, or not O/B-/I-), else None."""
    prev = "O"
    for i, tag in enumerate(tags):
        if not is_tag(tag):
            return i
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            return i
        prev = tag
    return None


def repair(tags: list[str]) -> tuple[list[str], int]:
    """Turn every I-X that does not continue an X entity into B-X (IOB1 -> IOB2); returns (tags, changes)."""
    out, changes, prev = [], 0, "O"
    for tag in tags:
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            tag = "B-" + tag[2:]
            changes += 1
        out.append(tag)
        prev = tag
    return out, changes


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """Entity spans (type, start, end exclusive) of an IOB2 sequence; a stray I-X starts an entity (as conlleval)."""
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        continues = tag.startswith("I-") and tag[2:] == kind
        if kind is not None and not continues:
            spans.append((kind, start, i))
            kind = None
        if tag.startswith("B-") or (tag.startswith("I-") and not continues):
            kind, start = tag[2:], i
    return spans


def sort_tag_labels(tags: set[str]) -> list[str]:
    """O first, then B-X and I-X of each type in type order: a stable, readable label order."""
    types = sorted({t[2:] for t in tags if t != "O"})
    ordered = ["O"] if "O" in tags else []
    for kind in types:
        ordered += [t for t in (f"B-{kind}", f"I-{kind}") if t in tags]
    return ordered + sorted(tags - set(ordered))
