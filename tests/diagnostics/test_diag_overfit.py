"""``overfit`` on the tiny fixtures: a healthy model fits one batch and its saved copy agrees; too few steps, a
save that loses a weight, and a task whose labels never reach the loss each fail, naming what failed."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from helpers import TINY, tiny_config, tiny_tasks

from mtl_decoder.cli import main
from mtl_decoder.diagnostics import overfit as overfit_module
from mtl_decoder.diagnostics.overfit import overfit
from mtl_decoder.model import MTLDecoder


def test_a_healthy_model_fits_one_batch_and_its_saved_copy_agrees(tmp_path):
    result = overfit(tiny_config(tmp_path), steps=150)
    assert result.passed, result.summary_lines()
    assert result.failure is None and [ok for _, ok in result.checks] == [True] * 3
    assert result.fit_examples is not None and result.fit_examples >= 6
    assert result.examples == {"ner": 4, "sentiment": 4}
    assert all(loss["final"] < result.threshold < loss["first"] for loss in result.losses.values())
    assert result.steps < 150 and result.summary_lines()[-1].startswith("passed")


def test_too_few_steps_names_the_task_that_did_not_fit(tmp_path):
    result = overfit(tiny_config(tmp_path), steps=2)
    assert not result.passed
    assert result.failure.startswith("task 'ner' loss") and "after 2 steps" in result.failure
    assert result.checks == [("every task has a finite loss", True), (f"every task's loss below {0.05}", False)]


def test_a_save_that_loses_a_weight_is_caught(tmp_path, monkeypatch):
    real_save = overfit_module.save_model

    def lossy_save(directory, model, *args, **kwargs):
        with torch.no_grad():
            kept = model.heads["sentiment"].bias.clone()
            model.heads["sentiment"].bias.zero_()  # as if the bias were not written
            model.heads["sentiment"].bias[0] = 3.0
            try:
                return real_save(directory, model, *args, **kwargs)
            finally:
                model.heads["sentiment"].bias.copy_(kept)

    monkeypatch.setattr(overfit_module, "save_model", lossy_save)
    result = overfit(tiny_config(tmp_path))
    assert not result.passed and result.checks[-1] == ("the saved model reproduces the predictions", False)
    assert result.failure.startswith("the saved model") and "sentiment" in result.failure


def test_labels_that_never_reach_the_loss(tmp_path, monkeypatch):
    owner = next(c for c in MTLDecoder.__mro__ if "_task_loss" in c.__dict__)
    real_loss = owner._task_loss

    def drop_sentiment(self, name, *args, **kwargs):
        return None if name == "sentiment" else real_loss(self, name, *args, **kwargs)

    monkeypatch.setattr(owner, "_task_loss", drop_sentiment)
    result = overfit(tiny_config(tmp_path))
    assert result.failure == "task 'sentiment' has no loss: its labels do not reach the model"
    assert result.checks == [("every task has a finite loss", False)]


def test_cli_exit_status(tmp_path: Path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({**TINY, "tasks": tiny_tasks()}), encoding="utf-8")
    assert main(["overfit", "--config", str(config)]) == 0
    assert "passed: every task below 0.05" in capsys.readouterr().out
    assert main(["overfit", "--config", str(config), "--steps", "1"]) == 1
    assert "failed: task 'ner' loss" in capsys.readouterr().out
    assert main(["overfit", "--config", str(config), "--steps", "0"]) == 2
