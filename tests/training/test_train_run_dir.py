"""A run owns its folder (mtl_decoder.training.run_dir): train refuses a non-empty folder that is not one of its
runs, --overwrite says what it removes and reads nothing that was there, and the folder is checked before the
data is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mtl_decoder.training.trainer as trainer_module
from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.training import train
from mtl_decoder.training.run_dir import MARKER


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _user_files(folder: Path) -> Path:
    """A folder a user keeps things in, holding names a run also uses."""
    (folder / "best").mkdir(parents=True)
    (folder / "best" / "important.txt").write_text("keep me", encoding="utf-8")
    (folder / "summary.json").write_text('{"mine": true}', encoding="utf-8")
    (folder / "metrics.jsonl").write_text('{"type": "mine"}\n', encoding="utf-8")
    (folder / "labels.json").write_text(json.dumps({"ner": ["O", "B-FOO"], "sentiment": ["x"]}), encoding="utf-8")
    (folder / "tokenizer.json").write_text("not a tokenizer", encoding="utf-8")
    return folder


@pytest.fixture
def no_data_reading(monkeypatch):
    """Fails a test that reads the training data: the checks under test must come before it."""

    def read_data(*args, **kwargs):
        raise AssertionError("the data was read before the run folder was checked")

    monkeypatch.setattr(trainer_module, "read_data", read_data)


def test_a_folder_that_is_not_a_run_is_refused_and_left_untouched(make_config, tmp_path, no_data_reading, capsys):
    folder = _user_files(tmp_path / "mine")
    before = _snapshot(folder)
    with pytest.raises(UserError, match=r"is not empty and is not a run of mtl-decoder .*overwrite=True"):
        train(make_config(folder, ["training.max_steps=2"]))
    config = make_config(tmp_path / "elsewhere")
    config.save(tmp_path / "c.yaml")
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--output-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {folder} is not empty and is not a run")
    assert _snapshot(folder) == before


def test_overwrite_says_what_it_removes_and_reads_nothing_that_was_there(make_config, tmp_path, capsys):
    folder = _user_files(tmp_path / "mine")
    result = train(make_config(folder, ["training.max_steps=2"]), overwrite=True)
    err = capsys.readouterr().err
    assert (
        f"--overwrite: removing from {folder}: best/, labels.json, metrics.jsonl, summary.json, tokenizer.json" in err
    )
    assert result.steps == 2
    assert not (folder / "best" / "important.txt").exists()
    labels = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    assert labels["sentiment"] == ["negative", "positive"] and "B-FOO" not in labels["ner"]  # its own label sets
    assert all(json.loads(line)["type"] != "mine" for line in (folder / "metrics.jsonl").read_text().splitlines())
    assert (folder / MARKER).is_file()
    with pytest.raises(UserError, match="already holds a run: use resume=True"):  # now it is a run
        train(make_config(folder, ["training.max_steps=2"]))


def test_an_output_dir_under_a_regular_file_is_refused_before_the_data_is_read(
    make_config, tmp_path, no_data_reading, capsys
):
    blocker = tmp_path / "runs"
    blocker.write_text("a file where a folder should be", encoding="utf-8")
    make_config(tmp_path / "x").save(tmp_path / "c.yaml")
    for output in (blocker / "demo", blocker):
        assert main(["train", "--config", str(tmp_path / "c.yaml"), "--output-dir", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is a file, not a folder; choose another --output-dir" in err
    assert blocker.read_text(encoding="utf-8") == "a file where a folder should be"


def test_resume_needs_a_run(make_config, tmp_path, no_data_reading):
    folder = _user_files(tmp_path / "mine")
    with pytest.raises(UserError, match=r"resume=True: .* holds no run of mtl-decoder"):
        train(make_config(folder), resume=True)
    with pytest.raises(UserError, match="choose one"):
        train(make_config(tmp_path / "new"), resume=True, overwrite=True)
