"""Model directories: the resolved config, ``model.safetensors``, the tokenizer and the label sets.

Writing goes to a temporary directory that is renamed into place, so a crash never leaves a half-written
model; loading reads YAML, JSON and safetensors only (nothing is unpickled).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file, save_file

from mtl_decoder.config import ExperimentConfig, config_from_dict
from mtl_decoder.errors import UserError
from mtl_decoder.inference import Predictor
from mtl_decoder.model import MTLDecoder, TaskHeadSpec
from mtl_decoder.tokenization import TextEncoder

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
LABELS_FILE = "labels.json"


def build_model(config: ExperimentConfig, label_sets: dict[str, list[str]], encoder: TextEncoder) -> MTLDecoder:
    specs = [TaskHeadSpec(name, task.kind, tuple(label_sets[name])) for name, task in config.tasks.items()]
    return MTLDecoder(config.model, specs, vocab_size=encoder.vocab_size, pad_id=encoder.pad_id)


@dataclass
class Pretrained:
    """Everything a saved model directory holds, ready to predict."""

    model: MTLDecoder
    encoder: TextEncoder
    config: ExperimentConfig
    label_sets: dict[str, list[str]]
    directory: Path

    def predictor(
        self, batch_size: int | None = None, precision: str = "fp32", workers: int | None = None
    ) -> Predictor:
        """A Predictor for this model; batch_size defaults to the run's data.eval_batch_size."""
        batch_size = batch_size or self.config.data.eval_batch_size
        return Predictor(self.model, self.encoder, self.label_sets, batch_size, precision=precision, workers=workers)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a fully written ``tmp`` directory to ``final``, replacing any old one without a gap of garbage."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def save_pretrained(
    directory: str | Path,
    model: MTLDecoder,
    encoder: TextEncoder,
    config: ExperimentConfig,
    label_sets: dict[str, list[str]],
    extra: dict[str, Any] | None = None,
) -> Path:
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    config.save(tmp / CONFIG_FILE)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    encoder.save(tmp)
    (tmp / LABELS_FILE).write_text(json.dumps(label_sets, indent=2), encoding="utf-8")
    if extra:
        (tmp / "info.json").write_text(json.dumps(extra, indent=2), encoding="utf-8")
    replace_dir(tmp, directory)
    return directory


def default_device() -> torch.device:
    """The machine's accelerator (CUDA, XPU, MPS, ...) when it has one, else the CPU."""
    found = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    return found if found is not None else torch.device("cpu")


def load_pretrained(directory: str | Path, device: torch.device | str | None = None) -> Pretrained:
    """A saved model directory, ready to predict, on ``device`` (default: the machine's accelerator, if any)."""
    directory = Path(directory)
    for name in (CONFIG_FILE, WEIGHTS_FILE, LABELS_FILE):
        if not (directory / name).is_file():
            raise UserError(f"{directory}: not a model directory (missing {name})")
    config = config_from_dict(yaml.safe_load((directory / CONFIG_FILE).read_text(encoding="utf-8")))
    label_sets = json.loads((directory / LABELS_FILE).read_text(encoding="utf-8"))
    encoder = TextEncoder.load(directory, config.data.max_length)
    model = build_model(config, label_sets, encoder)
    state = load_file(str(directory / WEIGHTS_FILE))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserError(
            f"{directory / WEIGHTS_FILE}: weights do not match the config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.eval()
    model.to(device if device is not None else default_device())
    return Pretrained(model, encoder, config, label_sets, directory)
