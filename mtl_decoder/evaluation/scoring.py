"""Predict a split's examples and score them: the one loop behind training-time validation and ``evaluate``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtl_decoder.config import TAGGING, TaskConfig
from mtl_decoder.data.tasks import Example, Source
from mtl_decoder.evaluation.metrics import task_metrics
from mtl_decoder.inference import Prediction, Predictor

Analyse = Callable[[TaskConfig, list[Example], list, list], None]
"""``analyse(task, examples, gold, predicted)``: called once per scored task, for analyses beyond its metrics."""

Distribute = Callable[[list[Example], Callable[[list[Example]], list[Prediction]]], list[Prediction]]
"""``distribute(examples, run)``: predictions for all ``examples`` in order, however they are computed. The
default runs them here; training shards them across processes (each runs its share) and gathers."""


def predict_examples(
    predictor: Predictor, examples: list[Example], tasks: list[str], on_batch: Callable | None = None
) -> list[Prediction]:
    items = [ex.words if ex.words is not None else ex.text for ex in examples]
    return list(predictor.predict(items, tasks, on_batch))


def gold_and_predicted(task: TaskConfig, examples: list[Example], preds: list[Prediction]) -> tuple[list, list]:
    gold = [ex.labels[task.name] for ex in examples]
    if task.kind == TAGGING:
        return gold, [p.tags[task.name] for p in preds]
    return gold, [p.labels[task.name] for p in preds]


def score_sources(
    predictor: Predictor,
    sources: list[Source],
    tasks: dict[str, TaskConfig],
    label_sets: dict[str, list[str]],
    only: list[str] | None = None,
    on_batch: Callable | None = None,
    distribute: Distribute | None = None,
    analyse: Analyse | None = None,
) -> dict[str, dict[str, Any]]:
    """Metrics per task for the sources of one split (each source predicted once for all its tasks)."""
    metrics: dict[str, dict[str, Any]] = {}
    for source in sources:
        names = [t.name for t in source.tasks if only is None or t.name in only]

        def run(examples: list[Example], names: list[str] = names) -> list[Prediction]:
            return predict_examples(predictor, examples, names, on_batch)

        preds = run(source.examples) if distribute is None else distribute(source.examples, run)
        for name in names:
            gold, pred = gold_and_predicted(tasks[name], source.examples, preds)
            metrics[name] = task_metrics(tasks[name], gold, pred, label_sets[name])
            if analyse is not None:
                analyse(tasks[name], source.examples, gold, pred)
    return metrics
