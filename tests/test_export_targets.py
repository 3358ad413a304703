"""export --output obeys the model-folder rule (paths.check_outside_model): never inside the model folder, and,
since --force replaces the output folder whole, never a folder that holds it (its run folder); the README's
RUN/trunk-hf, beside the model folder, still works."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from test_output_targets import snapshot  # tests/ is on sys.path (pytest's rootdir conftest)
from trunk_runs import trained

from mtl_decoder.cli import main


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "trunk-runs"  # the frozen run test_export.py trains, shared


@pytest.fixture
def run(root, tmp_path) -> Path:
    """A copy of the session's frozen-trunk run folder (RUN/best, RUN/checkpoints, ...)."""
    return Path(shutil.copytree(trained(root, "frozen").run_dir, tmp_path / "run"))


@pytest.mark.parametrize("where, why", [("best", "is inside"), ("best/hf", "is inside"), (".", "holds")])
def test_export_refuses_an_output_in_or_over_the_model_folder(run, where, why, capsys):
    """Before, ``--output RUN/best --force`` replaced the model folder with the exported checkpoint, and
    ``--output RUN --force`` the whole run folder."""
    model, out = run / "best", run / where
    before = snapshot(run)
    capsys.readouterr()
    code = main(["export", "--model", str(model), "--trunk", "--output", str(out), "--force"])
    err = capsys.readouterr().err
    assert snapshot(run) == before
    assert code == 2 and err.count("\n") == 1
    assert f"--output {out}: {why} the model folder {model}" in err


def test_export_writes_beside_the_model_folder_in_the_run_folder(run):
    out = run / "trunk-hf"
    assert main(["export", "--model", str(run / "best"), "--trunk", "--output", str(out)]) == 0
    assert (out / "config.json").is_file()
