"""No command writes into a model folder (the rule predict already had, paths.check_outside_model): evaluate
--output, diagnose --output, build-gate-table --output and predict --shard K/N --output are refused there with one
line naming the path, and the model folder's files stay byte-identical. (export:
tests/test_export_targets.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mtl_decoder.cli import main


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes): what a refused command must leave as it was."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def model(tiny_run, tmp_path) -> Path:
    """A copy of the session's tiny model folder (a command that wrongly writes into it harms no other test)."""
    return Path(shutil.copytree(tiny_run / "best", tmp_path / "model"))


@pytest.fixture
def sample(tmp_path) -> Path:
    path = tmp_path / "sample.txt"
    path.write_text("EU rejects German call to boycott British lamb .\nPeter Blackburn went home .\n", encoding="utf-8")
    return path


def refused(argv: list[str], model: Path, capsys) -> str:
    """Run the command; it must exit 2 with one line naming the model folder and leave the folder untouched."""
    before = snapshot(model)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert snapshot(model) == before
    assert code == 2 and err.count("\n") == 1 and f"the model folder {model}" in err
    return err


@pytest.mark.parametrize("where", [".", "reports", "plots"])
def test_evaluate_refuses_an_output_inside_the_model_folder(model, where, capsys):
    """Before, ``--output MODEL`` wrote metrics.json, report.md and plots/ among the model's files."""
    out = model / where
    err = refused(["evaluate", "--model", str(model), "--split", "validation", "--output", str(out)], model, capsys)
    assert f"--output {out}: is inside" in err


def test_evaluate_still_writes_its_default_report_folder_named_explicitly(model):
    out = model / "eval-validation"  # the default for --split validation, given as --output
    assert main(["evaluate", "--model", str(model), "--split", "validation", "--output", str(out)]) == 0
    assert (out / "metrics.json").is_file()


@pytest.mark.parametrize("where", [".", "report"])
def test_diagnose_refuses_an_output_inside_the_model_folder(model, where, capsys):
    out = model / where
    err = refused(["diagnose", "--model", str(model), "--examples", "2", "--output", str(out)], model, capsys)
    assert f"--output {out}: is inside" in err


def test_diagnose_checkpoints_refuses_an_output_inside_the_runs_model_folder(tiny_run, tmp_path, capsys):
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    out = run / "best" / "timeline"
    refused(["diagnose", "--checkpoints", str(run), "--examples", "2", "--output", str(out)], run / "best", capsys)


@pytest.mark.parametrize("name", ["model", "info", "gates"])
def test_build_gate_table_refuses_a_table_inside_the_model_folder(model, sample, name, capsys):
    """Before, ``--output MODEL/model --force`` replaced the model's weights with the table (model.safetensors)."""
    argv = ["build-gate-table", "--model", str(model), "--input", str(sample), "--output", str(model / name)]
    err = refused([*argv, "--force"], model, capsys)
    assert f"{model / name}.safetensors: is inside" in err


def test_build_gate_table_writes_beside_the_model_folder(model, sample, tmp_path):
    out = tmp_path / "gates"  # the README's RUN/gates: in the run folder, outside the model's
    assert main(["build-gate-table", "--model", str(model), "--input", str(sample), "--output", str(out)]) == 0
    assert Path(f"{out}.safetensors").is_file() and Path(f"{out}.json").is_file()


@pytest.mark.parametrize("shard", ["0/1", "1/2"])
def test_a_shard_refuses_a_part_file_inside_the_model_folder(model, sample, shard, capsys):
    """Before, a sharded (or launched) predict skipped the rule a single process applies: ``--shard K/N --output
    MODEL/model.safetensors --force`` overwrote the weights."""
    out = model / "model.safetensors"
    argv = ["predict", "--model", str(model), "--input", str(sample), "--output", str(out), "--shard", shard]
    err = refused([*argv, "--force", "--workers", "1"], model, capsys)
    assert f"--output {out}: is inside" in err
