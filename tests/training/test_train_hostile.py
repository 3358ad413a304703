"""A run folder under hostile conditions (issue 27 cases 4, 8, 15, 16, 22): one train per folder at a time, a resume
refuses data changed in place, a run that cannot start leaves nothing, SIGTERM while best/ is written leaves no
temporary and a checkpoint a --resume continues from, SIGTERM during evaluate leaves no output folder."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.files import TMP_MARK
from mtl_decoder.locks import PathLock
from mtl_decoder.training import train
from mtl_decoder.training.checkpoints import latest_checkpoint

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def _config_file(tmp_path: Path, data: Path | None = None, **training) -> Path:
    """A tiny experiment YAML over the fixtures (or copies of them in ``data``), run folder tmp_path/run."""
    from helpers import TINY, tiny_tasks

    tasks = tiny_tasks()
    if data is not None:
        for task in tasks:
            task["data"] = {split: str(data / Path(path).name) for split, path in task["data"].items()}
    tree = {**TINY, "tasks": tasks, "training": {**TINY["training"], "output_dir": str(tmp_path / "run"), **training}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return path


def _copy_fixtures(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for f in FIXTURES.glob("*.jsonl"):
        shutil.copy(f, data / f.name)
    return data


def _leftovers(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if TMP_MARK in p.name or p.name.endswith(".mtl-lock")]


def _cli(args: list[str], cwd: Path, preexec=None, script: str | None = None) -> subprocess.CompletedProcess:
    """mtl-decoder ARGS in a child process; ``script``: Python run first (to plant a SIGTERM)."""
    code = (script or "") + "\nimport sys\nfrom mtl_decoder.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
    )


def test_a_second_train_in_a_run_folder_stops_naming_the_first(make_config, tmp_path):
    run = tmp_path / "run"
    with PathLock(run, "in use by a training run"):  # train A, still running
        holder = rf"in use by a training run by another mtl-decoder process \(PID {os.getpid()}\)"
        with pytest.raises(UserError, match=holder):
            train(make_config(run), overwrite=True)
        assert not run.exists()  # B wrote nothing beside A's files
    assert train(make_config(run, ["training.max_steps=2", "training.eval_every=2"])).steps == 2
    assert _leftovers(tmp_path) == []  # the lock file goes with its owner


def test_resume_refuses_a_training_file_rewritten_in_place_and_accepts_a_touched_one(tmp_path, capsys):
    data = _copy_fixtures(tmp_path)
    config = _config_file(tmp_path, data, max_steps=4, eval_every=2)
    assert main(["train", "--config", str(config)]) == 0
    train_file = data / "sentiment_train.jsonl"
    os.utime(train_file)  # touched, same bytes: the same data
    assert main(["train", "--config", str(config), "--resume", "training.max_steps=6"]) == 0
    lines = train_file.read_text(encoding="utf-8").splitlines()
    relabelled = [json.dumps({**json.loads(x), "label": "negative"}) for x in lines]
    train_file.write_text("\n".join(relabelled + relabelled) + "\n", encoding="utf-8")  # relabelled and doubled
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--resume", "training.max_steps=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data changed since the run started" in err[0] and str(train_file) in err[0], err
    assert "ner_train.jsonl" not in err[0]
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


def test_a_model_too_large_for_memory_is_one_line_and_leaves_no_run_folder(tmp_path, capsys):
    config = _config_file(tmp_path)
    assert main(["train", "--config", str(config), "model.d_model=1099511627776"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of memory") and "model.d_model" in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "limit, fragment",
    [
        (16_000, "File too large"),  # tokenizer.json (~23 KB), in setup: the run folder goes
        (100_000, "run/best: cannot write the model"),  # model.safetensors (~140 KB)
        (200_000, "run/checkpoints/step-0000002: cannot write the checkpoint"),  # the optimizer state (~280 KB)
    ],
)
def test_a_full_disk_in_train_is_one_line_and_leaves_no_temporary(tmp_path, limit, fragment):
    config = _config_file(tmp_path, max_steps=4, eval_every=2)

    def limited():  # a file size limit: writes past it fail (EFBIG) as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = _cli(["train", "--config", str(config)], tmp_path, preexec=limited)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert _leftovers(tmp_path) == []
    if limit < 20_000:
        assert not (tmp_path / "run").exists()


SIGTERM_IN_BEST = """
import os, signal
import mtl_decoder.saved as saved
write = saved.atomic_write_safetensors
def atomic_write_safetensors(*args, **kwargs):  # SIGTERM arrives while best/ is being written
    os.kill(os.getpid(), signal.SIGTERM)
    return write(*args, **kwargs)
saved.atomic_write_safetensors = atomic_write_safetensors
"""


def test_sigterm_while_best_is_written_leaves_no_temporary_and_a_checkpoint_to_resume(tmp_path):
    config = _config_file(tmp_path, max_steps=4, eval_every=2)
    proc = _cli(["train", "--config", str(config)], tmp_path, script=SIGTERM_IN_BEST)
    assert proc.returncode == 143, proc.stderr
    lines = proc.stderr.strip().splitlines()
    run = tmp_path / "run"
    last = latest_checkpoint(run / "checkpoints")
    assert last is not None and last.name == "step-0000002"  # best/ and its checkpoint were written together
    assert lines[-1] == (
        f"train stopped by SIGTERM at step 2; temporary files removed; continue with --resume from {last}"
    )
    assert "Traceback" not in proc.stderr
    assert _leftovers(tmp_path) == []
    assert (run / "best" / "model.safetensors").is_file()
    proc = _cli(["train", "--config", str(config), "--resume"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "summary.json").read_text(encoding="utf-8"))["resumed_from"] == [2]


SIGTERM_IN_PLOTS = """
import os, signal
import mtl_decoder.evaluation.plots as plots
draw = plots.write_plots
def write_plots(metrics, folder):  # SIGTERM arrives once the plots folder exists
    folder.mkdir(parents=True, exist_ok=True)
    os.kill(os.getpid(), signal.SIGTERM)
    return draw(metrics, folder)
plots.write_plots = write_plots
"""


def test_sigterm_during_evaluate_leaves_no_output_folder(tiny_run, tmp_path):
    out = tmp_path / "eval"
    argv = ["evaluate", "--model", str(tiny_run / "best"), "--output", str(out)]
    proc = _cli(argv, tmp_path, script=SIGTERM_IN_PLOTS)
    assert proc.returncode == 143, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "terminated"
    assert not out.exists() and list(tmp_path.iterdir()) == []
