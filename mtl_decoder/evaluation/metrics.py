"""Per-task metrics: seqeval for entities, scikit-learn for classes.

Per-task metrics: seqeval for entities (conlleval-compatible default mode and strict IOB2), scikit-learn
for classes. Training-time validation and ``evaluate`` both call these, so their numbers agree."""

from __future__ import annotations

from typing import Any

from mtl_decoder.config import TAGGING, TaskConfig


def tagging_metrics(gold: list[list[str]], pred: list[list[str]]) -> dict[str, Any]:
    from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    _check_lengths(gold, pred)
    report = classification_report(gold, pred, output_dict=True, zero_division=0)
    types = {k: _entity_row(v) for k, v in report.items() if not k.endswith(" avg")}
    return {
        "precision": float(precision_score(gold, pred, zero_division=0)),
        "recall": float(recall_score(gold, pred, zero_division=0)),
        "f1": float(f1_score(gold, pred, zero_division=0)),
        "f1_strict": float(f1_score(gold, pred, mode="strict", scheme=IOB2, zero_division=0)),
        "token_accuracy": float(accuracy_score(gold, pred)),
        "support": int(sum(t["support"] for t in types.values())),
        "sentences": len(gold),
        "per_type": types,
    }


def _entity_row(row: dict[str, float]) -> dict[str, float]:
    return {
        "precision": float(row["precision"]),
        "recall": float(row["recall"]),
        "f1": float(row["f1-score"]),
        "support": int(row["support"]),
    }


def _check_lengths(gold: list[list[str]], pred: list[list[str]]) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sequences but {len(pred)} predicted")
    for i, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sequence {i}: {len(g)} gold tags but {len(p)} predicted")


def classification_metrics(gold: list[str], pred: list[str], labels: list[str]) -> dict[str, Any]:
    from sklearn.metrics import accuracy_score, classification_report, confusion_matrix, f1_score

    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predicted")
    report = classification_report(gold, pred, labels=labels, output_dict=True, zero_division=0)
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "macro_f1": float(f1_score(gold, pred, labels=labels, average="macro", zero_division=0)),
        "support": len(gold),
        "per_class": {lab: _entity_row(report[lab]) for lab in labels},
        "confusion_matrix": {"labels": list(labels), "matrix": confusion_matrix(gold, pred, labels=labels).tolist()},
    }


def task_metrics(task: TaskConfig, gold: list, pred: list, labels: list[str]) -> dict[str, Any]:
    if task.kind == TAGGING:
        return tagging_metrics(gold, pred)
    return classification_metrics(gold, pred, labels)


def selection_score(tasks: dict[str, TaskConfig], metrics: dict[str, dict[str, Any]]) -> float:
    """Weighted mean of the tasks' primary metrics (weights: each task's metric_weight)."""
    total = sum(tasks[name].metric_weight for name in metrics)
    if total == 0:
        return 0.0
    return sum(tasks[name].metric_weight * m[tasks[name].primary_metric] for name, m in metrics.items()) / total
