"""Mode 'frozen': native layers trained on a pretrained trunk's cached states.

Mode 'frozen': a pretrained trunk's hidden states at block N, computed once per token sequence and cached on
disk (``state_cache``: what keys them, how they are stored), read by native PLE decoder layers trained on top (the
mode that fits a CPU). The trunk always runs in its own dtype, with autocast switched off around it: a bf16 autocast
around the model (``--precision bf16``) never reaches the states, so they never depend on it.

Training keeps every state in memory and writes them all to disk (its precompute is read back on every epoch).
Inference (``evaluate``, ``predict``; ``FrozenStates.for_inference``) reads the folder but keeps at most
``INFERENCE_ENTRIES`` states in memory, least recently used dropped first, and writes nothing unless asked
(``--cache-states``): memory and disk stay flat however many texts it predicts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mtl_decoder.config import ModelConfig
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.heads import TaskHeadSpec
from mtl_decoder.model.layers import make_norm
from mtl_decoder.model.pretrained.hub import DTYPES, BaseIdentity
from mtl_decoder.model.pretrained.packing import PACK_TOKENS, packed_pass, packs_faithfully
from mtl_decoder.model.pretrained.state_cache import INFERENCE_ENTRIES, StateCache, cache_folder


@dataclass
class PrecomputeCounts:
    """What one precompute did, in sequences."""

    sequences: int
    """Sequences asked for, repeats inside the data included."""
    distinct: int
    """Distinct token sequences among them."""
    cached: int
    """Distinct sequences already in the cache (memory or folder) before the precompute."""
    computed: int
    """Distinct sequences run through the trunk."""
    seconds: float

    @property
    def repeats(self) -> int:
        return self.sequences - self.distinct


class FrozenStates(nn.Module):
    """(B, T) ids -> (B, T, H) states of the frozen trunk, from the cache or computed (and then cached).

    The trunk is held outside the module tree: it is never trained, saved in the model's weights, or handed to
    an optimizer; device moves still reach it (``_apply``)."""

    def __init__(self, base: nn.Module, identity: BaseIdentity, cache: StateCache):
        super().__init__()
        base.requires_grad_(False)
        self.__dict__["base"] = base
        self.identity, self.cache = identity, cache
        self.blocks = [identity.layers]
        """The blocks whose states are read (1-based): the last kept one here."""
        floating = next((p.dtype for p in base.parameters() if p.is_floating_point()), torch.float32)
        self.dtype = next((name for name, d in DTYPES.items() if d == floating), str(floating))
        self.compute_tag = "fp32"
        """How the trunk computes, part of the cache key: 'fp32' (its own dtype), or e.g. 'int8' (set_compute)."""
        self.precomputed: PrecomputeCounts | None = None
        """The last precompute's counts."""
        self.pack_tokens = PACK_TOKENS
        """Texts packed into rows of at most this many ids before the trunk's pass (0: padded batches as given)."""
        self._packing_checked: bool | None = None

    def _apply(self, fn, recurse: bool = True):
        self.base._apply(fn)
        return super()._apply(fn, recurse)

    @property
    def width(self) -> int:
        """H: the width of a token's cached states (layermix.LayerStates caches several blocks side by side)."""
        return self.identity.hidden_size

    # ---------------------------------------------------------------------------------------------- the cache

    def folder(self, root: Path) -> Path:
        return root / cache_folder(self.identity, self.dtype, self.base.config, self.compute_tag)

    def for_inference(
        self, cache_dir: str | Path | None = None, write: bool = False, max_entries: int | None = None
    ) -> StateCache:
        """Switch to the state cache of an inference run.

        Switch to the cache of an inference run: the folder of this trunk under ``cache_dir`` (default the
        current cache's root), read, written only with ``write`` (``--cache-states``), at most ``max_entries``
        (default INFERENCE_ENTRIES) states in memory. Returns the new cache."""
        max_entries = max_entries or INFERENCE_ENTRIES
        current = self.cache.directory
        if cache_dir is not None:
            directory: Path | None = self.folder(Path(cache_dir).expanduser())
        else:
            directory = self.folder(current.parent) if current is not None else None
        self.cache = StateCache(directory, self.cache.flush_every, write=write, max_entries=max_entries)
        return self.cache

    def set_compute(self, tag: str) -> None:
        """Tell the cache that the trunk now computes differently.

        The trunk now computes differently (e.g. int8 weights): its states go to (and come from) their own
        folder, with the cache's other settings kept."""
        self.cache.flush()
        self.compute_tag = tag
        old = self.cache
        directory = self.folder(old.directory.parent) if old.directory is not None else None
        self.cache = StateCache(directory, old.flush_every, write=old.write, max_entries=old.max_entries)

    # ---------------------------------------------------------------------------------------------- states

    @staticmethod
    def exactly(device: torch.device) -> contextlib.AbstractContextManager:
        """The context every frozen computation of the trunk runs in.

        Autocast switched off: the one context every frozen computation of the trunk (its pass, the cache's
        reads and writes) runs in, so that it computes in its own dtype whatever precision the layers above use
        and its cached states never depend on the caller's precision."""
        return torch.autocast(device.type, enabled=False)

    @torch.no_grad()
    def compute(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The trunk's states (``run``), float32, padding rows left as computed, with autocast off (``exactly``)."""
        self.base.eval()
        with self.exactly(input_ids.device):
            return self.run(input_ids, attention_mask)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One pass of the trunk over (B, T) right-padded ids: (B, T, H) float32 states (causal, as pretrained).

        With ``pack_tokens`` set, the texts are packed end to end into rows of at most that many ids where that
        multiplies at least ``MIN_SAVING`` fewer ids than the padded batch (packing.py), and unpacked after."""
        packed = packed_pass(self.hidden, input_ids, attention_mask, self.pack_tokens, self.packs)
        return packed if packed is not None else self.hidden(input_ids, attention_mask.long(), None)

    def packs(self) -> bool:
        """Whether this trunk keeps packed texts apart (``packing.packs_faithfully``), checked once: on the first
        packed pass, or before int8 quantises the trunk (``quantize_int8``), so that the check compares float32."""
        if self._packing_checked is None:
            device = next(self.base.parameters()).device
            with self.exactly(device):
                self._packing_checked = packs_faithfully(self.hidden, self.base.config.vocab_size, device)
        return self._packing_checked

    def hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """The trunk's forward pass: its last hidden states, float32. Packed rows come with position ids and no
        attention mask (Hugging Face then masks each packed text from the others)."""
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state.float()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, width) float32 states, from the cache or computed, with autocast off."""
        with self.exactly(input_ids.device):
            return self._states(input_ids, attention_mask)

    def _states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        lengths = attention_mask.sum(1).tolist()
        keys = [StateCache.key(row[:n]) for row, n in zip(input_ids.tolist(), lengths, strict=True)]
        found: dict[str, torch.Tensor | None] = {}
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in found:
                self.cache.repeats += 1  # the same text twice in one batch: computed once
                continue
            found[key], first[key] = self.cache.lookup(key), i
        missing = [first[k] for k, f in found.items() if f is None]
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            longest = max(lengths[i] for i in missing)  # the cached rows may have been the longest ones
            computed = self.compute(input_ids[rows, :longest], attention_mask[rows, :longest])
            for j, i in enumerate(missing):  # the stored (half-precision) states: the same whether new or cached
                found[keys[i]] = self.cache.put(keys[i], computed[j, : lengths[i]])
        H = self.width
        states = torch.zeros(B, T, H, device=input_ids.device)
        for i, key in enumerate(keys):
            states[i, : lengths[i]] = found[key].to(device=input_ids.device, dtype=torch.float32)
        return states

    def precompute(
        self,
        sequences: list[list[int]],
        batch_size: int = 32,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[int, float]:
        """Fill the cache for every sequence not yet in it, longest batches first; (computed, seconds).
        ``progress(done, total)`` counts distinct sequences computed; ``self.precomputed`` holds the counts."""
        distinct = {StateCache.key(ids): ids for ids in sequences}
        todo = {k: ids for k, ids in distinct.items() if k not in self.cache}
        order = sorted(todo.items(), key=lambda item: -len(item[1]))  # length-sorted: little padding
        started, done = time.perf_counter(), 0
        device = next(iter(self.base.parameters())).device
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            T = max(len(ids) for _, ids in chunk)
            ids = torch.zeros(len(chunk), T, dtype=torch.long, device=device)
            mask = torch.zeros(len(chunk), T, dtype=torch.bool, device=device)
            for i, (_, seq) in enumerate(chunk):
                ids[i, : len(seq)] = torch.tensor(seq)
                mask[i, : len(seq)] = True
            states = self.compute(ids, mask)
            for i, (key, seq) in enumerate(chunk):
                self.cache.put(key, states[i, : len(seq)])
            done += len(chunk)
            if progress is not None:
                progress(done, len(order))
        self.cache.flush()
        seconds = time.perf_counter() - started
        cached = len(distinct) - len(todo)
        self.precomputed = PrecomputeCounts(len(sequences), len(distinct), cached, len(order), seconds)
        return len(order), seconds


class FrozenDecoder(MTLDecoder):
    """Native PLE decoder layers (``cfg.n_layers``, width ``cfg.d_model``) over a frozen pretrained trunk's states:
    the token embedding is replaced by a norm and a projection of those states."""

    def __init__(self, cfg: ModelConfig, tasks: list[TaskHeadSpec], identity: BaseIdentity, states: FrozenStates):
        super().__init__(cfg, tasks, vocab_size=1)
        self.identity = identity
        self.states = states
        self.embed = nn.Sequential(
            make_norm(cfg.norm, identity.hidden_size), nn.Linear(identity.hidden_size, cfg.d_model)
        )
        nn.init.normal_(self.embed[1].weight, std=0.02)
        nn.init.zeros_(self.embed[1].bias)

    def embed_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.embed(self.states(input_ids, attention_mask))  # (B, T, C)
