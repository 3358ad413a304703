"""Tiny runs on a pretrained trunk, trained once per test session through the trainer (mtl_decoder.train's
Trainer) and shared by the test modules that need a trained trunk model (training, saving, export)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from helpers import tiny_config
from hf_testkit import tiny_checkpoint

from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model import MultiTaskModel
from mtl_decoder.training.trainer import Trainer

MODE_OVERRIDES = {
    "frozen": [],
    "lora": ["model.trunk.lora_attention=true"],  # the attention update too: the export merges it
    "upcycle": ["model.attention=causal"],  # the other runs are bidirectional (the tiny config's default)
    "hybrid": ["model.trunk.train_top=1"],  # the tiny checkpoint's block 1 cached, block 2 trained (upcycle)
}
STEPS = 4


@dataclass
class TrunkRun:
    run_dir: Path
    checkpoint: Path
    model: MultiTaskModel
    """The trained model as it was in memory when the run ended (the best one: the run validates once, at the end)."""
    encoder: TextEncoder
    label_sets: dict[str, list[str]]

    @property
    def best(self) -> Path:
        return self.run_dir / "best"


_RUNS: dict[tuple[Path, str], TrunkRun] = {}


def overrides(checkpoint: Path, root: Path, mode: str, *extra: str) -> list[str]:
    return [
        f"model.trunk.pretrained={checkpoint}",
        f"model.trunk.mode={mode}",
        f"model.trunk.cache_dir={root / 'state-cache'}",
        f"training.max_steps={STEPS}",
        f"training.eval_every={STEPS}",
        *MODE_OVERRIDES[mode],
        *extra,
    ]


def trained(root: Path, mode: str) -> TrunkRun:
    """The session's run in ``mode`` on a tiny Llama checkpoint under ``root`` (trained at the first call)."""
    key = (root, mode)
    if key not in _RUNS:
        checkpoint = root / "llama"
        if not (checkpoint / "config.json").is_file():
            tiny_checkpoint(checkpoint)
        trainer = Trainer(tiny_config(root / f"run-{mode}", overrides(checkpoint, root, mode)))
        try:
            trainer.setup()
            trainer.train()
            trainer.save()
            model = trainer.accelerator.unwrap_model(trainer.model).eval()
        finally:
            trainer.cleanup()
        _RUNS[key] = TrunkRun(root / f"run-{mode}", checkpoint, model, trainer.data.encoder, trainer.data.label_sets)
    return _RUNS[key]


def batch(encoder: TextEncoder, items: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask of ``items`` (word lists or texts)."""
    encoded = encoder.encode_batch(items)
    T = max(len(e.ids) for e in encoded)
    ids = torch.zeros(len(encoded), T, dtype=torch.long)
    mask = torch.zeros(len(encoded), T, dtype=torch.bool)
    for i, e in enumerate(encoded):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = True
    return ids, mask


def force_gates(model: MultiTaskModel, expert: str) -> None:
    """Every gate that can choose ``expert`` puts all its weight on it (the others are left at uniform weights and
    must not be read): the model then computes the path of that expert in every block."""
    for block in model.expert_blocks():
        if block is None:
            continue
        gates = dict(block.task_gates.items())
        if block.shared_gate is not None:
            gates[SHARED] = block.shared_gate
        for name, gate in gates.items():
            experts = block.expert_names(name, model.task_names)
            with torch.no_grad():
                gate.proj.weight.zero_()
                gate.proj.bias.zero_()
                if expert in experts:
                    gate.proj.bias[experts.index(expert)] = 1e4  # softmax: exactly 1.0 and 0.0 in float32
