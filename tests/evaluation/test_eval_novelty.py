"""Seen/unseen entity F1 and the hard slices: against counts made by hand, against seqeval where a side holds every
entity, and through ``evaluate`` / ``mtl-decoder evaluate`` on the session's tiny run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from seqeval.metrics import f1_score, precision_score, recall_score

from mtl_decoder.cli import main
from mtl_decoder.evaluation.evaluate import evaluate
from mtl_decoder.evaluation.novelty import is_all_caps, is_number_heavy, seen_unseen_metrics, slice_metrics

FIXTURES = Path(__file__).parents[1] / "fixtures"
WORDS = [["John", "Smith", "visited", "Paris", "and", "Oslo", "."], ["Acme", "Corp", "hired", "Ann", "."]]
GOLD = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "O", "B-PER", "O"]]
PRED = [["B-PER", "I-PER", "O", "B-LOC", "O", "O", "O"], ["B-ORG", "O", "O", "B-PER", "B-LOC"]]


def test_counts_made_by_hand():
    # seen: "John Smith", "Paris", "Acme". Gold: John Smith (seen), Paris (seen), Oslo, Acme Corp, Ann (unseen).
    # Predicted: John Smith (seen, right), Paris (seen, right), Acme (seen, wrong), Ann (unseen, right),
    # "." as LOC (unseen, wrong).
    m = seen_unseen_metrics(WORDS, GOLD, PRED, {"John Smith", "Paris", "Acme"})
    assert (m["seen"]["support"], m["seen"]["predicted"]) == (2, 3)
    assert m["seen"]["precision"] == pytest.approx(2 / 3) and m["seen"]["recall"] == 1.0
    assert m["seen"]["f1"] == pytest.approx(0.8)
    assert (m["unseen"]["support"], m["unseen"]["predicted"]) == (3, 2)
    assert m["unseen"]["precision"] == 0.5 and m["unseen"]["recall"] == pytest.approx(1 / 3)
    assert m["unseen"]["f1"] == pytest.approx(0.4)
    assert m["unseen_share"] == pytest.approx(3 / 5)
    assert m["per_type"]["LOC"]["unseen"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1, "predicted": 1}
    assert m["per_type"]["ORG"]["seen"]["predicted"] == 1 and m["per_type"]["ORG"]["unseen"]["support"] == 1


def _random_tags(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"]) for _ in range(n)]


def test_a_side_holding_every_entity_scores_as_seqeval():
    rng = random.Random(0)
    words = [[rng.choice(["a", "b", "c"]) for _ in range(rng.randint(1, 9))] for _ in range(200)]
    gold = [_random_tags(rng, len(w)) for w in words]
    pred = [_random_tags(rng, len(w)) for w in words]
    everything = {" ".join(w[i:j]) for w in words for i in range(len(w)) for j in range(i + 1, len(w) + 1)}
    for seen, side in ((set(), "unseen"), (everything, "seen")):
        m = seen_unseen_metrics(words, gold, pred, seen)
        assert m[side]["precision"] == pytest.approx(precision_score(gold, pred))
        assert m[side]["recall"] == pytest.approx(recall_score(gold, pred))
        assert m[side]["f1"] == pytest.approx(f1_score(gold, pred))
        other = "seen" if side == "unseen" else "unseen"
        assert m[other]["support"] == m[other]["predicted"] == 0
        assert sum(r[side]["support"] for r in m["per_type"].values()) == m[side]["support"]


def test_slices_pick_their_sentences_and_score_them_alone():
    assert is_all_caps(["SOCCER", "-", "JAPAN", "GET", "LUCKY", "WIN", "."]) and not is_all_caps(["JAPAN"])
    assert not is_all_caps(["Japan", "WIN"])
    assert is_number_heavy(["Ajax", "3", "2", "0", "1"]) and not is_number_heavy(["In", "1996", "he", "left", "."])
    words = [*WORDS, ["GERMANY", "BEAT", "ITALY"], ["Hello"]]
    gold = [*GOLD, ["B-LOC", "O", "B-LOC"], ["O"]]
    pred = [*PRED, ["B-LOC", "O", "O"], ["O"]]
    slices = slice_metrics(words, gold, pred)
    assert set(slices) == {"all_caps", "one_word"}
    assert slices["all_caps"]["sentences"] == 1 and slices["all_caps"]["f1"] == pytest.approx(
        f1_score([gold[2]], [pred[2]])
    )


def test_evaluate_reports_seen_and_unseen_against_the_run_train_file(tiny_run: Path, tmp_path: Path):
    best = tiny_run / "best"
    result = evaluate(best, split="test", output_dir=tmp_path / "eval")
    config_tasks = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    ner = result.metrics["analysis"]["ner"]
    # independently: the gold surfaces of the test file, against the train file's, read as plain JSON lines
    train_file, test_file = FIXTURES / "ner_train.jsonl", FIXTURES / "ner_test.jsonl"  # the tiny run's files
    seen = _surfaces(train_file)
    test_surfaces = _surfaces_list(test_file)
    unseen = sum(s not in seen for s in test_surfaces)
    assert ner["novelty"]["unseen_share"] == pytest.approx(unseen / len(test_surfaces))
    assert ner["novelty"]["seen"]["support"] + ner["novelty"]["unseen"]["support"] == result.tasks["ner"]["support"]
    assert "sentiment" not in result.metrics["analysis"]
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "ner: entities seen and unseen in training" in report
    assert config_tasks["analysis"] == json.loads(json.dumps(result.metrics["analysis"]))

    # another training file: the test file itself, so every gold entity counts as seen
    assert main(["evaluate", "--model", str(best), "--split", "test", "--output", str(tmp_path / "self"),
                 "--train-data", f"ner={test_file}"]) == 0  # fmt: skip
    again = json.loads((tmp_path / "self" / "metrics.json").read_text())["analysis"]["ner"]["novelty"]
    assert again["unseen"]["support"] == 0 and again["unseen_share"] == 0.0
    assert main(["evaluate", "--model", str(best), "--output", str(tmp_path / "bad"),
                 "--train-data", f"sentiment={test_file}"]) == 2  # fmt: skip


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _surfaces_list(path: Path) -> list[str]:
    """Every gold entity's words, joined by a space, by a plain IOB2 walk (B- opens, I- of the same type goes on)."""
    out = []
    for r in _records(path):
        words, tags = r["tokens"], r["ner_tags"]
        current: list[str] = []
        kind = None
        for word, tag in [*zip(words, tags, strict=True), ("", "O")]:
            if tag.startswith("I-") and kind == tag[2:]:
                current.append(word)
                continue
            if current:
                out.append(" ".join(current))
            current, kind = ([word], tag[2:]) if tag != "O" else ([], None)
        assert not current
    return out


def _surfaces(path: Path) -> set[str]:
    return set(_surfaces_list(path))
