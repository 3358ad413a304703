"""What a resume may change (mtl_decoder.training.resume) and what it checks first (checkpoints' manifests):
shape-changing and data keys are refused before anything is written, a new lr is honoured from the resumed step,
a damaged checkpoint is an error naming the file, and config.yaml changes only once the resume has restored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import mtl_decoder.training.trainer as trainer_module
from mtl_decoder.errors import UserError
from mtl_decoder.training import train
from mtl_decoder.training.checkpoints import STATE_FILE
from mtl_decoder.training.trainer import Trainer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _records(run: Path, kind: str) -> dict[int, dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if r["type"] == kind}


@pytest.fixture
def run(tiny_run, tmp_path) -> Path:
    """A copy of the session's tiny run (30 steps, checkpoints at 15 and 30) to resume and damage."""
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    return copy


@pytest.fixture
def no_data_reading(monkeypatch):
    def read_data(*args, **kwargs):
        raise AssertionError("the data was read before the resume was checked")

    monkeypatch.setattr(trainer_module, "read_data", read_data)


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.d_model=64", "model.d_model: 32 -> 64"),
        ("model.ffn=mmoe", "model.ffn: 'ple' -> 'mmoe'"),
        ("training.seed=3", "training.seed: 0 -> 3"),
        (f"tasks.ner.data.train={FIXTURES / 'ner_validation.jsonl'}", "tasks.ner.data.train: "),
    ],
)
def test_a_change_a_resume_cannot_make_is_refused_before_anything_is_written(
    make_config, run, no_data_reading, override, key
):
    before = _snapshot(run)
    with pytest.raises(UserError, match="keys a resume cannot change") as caught:
        train(make_config(run, ["training.epochs=3", override]), resume=True)
    assert key in str(caught.value) and "\n" not in str(caught.value)
    assert "training.epochs" not in str(caught.value)  # honoured, so not listed
    assert _snapshot(run) == before


def _dropout_rates(model: torch.nn.Module) -> set[float]:
    return {
        m.threshold / m.STEPS if hasattr(m, "threshold") else m.p
        for m in model.modules()
        if "Dropout" in type(m).__name__
    }


def test_a_new_lr_and_dropout_are_honoured_from_the_resumed_step(make_config, run, tiny_run):
    shutil.rmtree(run / "checkpoints" / "step-0000030")  # resume from step 15 of 30
    trainer = Trainer(make_config(run, ["training.lr=0.03", "model.dropout=0.25"]), resume=True)  # lr: 10x 3e-3
    try:
        trainer.setup()
        assert _dropout_rates(trainer.accelerator.unwrap_model(trainer.model)) == {0.25}  # the run had 0.0
        trainer.train()
        result = trainer.save()
    finally:
        trainer.cleanup()
    assert result.resumed_from == [15] and result.steps == 30
    old, new = _records(tiny_run, "train"), _records(run, "train")
    assert sorted(new) == [5, 10, 15, 20, 25, 30]
    for step in (5, 10, 15):  # before the resume: as logged then
        assert new[step]["lr"] == old[step]["lr"]
    for step in (20, 25):  # after: the same schedule around the new peak
        assert new[step]["lr"] == pytest.approx(10 * old[step]["lr"], rel=1e-9)
    stored = (run / "config.yaml").read_text(encoding="utf-8")
    assert "lr: 0.03" in stored and "dropout: 0.25" in stored  # written once the resume restored


@pytest.mark.parametrize(
    "damage, name",
    [
        (lambda p: p.write_bytes(b""), "random_states_0.pkl"),
        (lambda p: p.write_bytes(p.read_bytes()[:-10]), "optimizer.bin"),
        (lambda p: p.unlink(), "model.safetensors"),
    ],
)
def test_a_damaged_checkpoint_is_an_error_naming_the_file_before_the_data_is_read(
    make_config, run, no_data_reading, damage, name
):
    damage(run / "checkpoints" / "step-0000030" / name)
    before = _snapshot(run)
    with pytest.raises(UserError) as caught:
        train(make_config(run, ["training.epochs=3", "training.lr=0.03"]), resume=True)
    message = str(caught.value)
    assert message.startswith(str(run / "checkpoints" / "step-0000030" / name)) and "cannot resume" in message
    assert _snapshot(run) == before  # config.yaml still says the old lr: the resume never restored


def test_an_emptied_random_state_of_a_checkpoint_without_a_manifest_is_refused(make_config, run):
    checkpoint = run / "checkpoints" / "step-0000030"
    state = json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    del state["files"]  # as written before checkpoints listed their files
    (checkpoint / STATE_FILE).write_text(json.dumps(state), encoding="utf-8")
    (checkpoint / "random_states_0.pkl").write_bytes(b"")
    config_before = (run / "config.yaml").read_bytes()
    with pytest.raises(UserError, match=r"random_states_0\.pkl: missing or empty; cannot resume"):
        train(make_config(run, ["training.epochs=3", "training.lr=0.03"]), resume=True)
    assert (run / "config.yaml").read_bytes() == config_before


def test_a_key_added_since_the_run_began_resumes_at_its_default_and_is_refused_otherwise():
    """A run stored by a version without model.word_hash_dropout (or a trunk key) ran as their defaults: resuming it
    with them at their defaults changes nothing; set to anything else, the key is refused like any other."""
    from mtl_decoder.training.resume import changed_keys

    stored = {"model": {"d_model": 32}, "training": {"seed": 0}}
    same = {"model": {"d_model": 32, "word_hash_dropout": 0.0, "trunk": {"train_top": 2}}, "training": {"seed": 0}}
    assert changed_keys(stored, same) == {}
    other = {"model": {"d_model": 32, "word_hash_dropout": 0.5, "trunk": {"train_top": 4}}, "training": {"seed": 0}}
    assert changed_keys(stored, other) == {
        "model.word_hash_dropout": (None, 0.5),
        "model.trunk.train_top": (None, 4),
    }
    assert changed_keys(stored, {**same, "distill": {"alpha": 0.5}}) == {"distill.alpha": (None, 0.5)}  # no default
    # a distilled run stored before distill.sentence_state_weight existed: the key at its default changes nothing
    distilled = {**stored, "distill": {"teacher": "t/best", "state_weight": 1.0}}
    later = {**same, "distill": {"teacher": "t/best", "state_weight": 1.0, "sentence_state_weight": 0.0}}
    assert changed_keys(distilled, later) == {}
    assert changed_keys(distilled, {**later, "distill": {**later["distill"], "sentence_state_weight": 1.0}}) == {
        "distill.sentence_state_weight": (None, 1.0)
    }


def test_a_run_its_time_budget_stopped_goes_on_when_the_budget_is_raised(make_config, tmp_path, tiny_run):
    stopped = train(make_config(tmp_path / "run", ["training.max_minutes=1e-9"]))
    assert stopped.stop_reason == "time_budget" and stopped.steps == 1
    again = train(make_config(tmp_path / "run", ["training.max_minutes=1e-9"]), resume=True)
    assert again.stop_reason == "time_budget" and again.steps == 1  # the same budget: still spent, no step taken
    raised = train(make_config(tmp_path / "run", ["training.max_minutes=60"]), resume=True)
    unbroken = json.loads((tiny_run / "summary.json").read_text(encoding="utf-8"))  # the same config, no budget
    assert raised.stop_reason == "done" and raised.steps == unbroken["steps"] and raised.resumed_from[-1] == 1
