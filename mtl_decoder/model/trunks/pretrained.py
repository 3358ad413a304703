"""What every trunk read from a pretrained checkpoint shares.

Loading it (checked against a saved model's
identity), its identity, the files it adds to a model folder (trunk.json, trunk/) and its model-card lines."""

from __future__ import annotations

import dataclasses
import re
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_json, atomic_write_safetensors
from mtl_decoder.model.trunks.base import Trunk

if TYPE_CHECKING:
    from mtl_decoder.model.pretrained.hub import BaseIdentity

TRUNK_FILE = "trunk.json"
"""A model folder's record of its pretrained trunk: where it came from and the hash of its weights."""
TRUNK_DIR = "trunk"
"""A model folder's trunk/: the checkpoint's config.json, and with model.trunk.save=full its weights."""


class PretrainedTrunk(Trunk):
    """A trunk read from ``model.trunk.pretrained`` (a hub id, a folder or a .gguf file)."""

    pretrained = True
    weights_in_model_file: ClassVar[bool] = False
    """Whether the model's weights file holds every trunk weight (a saved folder then needs only its config)."""

    def load_base(
        self, saved_trunk: Path | None, expected_identity: dict[str, Any] | None
    ) -> tuple[nn.Module, BaseIdentity]:
        """Load a trunk's base model and its identity.

        The base model and its identity: from ``model.trunk.pretrained``, or for a saved model from its trunk/
        folder when that holds the weights (or when the weights file holds them all: only the architecture is
        read); ``expected_identity`` (the saved trunk.json) must match the weights loaded."""
        from mtl_decoder.model.pretrained.hub import base_from_config, load_base

        trunk = self.cfg.trunk
        if saved_trunk is not None and self.weights_in_model_file and expected_identity is not None:
            base, identity = base_from_config(saved_trunk, expected_identity, trunk.dtype)
        else:
            if saved_trunk is not None and any(saved_trunk.glob("*.safetensors")):
                trunk = dataclasses.replace(trunk, pretrained=str(saved_trunk), revision=None)
            base, identity = load_base(trunk)
        if expected_identity is not None and expected_identity.get("sha256") != identity.sha256:
            raise UserError(
                f"model.trunk.pretrained '{trunk.pretrained}' is not the trunk this model was trained on (weights hash "
                f"{identity.sha256[:12]}..., expected {str(expected_identity.get('sha256'))[:12]}... from "
                f"{expected_identity.get('source')})"
            )
        return base, identity

    def identity(self) -> BaseIdentity | None:
        return self.model.identity

    @abstractmethod
    def checkpoint_base(self) -> nn.Module:
        """The transformers base model whose frozen pretrained weights trunk/ holds (model.trunk.save=full)."""

    def checkpoint_config(self) -> Any:
        """The transformers config trunk/config.json holds (the whole trunk's)."""
        return self.checkpoint_base().config

    def save_files(self, directory: Path) -> None:
        identity = self.identity()
        assert identity is not None
        atomic_write_json(directory / TRUNK_FILE, identity.to_dict())
        folder = directory / TRUNK_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.checkpoint_config().save_pretrained(str(folder))
        if self.cfg.trunk.save == "full" and not self.weights_in_model_file:
            weights = base_weights(self.checkpoint_base())
            state = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
            atomic_write_safetensors(folder / "model.safetensors", state, metadata={"format": "pt"})

    def describe(self) -> str:
        trunk = self.cfg.trunk
        return f"{trunk.mode} {trunk.pretrained} ({trunk.layers or 'all'} blocks)"

    @abstractmethod
    def mode_line(self, identity: dict[str, Any]) -> str:
        """The model card's line on how the trunk is read and trained ('frozen: its states at block ...')."""

    def card_lines(self, config: ExperimentConfig, identity: dict[str, Any] | None, trained: str) -> list[str]:
        identity = identity or {}
        revision = f" (revision {identity['revision']})" if identity.get("revision") else ""
        stored = (
            "the folder holds every trunk weight"
            if self.weights_in_model_file or self.cfg.trunk.save == "full"
            else f"the folder refers to `{identity.get('source')}` by path or id: loading needs it, and checks its hash"
        )
        return [
            f"- pretrained trunk: `{identity.get('source')}`{revision}, architecture {identity.get('architecture')}, "
            f"first {identity.get('layers')} blocks, hidden size {identity.get('hidden_size')}",
            f"- weights sha256 (the blocks kept, float32): `{identity.get('sha256')}`",
            f"- mode {self.mode_line(identity)}",
            f"- stored: {stored}",
            f"- the checkpoint's own tokenizer; attention {self.cfg.attention}{trained}",
        ]


def base_weights(base: nn.Module) -> dict[str, torch.Tensor]:
    """The frozen pretrained weights under their original parameter names.

    The frozen pretrained weights of a trunk under its original parameter names: in mode lora every expert
    of a block wraps the same frozen MLP, so the first shared expert's ``base_layer``s are that MLP's weights."""
    out = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = re.sub(r"\.mlp\.block\.shared\.experts\.0\.", ".mlp.", name)
        name = re.sub(r"\.mlp\.expert\.", ".mlp.", name)
        if ".mlp.block." in name:  # the other experts (the same frozen weights again) and the gates
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out
