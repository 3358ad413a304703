"""Trainer.setup's process-wide side effects: per-process random streams, and glibc's allocator only on request."""

from __future__ import annotations

import types

import accelerate.utils.random
import pytest
import torch

import mtl_decoder.training.trainer as trainer_module
from mtl_decoder.training.trainer import Trainer


def _setup(config) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The initial weights and torch's RNG state right after setup (what dropout will draw from)."""
    trainer = Trainer(config)
    try:
        trainer.setup()
        weights = {
            k: v.detach().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()
        }
        return weights, torch.get_rng_state()
    finally:
        trainer.cleanup()


def test_processes_share_initial_weights_but_not_dropout(make_config, tmp_path, monkeypatch):
    """Rank 1 of a two-process run, simulated: Accelerate's set_seed(device_specific=True) adds the process
    index. The model must be built from the common seed (the same weights on every process) and dropout must then
    draw from a stream of its own (the old code seeded every process alike, so all dropped the same units)."""
    first_weights, first_rng = _setup(make_config(tmp_path / "rank0", ["model.dropout=0.1"]))
    monkeypatch.setattr(accelerate.utils.random, "AcceleratorState", lambda: types.SimpleNamespace(process_index=1))
    other_weights, other_rng = _setup(make_config(tmp_path / "rank1", ["model.dropout=0.1"]))
    assert first_weights.keys() == other_weights.keys()
    assert all(torch.equal(first_weights[k], other_weights[k]) for k in first_weights)
    assert not torch.equal(first_rng, other_rng)
    torch.manual_seed(0)
    expected = torch.get_rng_state()  # rank 1 with seed 0 would be seeded 1; rank 0 draws from seed 0
    assert torch.equal(first_rng, expected) and not torch.equal(other_rng, expected)


@pytest.mark.parametrize("keep", [False, True])
def test_allocator_setting_only_when_asked(make_config, tmp_path, monkeypatch, keep):
    """glibc's mallopt changes the whole process (a library user's too): training.keep_freed_memory, default
    off, decides it (the old trainer called it on every run)."""
    calls = []
    monkeypatch.setattr(trainer_module, "keep_freed_memory", lambda: calls.append(1) or True)
    overrides = ["training.keep_freed_memory=true"] if keep else []
    _setup(make_config(tmp_path / "run", overrides))
    assert calls == ([1] if keep else [])


def test_a_test_label_unseen_in_train_stops_the_run_before_training(tmp_path):
    """Issue 38 case 12: docs/tasks-and-data.md lists it among what is refused before training; it used to stop only
    `evaluate --split test`, after the whole run. Named by file, line and field; no run folder is left."""
    import json

    from helpers import FIXTURES, tiny_config, tiny_tasks

    from mtl_decoder.errors import DataError
    from mtl_decoder.training import train

    rows = [json.loads(line) for line in (FIXTURES / "sentiment_test.jsonl").read_text(encoding="utf-8").splitlines()]
    rows[3]["label"] = "neutral"
    test = tmp_path / "sentiment_test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tasks = tiny_tasks()
    tasks[1]["data"]["test"] = str(test)
    with pytest.raises(DataError) as info:
        train(tiny_config(tmp_path / "run", tasks=tasks))
    assert (info.value.path, info.value.line, info.value.field) == (str(test), 4, "label")
    assert "label 'neutral' is not in the train label set" in info.value.reason
    assert not (tmp_path / "run").exists()


def test_a_task_without_a_test_split_still_trains_its_setup(tmp_path):
    """Checking test labels reads only the tasks that name a test file."""
    from helpers import tiny_config, tiny_tasks

    from mtl_decoder.training.setup import read_data

    tasks = tiny_tasks()
    tasks[1]["data"].pop("test")
    train_sources, validation, labels = read_data(tiny_config(tmp_path / "run", tasks=tasks))
    assert set(labels) == {"ner", "sentiment"} and len(train_sources) == len(validation) == 2


def test_a_task_sampling_weight_sets_its_share_of_every_batch(make_config, tmp_path):
    """tasks.NAME.sampling_weight reaches the trainer's sampler: round_robin at ner 3 : sentiment 1 gives ner three
    of every four slots of a batch of 8 (6 and 2), counted on the examples the loader draws."""
    trainer = Trainer(
        make_config(tmp_path / "run", ["data.sampling=round_robin", "tasks.ner.sampling_weight=3", "model.dropout=0"])
    )
    try:
        trainer.setup()
        sizes = trainer.data.dataset.source_sizes
        assert trainer.data.dataset.source_weights == [3.0, 1.0]
        trainer.sampler.set_epoch(0)
        for batch in trainer.sampler:
            ner = sum(index < sizes[0] for index in batch)
            assert (ner, len(batch) - ner) == (6, 2)
    finally:
        trainer.cleanup()
