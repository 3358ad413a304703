"""Mode 'echo_hybrid': mode hybrid whose cached lower blocks read every text twice (mode echo's reading).

Mode hybrid's trained top blocks see right context where ``top_attention`` is bidirectional, but the cached blocks
below them are causal: a word's state at block N-k has seen only the words before it. Here the lower blocks read
the text twice and the states of the second copy are cached (echo.py's ``echo_pass``), so every block, cached or
trained, reads the whole text. The top blocks take the second copy's states with positions 0..T-1, where the
trunk gave them T..2T-1: rotary attention depends only on the difference of two positions, so nothing changes for
Llama-style trunks. The cost is mode echo's: the cached blocks run over twice the tokens of every text not cached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from mtl_decoder.model.heads import MultiTaskModel
from mtl_decoder.model.pretrained.hub import BaseIdentity
from mtl_decoder.model.pretrained.hybrid import HybridDecoder
from mtl_decoder.model.pretrained.layermix import LayeredCache, LayerStates, block_caches, layered_cache
from mtl_decoder.model.trunks.echo import ECHO_SUFFIX, echo_pass
from mtl_decoder.model.trunks.hybrid import HybridTrunk


class EchoLayerStates(LayerStates):
    """``LayerStates`` of each text's second copy when the trunk reads it twice, cached in folders of their own."""

    def __init__(self, base: nn.Module, identity: BaseIdentity, cache: LayeredCache, blocks: list[int]):
        super().__init__(base, identity, cache, blocks)
        self.cache = self._rebuilt(cache.directory, write=cache.write, max_entries=cache.max_entries)

    def _rebuilt(self, root: Path | None, **options) -> LayeredCache:
        digests, tag = self.cache.digests, self.compute_tag + ECHO_SUFFIX  # echo states: other states of the same ids
        return block_caches(root, self.identity, self.blocks, self.dtype, digests, tag, **options)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return echo_pass(super().run, input_ids, attention_mask)


class EchoHybridDecoder(HybridDecoder):
    """``HybridDecoder`` over ``EchoLayerStates``."""

    def make_states(self, base: nn.Module, identity: BaseIdentity, start: int) -> LayerStates:
        trunk = self.cfg.trunk
        cache = layered_cache(base, identity, [start], trunk.dtype, trunk.cache_dir)
        return EchoLayerStates(base, identity, cache, [start])


class EchoHybridTrunk(HybridTrunk):
    """Mode hybrid with the cached blocks read as mode echo reads them."""

    name = "echo_hybrid"
    caches_states = True

    def decoder_class(self) -> type[MultiTaskModel]:
        return EchoHybridDecoder

    def describe(self) -> str:
        return "echo (the text twice, the second copy read) " + super().describe()

    def mode_line(self, identity: dict[str, Any]) -> str:
        return (
            super()
            .mode_line(identity)
            .replace("hybrid: its states", "echo_hybrid: each text given twice and its second copy's states")
        )
