"""Task kinds and the metrics each kind reports: the one place these names are written."""

from __future__ import annotations

TAGGING = "token_tagging"
"""IOB2 tags, one per word."""
CLASSIFICATION = "sentence_classification"
"""One label per example."""
TASK_KINDS = (TAGGING, CLASSIFICATION)

SPLITS = ("train", "validation", "test")

TAGGING_METRICS = ("precision", "recall", "f1", "f1_strict", "token_accuracy")
"""Entity-level precision/recall/F1 (seqeval, conlleval-compatible), strict IOB2 F1, and token accuracy."""
CLASSIFICATION_METRICS = ("accuracy", "macro_f1")
METRICS = {TAGGING: TAGGING_METRICS, CLASSIFICATION: CLASSIFICATION_METRICS}
"""The scalar metrics of each kind, any of which can be a task's primary (selection) metric."""
DEFAULT_PRIMARY_METRIC = {TAGGING: "f1", CLASSIFICATION: "accuracy"}
