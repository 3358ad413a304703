"""benchmarks/labelling_processes.py's inputs: a student config of the teacher's tasks that loads, on slices of the
bundled samples, and the transfer file with the words the teacher will label counted."""

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
    n = labelling_processes.SAMPLE_TEXTS
    sample = labelling_processes.SAMPLES
    conll = [json.loads(line) for line in (sample / "conll2003-sample" / "train.jsonl").open(encoding="utf-8")][:n]
    sst = [json.loads(line) for line in (sample / "sst2-sample" / "train.jsonl").open(encoding="utf-8")][:n]
    assert words == sum(len(r["tokens"]) for r in conll) + sum(len(r["text"].split()) for r in sst) + 4 + 6
