"""The terminal view of a ``debug-data`` report.

A table per task, overlap with train, shared files, then the
findings ranked by harm and a one-line verdict. Rendered from the report's JSON content alone."""

from __future__ import annotations

from typing import Any

from mtl_decoder.config import TAGGING
from mtl_decoder.diagnostics.data import GLOBAL_PREFIX, DataReport
from mtl_decoder.diagnostics.findings import finding_lines

COLUMNS = ("split", "examples", "bad", "bad-IOB", "unseen", "words p50/p95/max", "sub-words p50/p95/max", "cut")
COLUMNS = (*COLUMNS, "repeats")


def data_report_lines(report: DataReport) -> list[str]:
    """Every section of the report, as lines for the terminal."""
    data = report.to_json()
    lines: list[str] = []
    for name in report.tasks:
        lines += task_lines(name, data[name])
        lines.append("")
    lines += shared_lines(report.shared)
    lines.append("")
    lines.append("findings, most harmful first:")
    lines += ["  " + line for line in finding_lines(report.findings)] or ["  none"]
    lines.append("")
    lines.append(verdict(data[f"{GLOBAL_PREFIX}summary"]))
    return lines


def verdict(summary: dict[str, Any]) -> str:
    counts = f"{summary['errors']} error(s), {summary['warnings']} warning(s), {summary['notes']} note(s)"
    return f"{counts}: " + ("ok" if summary["ok"] else "fix the errors before training (exit status 1)")


def task_lines(name: str, task: dict[str, Any]) -> list[str]:
    labels = task["labels"]
    head = f"{name} ({task['kind']}, {len(labels)} labels)" if labels else f"{name} ({task['kind']})"
    rows = [list(COLUMNS)]
    for split, s in task["splits"].items():
        if s["unreadable"]:
            rows.append([split, "unreadable", "", "", "", "", "", "", ""])
            continue
        rows.append(
            [
                split,
                str(s["examples"]),
                str(s["bad_records"]),
                str(s["invalid_iob"]),
                str(sum(s["unseen_labels"].values())),
                _lengths(s.get("words")),
                _lengths(s.get("subwords")),
                str(s.get("truncated", "-")),
                f"{s['repeats']['duplicates']} ({s['repeats']['share']:.1%})",
            ]
        )
    lines = [head, *("  " + line for line in _aligned(rows))]
    for split, s in task["splits"].items():
        if s["unreadable"]:
            continue
        lines.append(f"  {split} labels: {_distribution(s, task['kind'])}")
    for split, o in task["overlap"].items():
        line = (
            f"  {split} vs train: exact {o['exact']} ({o['exact_share']:.1%}), of which other labels "
            f"{o['exact_other_labels']}; normalised +{o['normalised_only']} ({o['normalised_share']:.1%})"
        )
        unseen = task.get("unseen_entities", {}).get(split)
        if unseen and unseen["mentions"]:
            line += f"; entity strings unseen in train {unseen['unseen_share']:.0%} of {unseen['mentions']}"
        lines.append(line)
    return lines


def shared_lines(shared: list[dict[str, Any]]) -> list[str]:
    if not shared:
        return ["shared files: none"]
    lines = ["shared files:"]
    for group in shared:
        leak = "  <- train and held-out" if group["leak"] else ""
        lines.append(f"  {group['file']}: {', '.join(group['read_by'])}{leak}")
    return lines


def _lengths(p: dict[str, float] | None) -> str:
    return f"{p['p50']:.0f}/{p['p95']:.0f}/{p['max']:.0f}" if p else "-"


def _distribution(stats: dict[str, Any], kind: str) -> str:
    counts = stats["entities"] if kind == TAGGING else stats["label_counts"]
    total = sum(counts.values())
    if not total:
        return "none"
    text = ", ".join(f"{k} {v} ({v / total:.0%})" for k, v in counts.items())
    if kind == TAGGING:
        text = f"{total} entities: {text}; {stats['without_entities']} sentences without one"
    return text


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        out.append("  ".join(cells).rstrip())
    return out
