"""Mode 'lora': a frozen pretrained trunk with a low-rank update per expert.

Mode 'lora': a pretrained trunk frozen, each expert its MLP plus its own low-rank update
(model/pretrained/finetuned.py)."""

from __future__ import annotations

from typing import Any

import torch

from mtl_decoder.model.trunks.upcycle import UpcycleTrunk


class LoraTrunk(UpcycleTrunk):
    """``PretrainedDecoder`` with LoRA experts: only the updates, gates and heads are trained and saved."""

    name = "lora"
    weights_in_model_file = False
    lora = True
    export_summary = "the pretrained weights with the low-rank updates of one expert merged in"

    @property
    def loads_strictly(self) -> bool:
        return False

    def state_to_save(self) -> dict[str, torch.Tensor]:
        """Only what trains (updates, gates, heads): the base is referenced by identity (or saved in trunk/)."""
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def mode_line(self, identity: dict[str, Any]) -> str:
        trunk = self.cfg.trunk
        attention = ", and one update on the attention" if trunk.lora_attention else ""
        rank = trunk.lora_rank
        own = f"each expert the pretrained MLP plus its own rank-{rank} update"
        return f"lora: the pretrained weights frozen, {own}{attention}"
