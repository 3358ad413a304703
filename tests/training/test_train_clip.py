"""Gradient clipping: ``training.max_grad_norm=0`` trains unclipped; metrics.jsonl tells how often the clip binds."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from mtl_decoder.training import train

STEPS = ["training.max_steps=10", "training.log_every=5", "training.eval_every=10"]


def _run(make_config, folder: Path, clip: float) -> tuple[list[dict], dict[str, torch.Tensor]]:
    train(make_config(folder, [*STEPS, f"training.max_grad_norm={clip}"]))
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "train"], load_file(folder / "best" / "model.safetensors")


def test_clip_off_trains_as_an_unreachable_clip_and_still_logs_the_norm(make_config, tmp_path):
    off, off_weights = _run(make_config, tmp_path / "off", 0)
    far, far_weights = _run(make_config, tmp_path / "far", 1e9)
    tight, tight_weights = _run(make_config, tmp_path / "tight", 1e-4)
    assert [r["step"] for r in off] == [5, 10]
    # the norm before clipping is logged with the clip off, and no step counts as clipped
    assert all(r["grad_norm"] > 1e-4 and r["clipped_share"] == 0.0 for r in off)
    assert [r["grad_norm"] for r in off] == [r["grad_norm"] for r in far]
    assert off_weights.keys() == far_weights.keys()
    assert all(torch.equal(off_weights[k], far_weights[k]) for k in off_weights)
    # a clip below every step's norm binds at every step, and changes what is learned
    assert all(r["clipped_share"] == 1.0 for r in tight)
    assert any(not torch.equal(off_weights[k], tight_weights[k]) for k in off_weights)
