"""User errors on the command line: exit status 2 and one line `error: ...` on stderr, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mtl_decoder.cli import main

REPO = Path(__file__).resolve().parents[2]


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


# ------------------------------------------------------------------------------------------------ issue 27


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _loop(folder: Path, name: str) -> Path:
    (folder / f"{name}-a").symlink_to(folder / f"{name}-b")
    (folder / f"{name}-b").symlink_to(folder / f"{name}-a")
    return folder / f"{name}-a"


def test_a_key_given_twice_in_a_config_is_an_error_naming_both_lines(tmp_path, capsys):
    config, _ = bad_data_config(tmp_path)
    text = config.read_text(encoding="utf-8")
    config.write_text("model: {d_model: 64}\n" + text + "model:\n  n_layers: 1\n", encoding="utf-8")
    assert main(["train", "--config", str(config)]) == 2
    line = _one_line(capsys)
    assert line == f"error: {config}:4: invalid YAML (key 'model' is given twice, on lines 1 and 4; keep one)"
    config.write_text(text, encoding="utf-8")
    (tmp_path / "ner.yaml").write_text("name: ner\nkind: token_tagging\nname: other\n", encoding="utf-8")
    assert main(["debug-data", "--config", str(config)]) == 2
    assert "key 'name' is given twice, on lines 1 and 3" in _one_line(capsys)


def test_integers_written_as_huge_floats_are_refused_like_fractions(tmp_path, capsys):
    config, _ = bad_data_config(tmp_path)
    for value in ("1e30", "2.5", "10000000000000000000000000000000"):
        assert main(["train", "--config", str(config), f"training.max_steps={value}"]) == 2
        assert _one_line(capsys).startswith("error: config key 'training.max_steps': expected an integer")
    assert not (tmp_path / "run").exists()


def test_a_folder_or_a_symlink_loop_as_the_config_is_one_line(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path)]) == 2
    assert _one_line(capsys) == f"error: config file {tmp_path}: is a folder, not a file"
    loop = _loop(tmp_path, "config")
    assert main(["train", "--config", str(loop)]) == 2
    assert _one_line(capsys) == f"error: config file {loop}: is a symbolic link loop"


def test_a_task_path_that_is_a_folder_or_a_loop_and_a_data_file_that_loops_are_named(tmp_path, capsys):
    config, _ = bad_data_config(tmp_path)
    (tmp_path / "folder.yaml").mkdir()
    config.write_text("tasks: [folder.yaml]\n", encoding="utf-8")
    assert main(["train", "--config", str(config)]) == 2
    folder = tmp_path / "folder.yaml"
    assert _one_line(capsys) == f"error: config key 'tasks[0]': task file is a folder, not a file: {folder}"
    loop = _loop(tmp_path, "task")
    config.write_text(f"tasks: [{loop.name}]\n", encoding="utf-8")
    assert main(["train", "--config", str(config)]) == 2
    assert _one_line(capsys) == f"error: config key 'tasks[0]': task file is a symbolic link loop: {loop}"
    data = _loop(tmp_path, "data")
    config.write_text("tasks: [ner.yaml]\ntraining: {output_dir: run, progress: false}\n", encoding="utf-8")
    assert main(["train", "--config", str(config), f"tasks.ner.data.train={data}"]) == 2
    assert _one_line(capsys) == f"error: {data}: is a symbolic link loop"


def test_tasks_given_as_an_override_replace_the_task_list(tmp_path, capsys, monkeypatch):
    from mtl_decoder.config import load_config

    config, _ = bad_data_config(tmp_path)
    (tmp_path / "good.jsonl").write_text('{"text": "a fine film", "label": "pos"}\n', encoding="utf-8")
    (tmp_path / "s.yaml").write_text(
        "name: s\nkind: sentence_classification\ndata: {train: good.jsonl, validation: good.jsonl}\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)  # override paths are relative to where the user is
    for value in ("s.yaml", "[s.yaml]", "[s.yaml, ner.yaml]"):
        tasks = load_config(config, [f"tasks={value}"]).tasks
        assert list(tasks) == (["s", "ner"] if "ner" in value else ["s"])
        assert tasks["s"].data.train == str(tmp_path / "good.jsonl")
    assert main(["debug-data", "--config", str(config), "tasks=missing.yaml"]) == 2
    assert _one_line(capsys) == f"error: config key 'tasks[0]': task file not found: {tmp_path}/missing.yaml"


def test_a_model_folder_or_an_input_that_loops_is_called_a_loop(tiny_run, tmp_path, capsys):
    model = _loop(tmp_path, "model")
    source = tmp_path / "in.txt"
    source.write_text("a text\n", encoding="utf-8")
    out = str(tmp_path / "out.jsonl")
    assert main(["predict", "--model", str(model), "--input", str(source), "--output", out]) == 2
    assert _one_line(capsys) == f"error: {model}: is a symbolic link loop"
    loop = _loop(tmp_path, "input")
    assert main(["predict", "--model", str(tiny_run / "best"), "--input", str(loop), "--output", out]) == 2
    assert _one_line(capsys) == f"error: {loop}: is a symbolic link loop"
    out_loop = _loop(tmp_path, "out")
    assert main(["predict", "--model", str(tiny_run / "best"), "--input", str(source), "--output", str(out_loop)]) == 2
    assert _one_line(capsys) == f"error: --output {out_loop}: is a symbolic link loop; choose another --output"


def test_an_os_error_no_layer_named_is_one_line_with_exit_2(capsys):
    def full_disk(args):
        raise OSError(28, "No space left on device", "/data/out.jsonl")

    assert main(["debug-data", "--config", "x.yaml"], run=full_disk) == 2
    assert capsys.readouterr().err == "error: /data/out.jsonl: No space left on device\n"
