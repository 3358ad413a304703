"""End-to-end training on the tiny fixtures: run directory, determinism, faults, resume, several processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import needs_torchrun, torchrun_cli
from safetensors.torch import load_file

from mtl_decoder.errors import UserError
from mtl_decoder.training import train
from mtl_decoder.training.checkpoints import STATE_FILE, latest_checkpoint
from mtl_decoder.training.trainer import NonFiniteLoss, Trainer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def one_thread():
    """Bit-exact comparisons need one intra-op thread: with two, reductions on a loaded machine may split
    differently from run to run (differences of ~1e-9 seen here under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_directory_holds_config_model_metrics_and_checkpoints(tiny_run):
    for name in ("config.yaml", "tokenizer.json", "labels.json", "metrics.jsonl", "summary.json"):
        assert (tiny_run / name).is_file(), name
    for name in ("config.yaml", "model.safetensors", "tokenizer.json", "labels.json", "info.json"):
        assert (tiny_run / "best" / name).is_file(), name
    checkpoints = sorted(p.name for p in (tiny_run / "checkpoints").iterdir())
    assert checkpoints == ["step-0000015", "step-0000030"]  # two epochs of 15 steps, newest 2 kept
    records = _records(tiny_run)
    train_rec = [r for r in records if r["type"] == "train"]
    val_rec = [r for r in records if r["type"] == "validation"]
    assert [r["step"] for r in train_rec] == [5, 10, 15, 20, 25, 30]
    for key in ("lr", "loss/ner", "loss/sentiment", "weight/ner", "weight/sentiment", "grad_norm"):
        assert key in train_rec[0], key
    assert [r["step"] for r in val_rec] == [15, 30]
    for key in ("score", "ner/f1", "ner/f1_strict", "ner/precision", "ner/recall", "sentiment/accuracy"):
        assert key in val_rec[0], key
    summary = _summary(tiny_run)
    best = max(val_rec, key=lambda r: r["score"])
    assert summary["best_step"] == best["step"]
    assert summary["validation"]["sentiment"]["accuracy"] == best["sentiment/accuracy"]
    info = json.loads((tiny_run / "best" / "info.json").read_text())
    assert info["step"] == best["step"]


def test_training_lowers_both_task_losses(tiny_run):
    train_rec = [r for r in _records(tiny_run) if r["type"] == "train"]
    assert train_rec[-1]["loss/ner"] < 0.7 * train_rec[0]["loss/ner"]
    assert train_rec[-1]["loss/sentiment"] < train_rec[0]["loss/sentiment"]


def test_same_seed_gives_the_same_model_and_metrics(make_config, tmp_path, one_thread):
    overrides = ["training.max_steps=8", "training.eval_every=4", "model.dropout=0.1", "data.word_dropout=0.1"]
    first = train(make_config(tmp_path / "a", overrides))
    second = train(make_config(tmp_path / "b", overrides))
    assert first.best_metrics == second.best_metrics
    a, b = load_file(tmp_path / "a/best/model.safetensors"), load_file(tmp_path / "b/best/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = train(make_config(tmp_path / "c", [*overrides, "training.seed=1"]))
    c = load_file(tmp_path / "c/best/model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a) or other.best_step != first.best_step


def test_refuses_to_overwrite_an_existing_run(tiny_run, make_config):
    with pytest.raises(UserError, match="already holds a run"):
        train(make_config(tiny_run, ["training.max_steps=1"]))


def test_non_finite_loss_stops_naming_step_and_task(make_config, tmp_path):
    trainer = Trainer(make_config(tmp_path / "run", ["training.eval_every=2", "training.max_steps=10"]))
    trainer.setup()
    calls = {"n": 0}

    def poison(module, args, output):  # the third training forward returns a NaN loss for ner
        calls["n"] += module.training
        if module.training and calls["n"] == 3 and "ner" in output.losses:
            output.losses["ner"] = output.losses["ner"] * float("nan")
        return output

    trainer.model.register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteLoss, match=r"task 'ner' at step 3.*step-0000002"):
            trainer.train()
    finally:
        trainer.cleanup()
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step-0000002"


def test_bf16_autocast_run(make_config, tmp_path):
    result = train(make_config(tmp_path / "run", ["training.mixed_precision=bf16", "training.max_steps=6"]))
    assert result.steps == 6
    assert all(torch.isfinite(v).all() for v in load_file(tmp_path / "run/best/model.safetensors").values())


def _write_config(config, path: Path) -> Path:
    config.save(path)
    return path


def test_resume_after_sigkill_matches_an_uninterrupted_run(make_config, tmp_path, one_thread):
    overrides = ["training.epochs=8", "training.eval_every=10", "model.dropout=0.1", "data.word_dropout=0.1"]
    reference = train(make_config(tmp_path / "ref", overrides))

    config_path = _write_config(make_config(tmp_path / "killed", overrides), tmp_path / "killed.yaml")
    run_dir = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtl_decoder", "train", "--config", str(config_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while latest_checkpoint(run_dir / "checkpoints") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    first = latest_checkpoint(run_dir / "checkpoints")
    assert first is not None and int(first.name.split("-")[1]) < reference.steps

    resumed = train(make_config(run_dir, overrides), resume=True)
    assert resumed.steps == reference.steps
    assert resumed.best_step == reference.best_step
    assert resumed.best_metrics == reference.best_metrics
    a, b = load_file(tmp_path / "ref/best/model.safetensors"), load_file(run_dir / "best/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in _records(run_dir) if r["type"] == "validation"]
    assert steps == sorted(set(steps))  # the log reads like one run: nothing logged twice


def test_an_interrupted_save_never_becomes_latest(tiny_run, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(tiny_run / "checkpoints", root)
    partial = root / ".tmp-step-0000045"  # what a kill during save_state leaves
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half a file")
    assert latest_checkpoint(root).name == "step-0000030"
    incomplete = root / "step-0000040"  # a complete-looking name without the state file is ignored too
    incomplete.mkdir()
    assert latest_checkpoint(root).name == "step-0000030"
    assert (latest_checkpoint(root) / STATE_FILE).is_file()


@needs_torchrun
def test_two_process_data_parallel_run(make_config, tmp_path):
    config_path = _write_config(make_config(tmp_path / "ddp", ["training.epochs=1"]), tmp_path / "ddp.yaml")
    done = torchrun_cli("train", "--config", str(config_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cpu x 2 process(es)" in done.stdout + done.stderr
    summary = _summary(tmp_path / "ddp")
    assert summary["steps"] == 8  # 120 examples / (8 per batch x 2 processes), rounded up
    assert set(summary["validation"]) == {"ner", "sentiment"}
    assert summary["validation"]["ner"]["sentences"] == 20  # every validation example scored exactly once
    assert summary["validation"]["sentiment"]["support"] == 20


def test_time_budget_stops_with_a_validated_best_model(make_config, tmp_path):
    result = train(make_config(tmp_path / "run", ["training.max_minutes=1e-9", "training.epochs=50"]))
    assert result.stop_reason == "time_budget"
    assert result.steps == 1  # the budget is checked after every step
    assert result.best_step == 1 and (tmp_path / "run/best/model.safetensors").is_file()
    assert _summary(tmp_path / "run")["stop_reason"] == "time_budget"


def test_early_stopping_after_patience_validations_without_improvement(make_config, tmp_path):
    # lr 0: the first validation is the best there will be, the next two do not improve on it.
    overrides = ["training.lr=0", "training.eval_every=2", "training.patience=2", "training.epochs=20"]
    with pytest.raises(Exception, match="lr"):
        make_config(tmp_path / "bad", overrides)
    result = train(make_config(tmp_path / "run", ["training.lr=1e-9", *overrides[1:]]))
    assert result.stop_reason == "early_stopping" and result.stopped_early
    assert result.steps == 6 and result.best_step == 2
