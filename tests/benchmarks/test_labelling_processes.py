"""benchmarks/labelling_processes.py's inputs: a student config of the teacher's tasks that loads, on slices of the
bundled samples, and the transfer file, with the words of every text the teacher labels counted."""

from __future__ import annotations

import json

import labelling_processes

from mtl_decoder.config import load_config


def test_the_student_config_loads_and_the_words_are_counted(tmp_path):
    news = tmp_path / "news.txt"
    news.write_text("Rain in Rome .\n\nAcme Corp hired Maria Lopez .\nThird line here\n", encoding="utf-8")
    config, transfer, words = labelling_processes.write_inputs(tmp_path, news, 2)
    cfg = load_config(config)
    assert sorted(cfg.tasks) == ["conll2003", "sst2"]
    assert transfer.read_text(encoding="utf-8").splitlines() == ["Rain in Rome .", "Acme Corp hired Maria Lopez ."]
    files = [(tmp_path / f"{t}_train.jsonl").read_text(encoding="utf-8").splitlines() for t in ("conll2003", "sst2")]
    conll, sst = ([json.loads(line) for line in lines] for lines in files)
    assert len(conll) == len(sst) == labelling_processes.SAMPLE_TEXTS
    assert words == sum(len(r["tokens"]) for r in conll) + sum(len(r["text"].split()) for r in sst) + 4 + 6
