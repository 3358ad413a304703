"""What the results tables of ``doc_tables.py`` are made of: a run's field or metric in a quality result file, a
peer's value, a CPU as a cell, and a table rendered as markdown."""

from __future__ import annotations

import re
from typing import Any

from doc_sources import DASH, lookup


def run(name: str, key: str, file: str = "quality.json") -> Any:
    """A field of one run of a quality result file."""
    return lookup(file, f"runs.{name}.{key}")


def metric(file: str, name: str, split: str, task: str, key: str) -> float | None:
    """A run's metric, None when the run has no such task (a single-task model)."""
    metrics = lookup(file, f"runs.{name}.metrics.{split}")
    return metrics[task][key] if task in metrics else None


def mean_test(file: str, name: str, tasks: tuple[tuple[str, str], ...]) -> float | None:
    values = [metric(file, name, "test", t, k) for t, k in tasks]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def cpu(text: str | None) -> str:
    """A CPU as a table cell: the model name without its family, cores and features."""
    if text is None:
        return DASH
    return re.sub(r"\s*\(family.*", "", text.replace("(R)", "")).split(",")[0].strip()


Table = tuple[list[str], list[list[str]]]
CONLL_SST2 = (("conll2003", "f1"), ("sst2", "accuracy"))
SEMEVAL = (("semeval14_aspect", "f1"), ("semeval14_polarity", "accuracy"))


def render(table: Table) -> str:
    header, rows = table
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def distill_runs() -> list[str]:
    """The distillation rows quality.json holds, in the order they were added."""
    return [name for name in lookup("quality.json", "runs") if name.startswith("distill_")]


def peer(path: str) -> Any:
    """A value of peers.json's ``peers.PATH``; None while that peer (PATH's first key) has no entry yet, so its cells
    show DASH (a wrong key inside an entry still fails)."""
    name = path.split(".")[0]
    return lookup("peers.json", f"peers.{path}") if name in lookup("peers.json", "peers") else None


def throughput(name: str) -> dict:
    return lookup("pretrained_throughput.json", f"entries[name={name}]")
