"""benchmarks/labelling_processes.py's inputs: a student config of the teacher's tasks that loads, on slices of the
bundled samples, and the transfer file with its words counted."""

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
    assert words == 4 + 6  # the transfer file's words
    train = [json.loads(line) for line in (tmp_path / "conll2003_train.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(train) == labelling_processes.SAMPLE_TEXTS and all("tokens" in r for r in train)
