"""Shared helpers of the prediction tests: sentences and writers for every input format.

Imported by name (``from predict_testkit import ...``): pytest puts this folder on sys.path (rootdir layout,
no ``__init__.py``); the name is unique in the tree.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

# Tokens without inner punctuation, so a raw text (tokens joined by spaces) splits into the same words.
SENTENCES = [
    ["Peter", "Blackburn", "lives", "in", "London"],
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb"],
    ["the", "movie", "is", "a", "charming", "and", "often", "affecting", "journey"],
    ["Japan", "began", "the", "defence", "of", "their", "Asian", "Cup", "title"],
    ["a", "gob", "of", "drivel"],
]


def texts() -> list[str]:
    return [" ".join(s) for s in SENTENCES]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_delimited(path: Path, rows: list[dict], delimiter: str) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_conll(path: Path, sentences: list[list[str]], docstart: bool = True) -> Path:
    lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for sentence in sentences:
        lines += [f"{token} NNP O" for token in sentence] + [""]
    return write_lines(path, lines)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def same_predictions(a: dict, b: dict, tasks: dict[str, str]) -> bool:
    """Equal tags and labels, probabilities within float noise (batches pad differently)."""
    for task, kind in tasks.items():
        if kind == "token_tagging":
            if a[task]["tags"] != b[task]["tags"]:
                return False
        elif a[task]["label"] != b[task]["label"] or any(
            abs(a[task]["probs"][k] - b[task]["probs"][k]) > 1e-4 for k in a[task]["probs"]
        ):
            return False
    return True
