"""Metric values on hand-made gold/prediction pairs, where the right answer is known by counting."""

from __future__ import annotations

import pytest

from mtl_decoder.config import CLASSIFICATION, TAGGING, TaskConfig
from mtl_decoder.evaluation.metrics import classification_metrics, selection_score, tagging_metrics


def test_tagging_counts_entities_not_tokens():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "I-ORG"]]  # LOC missed: 2 of 3 entities found
    m = tagging_metrics(gold, pred)
    assert m["precision"] == pytest.approx(1.0)
    assert m["recall"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx(0.8)
    assert m["f1_strict"] == pytest.approx(0.8)
    assert m["token_accuracy"] == pytest.approx(6 / 7)
    assert m["support"] == 3 and m["sentences"] == 2
    assert m["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert m["per_type"]["PER"]["f1"] == pytest.approx(1.0)


def test_default_and_strict_iob2_differ_on_a_leading_inside_tag():
    # conlleval (seqeval default) reads I-PER I-PER as a PER entity; strict IOB2 says no entity starts there.
    gold = [["B-PER", "I-PER", "O"]]
    pred = [["I-PER", "I-PER", "O"]]
    m = tagging_metrics(gold, pred)
    assert m["f1"] == pytest.approx(1.0)
    assert m["f1_strict"] == pytest.approx(0.0)
    assert m["token_accuracy"] == pytest.approx(2 / 3)


def test_tagging_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="sequence 0"):
        tagging_metrics([["O", "O"]], [["O"]])


def test_classification_report_and_confusion_matrix():
    m = classification_metrics(list("aabbc"), list("abbba"), ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(0.6)
    assert m["per_class"]["a"]["f1"] == pytest.approx(0.5)
    assert m["per_class"]["b"]["precision"] == pytest.approx(2 / 3)
    assert m["per_class"]["b"]["f1"] == pytest.approx(0.8)
    assert m["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert m["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert m["confusion_matrix"] == {"labels": ["a", "b", "c"], "matrix": [[1, 1, 0], [0, 2, 0], [1, 0, 0]]}


def test_selection_score_is_the_weighted_mean_of_primary_metrics():
    tasks = {
        "ner": TaskConfig(name="ner", kind=TAGGING, metric_weight=3.0),
        "sent": TaskConfig(name="sent", kind=CLASSIFICATION, primary_metric="macro_f1"),
    }
    metrics = {"ner": {"f1": 0.8, "f1_strict": 0.1}, "sent": {"accuracy": 0.9, "macro_f1": 0.4}}
    assert selection_score(tasks, metrics) == pytest.approx((3 * 0.8 + 0.4) / 4)
    assert selection_score(tasks, {"sent": metrics["sent"]}) == pytest.approx(0.4)  # only the evaluated tasks
