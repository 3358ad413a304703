"""A model saved by an earlier version of the package (tests/fixtures/pinned, trained at commit 8ee519f) must load
and give exactly the predictions and metrics it gave then: refactors may move code, never change its results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtl_decoder import evaluate, predict_file

PINNED = Path(__file__).parent / "fixtures" / "pinned"
FIXTURES = Path(__file__).parent / "fixtures"
INPUTS = {
    "pred_ner_test.jsonl": FIXTURES / "ner_test.jsonl",
    "pred_sentiment_test.jsonl": FIXTURES / "sentiment_test.jsonl",
    "pred_examples.jsonl": Path(__file__).parents[1] / "tasks" / "data" / "examples.txt",
}


@pytest.mark.parametrize("expected_name", sorted(INPUTS))
def test_predictions_are_those_of_the_pinned_version(tmp_path, expected_name):
    out = tmp_path / "out.jsonl"
    predict_file(PINNED / "model", INPUTS[expected_name], out, workers=1)
    expected = (PINNED / "expected" / expected_name).read_text(encoding="utf-8").splitlines()
    assert out.read_text(encoding="utf-8").splitlines() == expected


def test_metrics_are_those_of_the_pinned_version(tmp_path):
    data = {"ner": FIXTURES / "ner_test.jsonl", "sentiment": FIXTURES / "sentiment_test.jsonl"}
    metrics = evaluate(PINNED / "model", split="test", data=data, output_dir=tmp_path).metrics
    expected = json.loads((PINNED / "expected" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["tasks"] == expected["tasks"]
    assert metrics["summary"] == expected["summary"]
    assert metrics["experts"] == expected["experts"]
