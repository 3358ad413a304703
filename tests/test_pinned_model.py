"""A model saved by an earlier version of the package (tests/fixtures/pinned, trained at commit 8ee519f) must load
and give the predictions and metrics it gave then: refactors may move code, never change its results. Numbers
(probabilities, gate statistics) may differ by float rounding only (a faster kernel sums in another order: relative
1e-5); every label, tag, span and count must be the same."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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
    got = out.read_text(encoding="utf-8").splitlines()
    assert len(got) == len(expected)
    for line, (a, b) in enumerate(zip(got, expected, strict=True), 1):
        assert same(json.loads(a), json.loads(b)), f"line {line}: {a} != {b}"


def test_metrics_are_those_of_the_pinned_version(tmp_path):
    data = {"ner": FIXTURES / "ner_test.jsonl", "sentiment": FIXTURES / "sentiment_test.jsonl"}
    metrics = evaluate(PINNED / "model", split="test", data=data, output_dir=tmp_path).metrics
    expected = json.loads((PINNED / "expected" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["tasks"] == expected["tasks"]
    assert metrics["summary"] == expected["summary"]
    assert same(metrics["experts"], expected["experts"])


def same(a: Any, b: Any) -> bool:
    """Equal, floats up to rounding; the same keys, lengths, strings, integers and booleans."""
    if isinstance(a, float) or isinstance(b, float):
        both_numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        return both_numbers and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
