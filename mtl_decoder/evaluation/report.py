"""Readable views of an evaluation's metrics dict: the markdown report and the CLI's per-task table.

Both are rendered from the metrics.json content alone (never from the model), so a report can be rebuilt
from a saved metrics.json and always shows the same numbers.
"""

from __future__ import annotations

from typing import Any

from mtl_decoder.config import CLASSIFICATION_METRICS, TAGGING_METRICS

TABLE_COLUMNS = (*TAGGING_METRICS, *CLASSIFICATION_METRICS)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _rows(metrics: dict[str, Any], mark: str = "*") -> list[list[str]]:
    """The table's rows, one per task.

    One row per task: name, examples, then every table column ('-' where the task's kind lacks it); the
    task's primary metric is marked with '*'."""
    rows = []
    for name, m in metrics["tasks"].items():
        primary = metrics["summary"]["primary"][name]["metric"]
        cells = [name, str(metrics["data"][name]["examples"])]
        for col in TABLE_COLUMNS:
            cells.append(_fmt(m.get(col)) + (mark if col == primary else ""))
        rows.append(cells)
    return rows


def task_table(metrics: dict[str, Any]) -> list[str]:
    """Aligned plain-text per-task table for the terminal, with the selection score under it."""
    header = ["task", "examples", *TABLE_COLUMNS]
    rows = [header, *_rows(metrics)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    score = metrics["summary"]["selection_score"]
    lines.append(f"selection score (weighted mean of the primary metrics, marked *): {score:.4f}")
    return lines


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def evaluated_on(metrics: dict[str, Any]) -> str:
    """What the model was evaluated on, in words: the split, the files given with --data, or both."""
    files = sorted({f"`{d['source']}`" for d in metrics["data"].values() if d.get("from_data_flag")})
    parts = ([f"the {metrics['split']} split"] if metrics["split"] is not None else []) + files
    return " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]


def render_report(metrics: dict[str, Any], plots: list[str] | None = None) -> str:
    """The whole report.md: summary, per-task tables, per-type/per-class tables, utilisation, plots."""
    out = [f"# Evaluation of `{metrics['model']}` on {evaluated_on(metrics)}", ""]
    out += _table(
        ["task", "source", "examples"],
        [[name, f"`{d['source']}`", d["examples"]] for name, d in metrics["data"].items()],
    )
    out += ["## Per-task metrics", ""]
    out += _table(["task", "examples", *TABLE_COLUMNS], _rows(metrics, "\\*"))
    score = metrics["summary"]["selection_score"]
    out += [f"Selection score (weighted mean of the primary metrics, marked \\*): **{score:.4f}**", ""]
    for name, m in metrics["tasks"].items():
        out += _task_section(name, m) + _novelty_section(name, metrics.get("analysis", {}).get(name, {}))
    out += _experts_section(metrics)
    if plots:
        out += ["## Plots", ""]
        out += [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(out)


def _task_section(name: str, m: dict[str, Any]) -> list[str]:
    if "per_type" in m:
        out = [f"## {name}: per entity type", ""]
        rows = [[t, r["precision"], r["recall"], r["f1"], r["support"]] for t, r in m["per_type"].items()]
        return out + _table(["type", "precision", "recall", "f1", "support"], rows)
    out = [f"## {name}: per class", ""]
    rows = [[c, r["precision"], r["recall"], r["f1"], r["support"]] for c, r in m["per_class"].items()]
    out += _table(["class", "precision", "recall", "f1", "support"], rows)
    cm = m["confusion_matrix"]
    out += [f"Confusion matrix of {name} (rows: gold, columns: predicted):", ""]
    out += _table(
        ["gold \\ predicted", *cm["labels"]], [[g, *r] for g, r in zip(cm["labels"], cm["matrix"], strict=True)]
    )
    return out


def _novelty_section(name: str, m: dict[str, Any]) -> list[str]:
    """Entities seen and unseen in training (overall and per type), and the hard slices, where measured."""
    out: list[str] = []
    novelty = m.get("novelty")
    if novelty:
        share = novelty["unseen_share"]
        out += [f"## {name}: entities seen and unseen in training ({share:.1%} of gold entities unseen)", ""]
        rows = [["all", side, *_prf_cells(novelty[side])] for side in ("seen", "unseen")]
        rows += [[t, side, *_prf_cells(r[side])] for t, r in novelty["per_type"].items() for side in ("seen", "unseen")]
        out += _table(["type", "in training", "precision", "recall", "f1", "gold", "predicted"], rows)
    if m.get("slices"):
        out += [f"## {name}: hard slices", ""]
        rows = [[s, r["sentences"], r["precision"], r["recall"], r["f1"], r["support"]] for s, r in m["slices"].items()]
        out += _table(["slice", "sentences", "precision", "recall", "f1", "support"], rows)
    return out


def _prf_cells(r: dict[str, Any]) -> list[Any]:
    return [r["precision"], r["recall"], r["f1"], r["support"], r["predicted"]]


def _experts_section(metrics: dict[str, Any]) -> list[str]:
    out = ["## Expert utilisation", ""]
    for note in metrics["notes"]:
        out += [f"Note: {note}.", ""]
    experts = metrics["experts"]
    if not experts:
        return out
    settings = metrics["settings"]
    out += [
        f"Statistics cover the {settings['coverage']}. Dead: mean weight below "
        f"{settings['dead_expert_fraction']} x uniform (1/E). Entropy is normalised by log(E).",
        "",
    ]
    for layer, gates in experts.items():
        out += [f"### {layer}", ""]
        rows = [
            [gate, s["tokens"], s["shared_share"], s["normalised_entropy"], ", ".join(s["dead_experts"]) or "none"]
            for gate, s in gates.items()
        ]
        out += _table(["gate", "tokens", "shared share", "normalised entropy", "dead experts"], rows)
        for gate, s in gates.items():
            out += [f"Gate `{gate}` in {layer}:", ""]
            rows = [[e, s["mean"][e], s["std"][e], s["top1_share"][e]] for e in s["experts"]]
            out += _table(["expert", "mean weight", "std", "top-1 share"], rows)
            rows = [
                [b["bucket"], b["tokens"], b["shared_share"], *((b["mean"] or {}).get(e) for e in s["experts"])]
                for b in s["positions"]
            ]
            out += _table(["positions", "tokens", "shared share", *(f"mean {e}" for e in s["experts"])], rows)
    return out
