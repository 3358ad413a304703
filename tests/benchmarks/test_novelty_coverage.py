"""benchmarks/novelty.py's transfer coverage: the unseen test entities a transfer file holds, counted by hand on a
tiny CoNLL-shaped folder."""

from __future__ import annotations

import json
from pathlib import Path

import novelty


def _tagged(path: Path, rows: list[tuple[list[str], list[str]]]) -> None:
    path.write_text("".join(json.dumps({"tokens": w, "ner_tags": t}) + "\n" for w, t in rows), encoding="utf-8")


def test_counts_unseen_entities_found_as_whole_word_runs(tmp_path):
    root = tmp_path / "data"
    (root / "conll2003").mkdir(parents=True)
    _tagged(root / "conll2003" / "train.jsonl", [(["Peter", "Blackburn", "said"], ["B-PER", "I-PER", "O"])])
    test = [
        (["Peter", "Blackburn", "met", "Anna", "Bell"], ["B-PER", "I-PER", "O", "B-PER", "I-PER"]),  # seen, unseen
        (["In", "Oslo", "and", "Rome"], ["O", "B-LOC", "O", "B-LOC"]),  # two unseen
        (["EU", "votes"], ["B-ORG", "O"]),  # unseen
    ]
    for split in ("validation", "test"):
        _tagged(root / "conll2003" / f"{split}.jsonl", test)
    transfer = tmp_path / "news.txt"
    # "Anna Bell" across a line break does not count; "Romeo" is not "Rome"; "EU" and "Oslo" are whole words
    transfer.write_text("the EU  said\nAnna\nBell went to Oslo .\nRomeo\n", encoding="utf-8")
    seen = novelty.seen_surfaces(zip(*novelty.conll2003(root, "train"), strict=True))

    coverage = novelty.transfer_coverage(root, seen, [transfer])

    assert coverage["files"] == ["news.txt"]
    assert coverage["test"] == {"unseen": 4, "in_transfer": 2, "share": 0.5}
