"""Mode 'frozen' reading several blocks (``model.trunk.read_layers``).

Mode 'frozen' with ``model.trunk.read_layers``: native PLE layers over a learned mix of several blocks' cached
states (model/pretrained/layermix.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.trunks.frozen import FrozenTrunk


class LayerMixTrunk(FrozenTrunk):
    """``LayerMixDecoder``: each read block cached on its own, mixed per route (scalar mix) or concatenated."""

    name = "layer_mix"

    def build(
        self,
        specs: list[TaskHeadSpec],
        encoder: TextEncoder,
        saved_trunk: Path | None,
        expected_identity: dict[str, Any] | None,
    ) -> MultiTaskModel:
        from mtl_decoder.model.pretrained.layermix import LayerMixDecoder, LayerStates, layered_cache

        base, identity = self.load_base(saved_trunk, expected_identity)
        trunk = self.cfg.trunk
        blocks = list(trunk.read_layers or [])
        cache = layered_cache(base, identity, blocks, trunk.dtype, trunk.cache_dir)
        return LayerMixDecoder(self.cfg, specs, identity, LayerStates(base, identity, cache, blocks))

    def read_blocks(self, identity: dict[str, Any]) -> str:
        trunk = self.cfg.trunk
        *lower, last = [str(b) for b in trunk.read_layers or []]
        return f"{', '.join(lower)} and {last} (a learned {trunk.layer_mix})"
