"""Mode 'echo': mode frozen's native PLE layers over a causal trunk that reads every text twice.

A causal trunk's state at a token has seen only the tokens before it. Given the text twice and read on the second
copy ("echo embeddings", Springer et al., 2024), every token's state has seen the whole text once, right context
included, with the trunk unchanged. The cost: the trunk runs over twice the tokens (at prediction, on every text
whose states are not cached yet). The states are cached as mode frozen's, in a folder of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mtl_decoder.model.pretrained.frozen import FrozenStates
from mtl_decoder.model.pretrained.state_cache import StateCache
from mtl_decoder.model.trunks.frozen import FrozenTrunk

ECHO_SUFFIX = "-echo"
"""Appended to mode frozen's cache folder name: echo states of a trunk are other states of the same token ids."""


class EchoStates(FrozenStates):
    """(B, T) ids -> (B, T, H) states of each row's second copy when the trunk reads ``ids[:n] ids[:n]``."""

    def __init__(self, base: torch.nn.Module, identity: Any, cache: StateCache):
        super().__init__(base, identity, cache)
        if cache.directory is not None:
            self.cache = StateCache(self.folder(cache.directory.parent), cache.flush_every, write=cache.write)

    def folder(self, root: Path) -> Path:
        frozen = super().folder(root)
        return frozen.with_name(frozen.name + ECHO_SUFFIX)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return echo_pass(super().run, input_ids, attention_mask)


def echo_pass(run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], input_ids: torch.Tensor,
              attention_mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``run`` (a causal trunk's pass: (B, T') ids, mask -> (B, T', H)) over each text given twice; (B, T, H) states
    of the second copies, padding rows zero. The one place a text is echoed (modes echo and echo_hybrid)."""
    lengths = attention_mask.sum(1).tolist()
    B, T = input_ids.shape
    twice = input_ids.new_zeros(B, 2 * max(lengths))  # (B, 2T'): each row's n tokens, then the same n again
    mask = attention_mask.new_zeros(B, twice.shape[1])
    for i, n in enumerate(lengths):
        twice[i, :n] = twice[i, n : 2 * n] = input_ids[i, :n]
        mask[i, : 2 * n] = True
    states = run(twice, mask)  # (B, 2T', H)
    out = states.new_zeros(B, T, states.shape[-1])
    for i, n in enumerate(lengths):
        out[i, :n] = states[i, n : 2 * n]  # the second copy: every token has seen the whole text
    return out


class EchoTrunk(FrozenTrunk):
    """``FrozenDecoder`` over ``EchoStates``: the trunk never trained, each text read twice, cached once."""

    name = "echo"
    caches_states = True

    def make_states(self, base: torch.nn.Module, identity: Any, cache: StateCache) -> FrozenStates:
        return EchoStates(base, identity, cache)

    def describe(self) -> str:
        return "echo (the text twice, the second copy read) " + super().describe().removeprefix("frozen ")

    def mode_line(self, identity: dict[str, Any]) -> str:
        return (
            super()
            .mode_line(identity)
            .replace("frozen: its states", "echo: each text given twice and the states of its second copy")
        )
