"""Mode 'frozen': a pretrained trunk's hidden states at block N, computed once per token sequence and cached on
disk, read by native PLE decoder layers trained on top (the mode that fits a CPU).

The states of a sequence depend only on the trunk's weights, the blocks kept, the dtype and the token ids, so the
cache is keyed by exactly those: a folder per (weights hash, blocks, dtype), a file entry per hash of the ids.
Shards are safetensors files written whole and renamed into place, never modified: several runs (or processes)
can share a cache folder, and reading one never unpickles anything.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from mtl_decoder.config import ModelConfig
from mtl_decoder.files import temporary_sibling
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.heads import TaskHeadSpec
from mtl_decoder.model.layers import make_norm
from mtl_decoder.model.pretrained.hub import BaseIdentity

STORE_DTYPE = torch.float16
"""Cached states are stored in half precision: half the disk and memory, far below what the layers above resolve."""


def default_cache_root() -> Path:
    return Path(os.environ.get("MTL_DECODER_CACHE", Path.home() / ".cache" / "mtl-decoder")) / "states"


class StateCache:
    """(T_i, H) hidden states by token sequence, in memory and (when ``directory`` is set) on disk."""

    def __init__(self, directory: Path | None, flush_every: int = 1024):
        self.directory, self.flush_every = directory, flush_every
        self.memory: dict[str, torch.Tensor] = {}
        self.on_disk: dict[str, Path] = {}
        self.pending: dict[str, torch.Tensor] = {}
        self._indexed: set[Path] = set()
        self.hits = self.misses = 0
        self.rescan()

    def rescan(self) -> None:
        """Index the shards on disk (those other processes or runs may have written since)."""
        if self.directory is not None and self.directory.is_dir():
            for shard in sorted(self.directory.glob("shard-*.safetensors")):
                if shard in self._indexed:
                    continue
                with safe_open(str(shard), framework="pt") as f:
                    self.on_disk.update(dict.fromkeys(f.keys(), shard))
                self._indexed.add(shard)

    @staticmethod
    def key(ids: Iterable[int]) -> str:
        return hashlib.blake2b(np.asarray(list(ids), dtype=np.int64).tobytes(), digest_size=16).hexdigest()

    def __contains__(self, key: str) -> bool:
        return key in self.memory or key in self.on_disk

    def __len__(self) -> int:
        return len(self.memory.keys() | self.on_disk.keys())

    def get(self, key: str) -> torch.Tensor | None:
        found = self.memory.get(key)
        if found is None and key in self.on_disk:
            self._load_shard(self.on_disk[key])
            found = self.memory[key]
        return found

    def _load_shard(self, shard: Path) -> None:
        """Read every entry of a shard into memory at once (batches draw from all shards, so the rest is needed
        soon), each copied out of the file mapping: a tensor safetensors returns keeps its shard mapped, and one
        mapping per cached sequence ran out of the kernel's map count (65,530) on 82k CoNLL + SST-2 sequences."""
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                if name not in self.memory:
                    self.memory[name] = f.get_tensor(name).clone()

    def put(self, key: str, states: torch.Tensor) -> None:
        states = states.detach().to("cpu", STORE_DTYPE).contiguous()
        self.memory[key] = states
        if self.directory is not None:
            self.pending[key] = states
            if len(self.pending) >= self.flush_every:
                self.flush()

    def flush(self) -> None:
        """Write the states computed since the last flush as one new shard (whole, then renamed into place)."""
        if not self.pending or self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"shard-{time.time_ns()}-{os.getpid()}.safetensors"
        tmp = temporary_sibling(final)
        save_file(self.pending, str(tmp))
        os.replace(tmp, final)
        self.on_disk.update(dict.fromkeys(self.pending, final))
        self._indexed.add(final)
        self.pending = {}


class FrozenStates(nn.Module):
    """(B, T) ids -> (B, T, H) states of the frozen trunk, from the cache or computed (and then cached).

    The trunk is held outside the module tree: it is never trained, saved in the model's weights, or handed to
    an optimizer; device moves still reach it (``_apply``)."""

    def __init__(self, base: nn.Module, identity: BaseIdentity, cache: StateCache):
        super().__init__()
        base.requires_grad_(False)
        self.__dict__["base"] = base
        self.identity, self.cache = identity, cache

    def _apply(self, fn, recurse: bool = True):
        self.base._apply(fn)
        return super()._apply(fn, recurse)

    @property
    def width(self) -> int:
        """H: the width of a token's cached states (layermix.LayerStates caches several blocks side by side)."""
        return self.identity.hidden_size

    @torch.no_grad()
    def compute(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The trunk's last hidden states (causal, as pretrained), float32, padding rows left as computed."""
        self.base.eval()
        out = self.base(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False)
        return out.last_hidden_state.float()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        B, T = input_ids.shape
        lengths = attention_mask.sum(1).tolist()
        keys = [StateCache.key(row[:n]) for row, n in zip(input_ids.tolist(), lengths, strict=True)]
        found = [self.cache.get(k) for k in keys]
        missing = [i for i, f in enumerate(found) if f is None]
        self.cache.hits += B - len(missing)
        self.cache.misses += len(missing)
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            computed = self.compute(input_ids[rows], attention_mask[rows])
            for j, i in enumerate(missing):
                self.cache.put(keys[i], computed[j, : lengths[i]])
                found[i] = self.cache.get(keys[i])
        H = self.width
        states = torch.zeros(B, T, H, device=input_ids.device)
        for i, f in enumerate(found):
            states[i, : lengths[i]] = f.to(device=input_ids.device, dtype=torch.float32)
        return states

    def precompute(
        self,
        sequences: list[list[int]],
        batch_size: int = 32,
        progress: Callable[[int, int], None] | None = None,
    ) -> tuple[int, float]:
        """Fill the cache for every sequence not yet in it, longest batches first; (computed, seconds)."""
        todo = {StateCache.key(ids): ids for ids in sequences}
        todo = {k: ids for k, ids in todo.items() if k not in self.cache}
        order = sorted(todo.items(), key=lambda item: -len(item[1]))
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
        return len(order), time.perf_counter() - started


class FrozenDecoder(MTLDecoder):
    """Native PLE decoder layers (``cfg.n_layers``, width ``cfg.d_model``) over a frozen pretrained trunk's states:
    the token embedding is replaced by a norm and a projection of those states."""

    saves_trainable_only = False

    def __init__(
        self, cfg: ModelConfig, tasks: list[TaskHeadSpec], base: nn.Module, identity: BaseIdentity, cache: StateCache
    ):
        super().__init__(cfg, tasks, vocab_size=1)
        self.identity = identity
        self.states = FrozenStates(base, identity, cache)
        self.embed = nn.Sequential(
            make_norm(cfg.norm, identity.hidden_size), nn.Linear(identity.hidden_size, cfg.d_model)
        )
        nn.init.normal_(self.embed[1].weight, std=0.02)
        nn.init.zeros_(self.embed[1].bias)

    def embed_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.embed(self.states(input_ids, attention_mask))  # (B, T, C)

    def state_to_save(self) -> dict[str, torch.Tensor]:
        return self.state_dict()


def cache_for(identity: BaseIdentity, dtype: str, cache_dir: str | None) -> StateCache:
    """The state cache of this trunk: its own folder under ``cache_dir`` (default ~/.cache/mtl-decoder/states)."""
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    return StateCache(root / f"{identity.architecture}-{identity.sha256[:16]}-L{identity.layers}-{dtype}")
