"""Mode 'hybrid': a pretrained trunk's lower blocks cached, its top blocks trained.

Mode 'hybrid': the lower blocks of a pretrained trunk frozen and cached, the top blocks trained on the cache,
native PLE layers (if any) above (model/pretrained/hybrid.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.trunks.pretrained import PretrainedTrunk

if TYPE_CHECKING:
    from mtl_decoder.model.pretrained.frozen import FrozenStates


class HybridTrunk(PretrainedTrunk):
    """``HybridDecoder``: blocks 1..N-k cached, blocks N-k+1..N trained (top_mode upcycle or lora)."""

    name = "hybrid"

    def build(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None,
        expected_identity: dict[str, Any] | None,
    ) -> MultiTaskModel:
        base, identity = self.load_base(saved_trunk, expected_identity)
        return self.decoder_class()(self.cfg, specs, base, identity)

    def decoder_class(self) -> type[MultiTaskModel]:
        """The model class this way builds (mode echo_hybrid: the same over echo states)."""
        from mtl_decoder.model.pretrained.hybrid import HybridDecoder

        return HybridDecoder

    def cached_states(self) -> FrozenStates | None:
        return self.model.states

    def checkpoint_base(self) -> nn.Module:
        return self.model.states.base

    def checkpoint_config(self) -> Any:
        return self.model.trunk_config  # the whole trunk's, before the split

    @property
    def loads_strictly(self) -> bool:
        return self.cfg.trunk.top_mode != "lora"

    def state_to_save(self) -> dict[str, torch.Tensor]:
        """The weights a hybrid trunk saves.

        Everything trained (top_mode upcycle: every weight of the top blocks), or with top_mode lora only what
        trains (updates, gates, native layers, heads); the cached lower blocks are referenced by identity."""
        if self.loads_strictly:
            return self.model.state_dict()
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def describe(self) -> str:
        m, trunk = self.cfg, self.cfg.trunk
        return (
            f"hybrid {trunk.pretrained} ({trunk.layers or 'all'} blocks, the top {trunk.train_top} trained: "
            f"{trunk.top_mode}) + {m.n_layers} layers x d_model {m.d_model}"
        )

    def mode_line(self, identity: dict[str, Any]) -> str:
        m, trunk = self.cfg, self.cfg.trunk
        return (
            f"hybrid: its states at block {identity.get('layers', 0) - trunk.train_top} are computed once per "
            f"text; the top {trunk.train_top} blocks are trained on them ({trunk.top_mode}, PLE in their MLPs), "
            f"{m.n_layers} native `{m.ffn}` decoder layers above"
        )

    def export_base(self, model_dir: Path, expert: str | None) -> tuple[nn.Module, bool]:
        raise UserError(
            f"{model_dir}: export --trunk does not handle mode hybrid (its trunk is split: cached lower blocks, "
            "trained top blocks with experts); export a model trained in mode upcycle, lora or frozen"
        )
