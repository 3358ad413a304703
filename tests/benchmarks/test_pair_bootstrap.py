"""benchmarks/pair_bootstrap.py: entity F1 from per-sentence counts is seqeval's micro F1, on any subset of the
sentences (a bootstrap resample repeats some and drops others)."""

from __future__ import annotations

import pair_bootstrap
from seqeval.metrics import f1_score


def record(gold: list[str], pred: list[str]) -> dict:
    return {"ner_tags": gold, "predictions": {"conll2003": {"tags": pred}}}


def test_f1_from_counts_is_seqevals_on_every_resample():
    records = [
        record(["B-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]),  # exact
        record(["B-LOC", "O", "B-ORG"], ["B-LOC", "B-ORG", "I-ORG"]),  # one right, one boundary wrong
        record(["O", "O"], ["B-MISC", "O"]),  # a spurious entity
        record(["B-PER", "I-PER"], ["B-ORG", "I-ORG"]),  # the right span, the wrong type
        record(["O"], ["O"]),  # nothing either side
    ]
    counts, f1 = pair_bootstrap.tagging_counts(records)
    assert counts[1] == (1, 2, 2) and counts[4] == (0, 0, 0)
    for rows in ([0, 1, 2, 3, 4], [1, 1, 3], [2, 4], [0, 0, 0, 2]):
        gold = [records[i]["ner_tags"] for i in rows]
        pred = [records[i]["predictions"]["conll2003"]["tags"] for i in rows]
        assert abs(pair_bootstrap.f1_of(counts, rows) - f1_score(gold, pred)) < 1e-12
    assert (
        abs(f1 - f1_score([r["ner_tags"] for r in records], [r["predictions"]["conll2003"]["tags"] for r in records]))
        < 1e-12
    )
