"""int8's close texts predicted again in float32 (inference/refine.py): the margin quantize chooses against a
brute-force count, and on a tiny quantised trunk model exactly the texts whose int8 label is within the margin of a
tie take float32's prediction, every other text int8's own."""

from __future__ import annotations

import json
import random

import pytest
from trunk_runs import trained

from mtl_decoder.cli import main
from mtl_decoder.inference.prediction import Prediction
from mtl_decoder.inference.refine import MARGINS, agreement, choose_margin, close_to_a_tie, is_close
from mtl_decoder.inference.smoothquant import SCALES_FILE, load_scales
from mtl_decoder.prediction import predict_texts

TEXTS = [
    "Peter lives in Berlin .",
    "the film was great",
    "EU rejects German call to boycott British lamb .",
    "a dull , lifeless movie",
    "Japan began the defence of their Asian Cup title .",
    "it is a charming and often affecting journey",
    "Nadim Ladki",
    "unfunny and lame",
    "AL-AIN , United Arab Emirates 1996-12-06",
    "the acting is solid but the plot drags",
    "China controlled most of the match .",
    "an utterly forgettable sequel",
]


def _pred(p_positive: float, tags: list[str]) -> Prediction:
    label = "positive" if p_positive >= 0.5 else "negative"
    probs = {"sst2": {"positive": p_positive, "negative": 1 - p_positive}}
    return Prediction(["w"] * len(tags), None, tags={"ner": tags}, labels={"sst2": label}, probs=probs)


def test_the_chosen_margin_is_the_smallest_that_reaches_every_bar():
    rng = random.Random(0)
    exact, fast = [], []
    for _ in range(400):
        p = rng.random()
        q = min(1.0, max(0.0, p + rng.gauss(0, 0.05)))  # int8's probability: near float32's
        tags = ["B-PER", "O"]
        exact.append(_pred(p, tags))
        fast.append(_pred(q, tags if rng.random() > 0.01 else ["O", "O"]))
    bars = {"sst2": 0.995, "ner": 0.98}

    def brute(margin: float) -> dict[str, float]:  # a text refined agrees; else compare the answers directly
        gap = [abs(2 * f.probs["sst2"]["positive"] - 1) for f in fast]
        ok_label = [g < margin or e.labels == f.labels for e, f, g in zip(exact, fast, gap, strict=True)]
        ok_tags = [g < margin or e.tags == f.tags for e, f, g in zip(exact, fast, gap, strict=True)]
        return {"sst2": sum(ok_label) / len(fast), "ner": sum(ok_tags) / len(fast)}

    reached = [m for m in MARGINS if all(brute(m)[t] >= bar for t, bar in bars.items())]
    assert reached and reached[0] > 0  # the noise flips some labels: int8 alone misses the bar
    margin, measured = choose_margin(exact, fast, bars)
    assert margin == reached[0]
    assert measured["agreement"] == pytest.approx(brute(margin), abs=1e-5)
    gaps = [abs(2 * f.probs["sst2"]["positive"] - 1) for f in fast]
    assert measured["refined"] == pytest.approx(sum(g < margin for g in gaps) / len(gaps), abs=1e-5)
    assert choose_margin(exact, fast, {"sst2": 1.01}) is None  # no margin can reach more than every text
    assert agreement(exact, fast, 1.01, bars)["refined"] == 1.0  # a gap is at most 1: every text refined


def test_is_close_reads_every_classification_and_ignores_tags():
    assert is_close(_pred(0.52, ["O"]), 0.05) and not is_close(_pred(0.6, ["O"]), 0.05)
    tags_only = Prediction(["w"], None, tags={"ner": ["O"]})
    assert not is_close(tags_only, 1.0)


def test_a_near_tie_is_the_two_largest_probabilities_of_any_distribution_within_the_margin():
    three = {"a": 0.30, "b": 0.45, "c": 0.25}  # the two largest, 0.45 and 0.30, are 0.15 apart, in any label order
    assert close_to_a_tie([three], 0.16) and not close_to_a_tie([three], 0.14)
    assert close_to_a_tie([{"x": 1.0, "y": 0.0}, three], 0.2)  # one close distribution is enough
    assert not close_to_a_tie([{"only": 1.0}], 2.0) and not close_to_a_tie([], 2.0)  # one label is never a tie


@pytest.fixture(scope="module")
def best(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("refine"), "frozen").best


def _quantize(best, margin: float) -> None:
    code = main(["quantize", "--model", str(best), "--calibration-texts", "8", "--min-tags", "0",
                 "--min-labels", "0", "--refine-margin", str(margin)])  # fmt: skip
    assert code == 0
    assert load_scales(best / SCALES_FILE)[2]["refine_margin"] == margin


def test_close_texts_take_float32s_prediction_and_the_others_keep_int8s(best, tmp_path):
    fp32 = list(predict_texts(best, TEXTS))
    _quantize(best, 0.0)
    alone = list(predict_texts(best, TEXTS, precision="int8"))
    assert sum(a != f for a, f in zip(alone, fp32, strict=True)) >= len(TEXTS) // 2  # int8 moves the tiny model
    task = next(t for t, v in fp32[0].items() if isinstance(v, dict) and "probs" in v)
    gaps = [abs(p[task]["probs"]["positive"] - p[task]["probs"]["negative"]) for p in alone]
    margin = sorted(gaps)[len(gaps) // 2] + 1e-6  # about half the texts are close
    close = [g < margin for g in gaps]
    assert 0 < sum(close) < len(TEXTS)

    _quantize(best, margin)
    refined = list(predict_texts(best, TEXTS, precision="int8"))
    for i, is_near in enumerate(close):
        assert refined[i] == (fp32[i] if is_near else alone[i]), f"text {i} (close: {is_near})"
    assert list(predict_texts(best, TEXTS, precision="int8", refine=False)) == alone

    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    for flags, want in (([], refined), (["--no-refine"], alone)):
        out = tmp_path / f"out{len(flags)}.jsonl"
        assert main(["predict", "--model", str(best), "--input", str(inputs), "--output", str(out),
                     "--precision", "int8", *flags]) == 0  # fmt: skip
        written = [json.loads(line)["predictions"] for line in out.read_text().splitlines()]
        assert [w[task]["label"] for w in written] == [w[task]["label"] for w in want]
