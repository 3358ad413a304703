"""Modes 'upcycle' and 'lora': a pretrained transformers base model is the trunk, PLE in every block.

Every row of the batch (one per example and route) runs through the library's own forward pass (embeddings,
attention through its SDPA path, norms); each block's MLP is a ``RoutedMLP`` (adapters.py). With
``model.attention: bidirectional`` the causal mask is lifted (``is_causal=False``, padding still masked).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mtl_decoder.config import ModelConfig, TrunkConfig
from mtl_decoder.model.experts import ExpertBlock, Gate, RouteLayout
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec, init_head
from mtl_decoder.model.pretrained.adapters import (
    add_lora_to_linears,
    checkpoint_contexts,
    install_expert_blocks,
    routing,
)
from mtl_decoder.model.pretrained.hub import BaseIdentity, decoder_layers


class PretrainedDecoder(MultiTaskModel):
    """A transformers base model as the trunk, PLE in every block: trained copies of each MLP (``lora`` False:
    mode upcycle) or the frozen MLP plus low-rank updates (``lora``)."""

    def __init__(
        self, cfg: ModelConfig, tasks: list[TaskHeadSpec], base: nn.Module, identity: BaseIdentity, lora: bool
    ):
        super().__init__(cfg, tasks, identity.hidden_size)
        self.identity = identity
        self.trunk = base
        self._blocks = install_expert_blocks(base, cfg, self.task_names, mode="lora" if lora else "upcycle")
        self.final_norm = nn.Identity()  # the trunk's own final norm already ran
        for head in self.heads.values():
            init_head(head)
        if lora:
            freeze_all_but_updates(base, cfg.trunk)
        if cfg.trunk.gradient_checkpointing:
            enable_gradient_checkpointing(base)

    def expert_blocks(self) -> list[ExpertBlock | None]:
        return list(self._blocks)

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: RouteLayout, features: dict[str, Any]
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        rows = layout.row_example
        with routing(layout) as state:
            out = self.trunk(
                input_ids=input_ids[rows],
                attention_mask=attention_mask[rows].long(),
                is_causal=self.cfg.attention == "causal",
                use_cache=False,
            )
        gates = state.gates or [{} for _ in self._blocks]  # hard sharing with upcycle: the blocks' own MLPs
        return out.last_hidden_state.float(), gates  # (N, T, C)


def freeze_all_but_updates(trunk: nn.Module, trunk_cfg: TrunkConfig) -> None:
    """Freeze the pretrained weights, leaving LoRA matrices and gates to train.

    Mode lora (and hybrid's top blocks with top_mode lora): the pretrained weights of ``trunk`` frozen, its LoRA
    matrices (with ``lora_attention`` also on each block's attention projections) and gates train."""
    from peft.tuners.lora.layer import LoraLayer

    if trunk_cfg.lora_attention:
        for layer in decoder_layers(trunk):
            attention = getattr(layer, "self_attn", None) or getattr(layer, "attn", None)
            if attention is not None:
                add_lora_to_linears(attention, trunk_cfg, "attention")
    trunk.requires_grad_(False)
    for module in trunk.modules():
        if isinstance(module, LoraLayer):
            for part in (module.lora_A, module.lora_B):
                part.requires_grad_(True)
        elif isinstance(module, Gate):
            module.requires_grad_(True)


def enable_gradient_checkpointing(base: nn.Module) -> None:
    """Recompute each block of ``base`` in the backward pass, with the forward pass's route layout (adapters)."""
    kwargs = {"use_reentrant": False, "context_fn": checkpoint_contexts}
    # transformers 5 renamed it (the old name warns); both take the checkpoint's kwargs first
    enable = getattr(base, "activation_checkpointing_enable", None) or base.gradient_checkpointing_enable
    enable(kwargs)
