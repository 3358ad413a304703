"""Mode 'frozen': native PLE layers over the cached states of a frozen pretrained trunk's last kept block."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.trunks.pretrained import PretrainedTrunk

if TYPE_CHECKING:
    from mtl_decoder.model.pretrained.frozen import FrozenStates
    from mtl_decoder.model.pretrained.state_cache import StateCache


class FrozenTrunk(PretrainedTrunk):
    """``FrozenDecoder``: the trunk never trained, its states computed once per text and cached on disk."""

    name = "frozen"
    export_summary = "the pretrained blocks, unchanged"

    def build(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None,
        expected_identity: dict[str, Any] | None,
    ) -> MultiTaskModel:
        from mtl_decoder.model.pretrained.frozen import FrozenDecoder
        from mtl_decoder.model.pretrained.state_cache import cache_for

        base, identity = self.load_base(saved_trunk, expected_identity)
        trunk = self.cfg.trunk
        states = self.make_states(base, identity, cache_for(identity, trunk.dtype, trunk.cache_dir, base.config))
        return FrozenDecoder(self.cfg, specs, identity, states)

    def make_states(self, base: nn.Module, identity: Any, cache: StateCache) -> FrozenStates:
        """What computes and caches the trunk's states (mode echo reads every text twice)."""
        from mtl_decoder.model.pretrained.frozen import FrozenStates

        return FrozenStates(base, identity, cache)

    def cached_states(self) -> FrozenStates | None:
        return self.model.states

    def checkpoint_base(self) -> nn.Module:
        return self.model.states.base

    def describe(self) -> str:
        m, trunk = self.cfg, self.cfg.trunk
        return f"frozen {trunk.pretrained} ({trunk.layers or 'all'} blocks) + {m.n_layers} layers x d_model {m.d_model}"

    def read_blocks(self, identity: dict[str, Any]) -> str:
        """The blocks the states are read at, for the model card."""
        return str(identity.get("layers"))

    def mode_line(self, identity: dict[str, Any]) -> str:
        m = self.cfg
        return (
            f"frozen: its states at block {self.read_blocks(identity)} are computed once per text; {m.n_layers} "
            f"native `{m.ffn}` decoder layers (d_model {m.d_model}) are trained on top"
        )

    def export_base(self, model_dir: Path, expert: str | None) -> tuple[nn.Module, bool]:
        if expert is not None:
            raise UserError(
                f"--expert {expert}: in mode frozen the trunk holds no experts (the PLE layers are on top of it, "
                "and the export is the pretrained trunk unchanged); leave --expert out"
            )
        return self.model.states.base, False
