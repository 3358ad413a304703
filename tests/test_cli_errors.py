"""User errors on the command line: exit status 2 and one line `error: ...` on stderr, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mtl_decoder.cli import main

REPO = Path(__file__).resolve().parents[1]


def bad_data_config(tmp_path: Path) -> tuple[Path, Path]:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"tokens": ["EU"], "ner_tags": ["B-ORG"]}\n\n{"tokens": ["x"], "ner_tags": ["O"]\n', encoding="utf-8"
    )
    (tmp_path / "ner.yaml").write_text(
        "name: ner\nkind: token_tagging\ndata: {train: bad.jsonl, validation: bad.jsonl}\n", encoding="utf-8"
    )
    config = tmp_path / "c.yaml"
    config.write_text("tasks: [ner.yaml]\ntraining: {output_dir: run, progress: false}\n", encoding="utf-8")
    return config, bad


def test_train_on_a_bad_file_exits_2_with_one_line(tmp_path):
    config, bad = bad_data_config(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "mtl_decoder", "train", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"error: {bad}:3: malformed JSON (Expecting ',' delimiter at column 36)"], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_config_errors_exit_2_with_one_line(tmp_path, capsys):
    config, _ = bad_data_config(tmp_path)
    assert main(["train", "--config", str(config), "model.d_modle=64"]) == 2
    err = capsys.readouterr().err
    assert err == "error: config key 'model.d_modle': unknown key (did you mean 'model.d_model'?)\n"
    assert main(["train", "--config", str(config), "tasks.ner.kind=tagging"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: config key 'tasks.ner.kind':")
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
