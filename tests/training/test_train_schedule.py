"""The learning-rate schedule: by steps, and by the elapsed fraction of training.max_minutes when that is ahead."""

from __future__ import annotations

import itertools
import types

import pytest

import mtl_decoder.training.loop as loop_module
from mtl_decoder.config import TrainingConfig
from mtl_decoder.training.setup import HELD_STEPS, group_schedules, lr_lambda
from mtl_decoder.training.trainer import Trainer


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedule_follows_the_larger_of_step_and_time_fractions(schedule):
    cfg = TrainingConfig(schedule=schedule, warmup_ratio=0.1)
    by_steps = lr_lambda(cfg, 100)
    spent = {"fraction": 0.0}
    by_both = lr_lambda(cfg, 100, lambda: spent["fraction"])
    assert [by_both(s) for s in range(100)] == [by_steps(s) for s in range(100)]  # the clock behind: no change
    assert by_steps(5) == pytest.approx(0.6) and by_steps(100) == pytest.approx(0.0)
    spent["fraction"] = 0.5
    assert by_both(10) == pytest.approx(by_steps(50))  # the clock ahead: the schedule of step 50
    assert by_both(80) == pytest.approx(by_steps(80))  # the steps ahead again
    spent["fraction"] = 1.3  # past the cap (the last step's rate): fully decayed, never beyond
    assert by_both(20) == pytest.approx(0.0, abs=1e-12)
    spent["fraction"] = 0.05  # within warm-up by the clock: warm-up continues from the later point
    assert by_both(1) == pytest.approx(by_steps(5))


def test_a_run_stopped_by_the_time_cap_ends_cooled_down(make_config, tmp_path, monkeypatch):
    """A fake clock that advances one second per reading: the 20-second cap stops a 200-step run after ~10
    steps; the rate there must have decayed as at the end of the run (the step schedule alone would still be
    near its peak)."""
    clock = itertools.count(0.0, 1.0)
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    cfg = make_config(
        tmp_path / "run",
        ["training.max_steps=200", f"training.max_minutes={20 / 60}", "training.warmup_ratio=0.02"],
    )
    trainer = Trainer(cfg)
    try:
        trainer.setup()
        trainer.train()
        result = trainer.save()
        lr = trainer.scheduler.get_last_lr()[0]
    finally:
        trainer.cleanup()
    assert result.stop_reason == "time_budget" and 5 <= result.steps < 30
    assert lr < 0.01 * cfg.training.lr
    assert lr_lambda(cfg.training, 200)(result.steps) > 0.9  # what the step schedule alone would give


@pytest.mark.parametrize("epochs", [1, 8, 16, 20, 21, 40, 100, 333])
def test_epoch_validations_are_at_most_twenty_and_end_the_run(epochs):
    """training.eval_every 0 (issue 38 case 18): every epoch while a run has at most 20, else every k-th (k the
    smallest that keeps them to 20 or fewer, counted by brute force here), and always the last epoch."""
    validated = [e for e in range(1, epochs + 1) if loop_module.epoch_ends_in_validation(e, epochs)]
    k = next(k for k in itertools.count(1) if len({*range(k, epochs + 1, k), epochs}) <= 20)
    assert validated[-1] == epochs and len(validated) <= 20
    assert validated[:-1] == [e for e in range(k, epochs, k)]
    if epochs <= 20:
        assert validated == list(range(1, epochs + 1))


def test_tiny_epochs_do_not_validate_every_few_steps(make_config, tmp_path, monkeypatch):
    """Tiny epochs (batches of 64 over the 60-example fixtures) and eval_every 0: a run of 40 epochs validates at
    every second epoch's end, not at each."""
    steps: list[int] = []
    cfg = make_config(tmp_path / "run", ["training.epochs=40", "data.batch_size=64", "training.eval_every=0"])
    trainer = Trainer(cfg)
    monkeypatch.setattr(trainer, "_validate_and_checkpoint", lambda: steps.append(trainer.state.step))
    try:
        trainer.setup()
        trainer.train()
    finally:
        trainer.cleanup()
    per_epoch = trainer.steps_per_epoch
    assert trainer.epochs == 40 and trainer.state.step == 40 * per_epoch
    assert steps == [per_epoch * e for e in range(2, 41, 2)]


def test_a_held_group_stays_exactly_as_it_was_then_follows_the_schedule():
    """A parameter held for 2 steps (a distilled student's inherited table, model.lexicon.freeze_steps) keeps every
    bit through AdamW's steps, weight decay included, while the others train; from step 3 it trains too. Without
    held parameters the groups and the schedule are what they were."""
    import torch

    held, free = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4, 3))
    groups = [{"params": [free], "weight_decay": 0.1}, {"params": [held], "weight_decay": 0.1, HELD_STEPS: 2}]
    optimizer = torch.optim.AdamW(groups, lr=0.1)
    factor = lr_lambda(TrainingConfig(warmup_ratio=0.0), 10)
    schedules = group_schedules(groups, factor)
    assert schedules[0] is factor
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedules)
    start_held, start_free = held.detach().clone(), free.detach().clone()
    for step in range(3):
        (held.sum() + free.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        assert torch.equal(held, start_held) == (step < 2)
        assert not torch.equal(free, start_free)
    assert group_schedules([{"params": []}, {"params": []}], factor) == [factor, factor]
