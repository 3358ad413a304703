"""The frozen trunks' state cache: (T, H) hidden states by token sequence, in memory and on disk.

The states of a sequence depend only on the trunk's weights, the blocks kept, the dtype, its config (rope_theta,
rms_norm_eps, a sliding window, ...), how it computes (float32, or int8 weights) and the token ids, so the cache is
keyed by exactly those: a folder per (weights hash, blocks, dtype, compute, config hash), a file entry per hash of
the ids. Shards are safetensors files written whole and renamed into place, never modified: several runs (or
processes) can share a cache folder, and reading one never unpickles anything. Folders of an older key format are
simply not found (a miss, recomputed).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtl_decoder.hashing import cache_root, json_sha256, short_digest
from mtl_decoder.model.pretrained.hub import BaseIdentity
from mtl_decoder.tensorstore import ShardedStore

STORE_DTYPE = torch.float16
"""Cached states are stored in half precision: half the disk and memory, far below what the layers above resolve."""

INFERENCE_ENTRIES = 2048
"""States an inference run keeps in memory (least recently used dropped first): the texts of many batches and the
repeats near each other, a bounded ~100 MB at SmolLM2's width (576) and 40 sub-words a text."""

KEY_FORMAT = 2
"""Version of the folder key; folders of format 1 (weights hash, blocks, dtype only) are never read."""

VOLATILE_CONFIG_KEYS = frozenset(
    {"_name_or_path", "_model_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype",
     "output_hidden_states", "output_attentions", "return_dict", "use_cache", "id2label", "label2id", "problem_type",
     "_attn_implementation", "_attn_implementation_autoset", "tokenizer_class"}
)  # fmt: skip
"""Config entries that do not change the states (where the config was read from, output switches, the weights'
dtype, which the folder names on its own): left out of the config hash so that the same trunk keys the same way
whether loaded from its checkpoint or from a saved model's trunk/ folder."""


def default_cache_root() -> Path:
    return cache_root("states")


def check_states(tensors: dict[str, torch.Tensor]) -> str | None:
    """Why tensors read from a state shard are not states (each (T, H) in STORE_DTYPE, one H per shard), or None."""
    widths = set()
    for key, states in tensors.items():
        if states.dim() != 2 or states.dtype != STORE_DTYPE:
            return f"'{key}' is a {states.dim()}-d {states.dtype} tensor, not (tokens, width) {STORE_DTYPE} states"
        widths.add(states.shape[1])
    return f"states of several widths {sorted(widths)} in one shard" if len(widths) > 1 else None


def config_digest(config: Any) -> str:
    """sha256 of a trunk's config (a transformers PretrainedConfig or a dict) without VOLATILE_CONFIG_KEYS."""
    entries = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    kept = {k: v for k, v in entries.items() if k not in VOLATILE_CONFIG_KEYS}
    return json_sha256(kept)


def cache_folder(identity: BaseIdentity, dtype: str, config: Any = None, compute: str = "fp32") -> str:
    """The folder name of a trunk's states: the one rule that keys them (see the module doc)."""
    digest = config_digest(config)[:12] if config is not None else "none"
    return (
        f"{identity.architecture}-{identity.sha256[:16]}-L{identity.layers}-{dtype}-{compute}-c{digest}-k{KEY_FORMAT}"
    )


class StateCache:
    """(T_i, H) hidden states by token sequence, in memory and (when ``directory`` is set) on disk.

    ``write``: put() also writes new states to ``directory`` (in shards of ``flush_every``); False: the folder is
    only read. ``max_entries``: keep at most this many states in memory, least recently used dropped first (None:
    all, as training needs); a state read from disk is then read alone, not with its whole shard. States read by
    whole shards are views of the shard's file mapping (``ShardedStore.read_shard``): the page cache's memory,
    shared with other runs reading the folder, not this process's own."""

    def __init__(
        self, directory: Path | None, flush_every: int = 1024, *, write: bool = True, max_entries: int | None = None
    ):
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.directory, self.flush_every = directory, flush_every
        self.write, self.max_entries = write, max_entries
        self.memory: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.disk = ShardedStore(directory, check_states)
        self.pending: dict[str, torch.Tensor] = {}
        self._computed: set[str] = set()
        """Keys put() by this cache that are still in memory: finding one again is a repeat inside the data."""
        self.hits = self.misses = self.repeats = 0
        """Rows found (cached before they were asked for), computed, and found again after this cache computed them."""
        self.rescan()

    def rescan(self) -> None:
        """Index the shards on disk (those other processes or runs may have written since)."""
        self.disk.rescan()

    @property
    def on_disk(self) -> dict[str, Path]:
        """Key -> the shard holding its states."""
        return self.disk.location

    @staticmethod
    def key(ids: Iterable[int]) -> str:
        return short_digest(np.asarray(list(ids), dtype=np.int64).tobytes())

    def __contains__(self, key: str) -> bool:
        return key in self.memory or key in self.pending or key in self.on_disk

    def __len__(self) -> int:
        return len(self.memory.keys() | self.pending.keys() | self.on_disk.keys())

    def get(self, key: str) -> torch.Tensor | None:
        found = self.memory.get(key)
        if found is not None:
            self.memory.move_to_end(key)
            return found
        found = self.pending.get(key)  # written soon; dropped from memory by the bound meanwhile
        if found is None and key in self.on_disk:
            if self.max_entries is None:
                self._load_shard(self.on_disk[key])
                return self.memory.get(key)  # None: its shard was damaged, the states are computed again
            found = self.disk.read(key)
        if found is not None:
            self._remember(key, found)
        return found

    def lookup(self, key: str) -> torch.Tensor | None:
        """get(), counting the row as a hit, a repeat (this cache computed it) or a miss (None)."""
        found = self.get(key)
        if found is None:
            self.misses += 1
        elif key in self._computed:
            self.repeats += 1
        else:
            self.hits += 1
        return found

    def _remember(self, key: str, states: torch.Tensor) -> None:
        self.memory[key] = states
        self.memory.move_to_end(key)
        if self.max_entries is not None:
            while len(self.memory) > self.max_entries:
                dropped, _ = self.memory.popitem(last=False)
                self._computed.discard(dropped)

    def _load_shard(self, shard: Path) -> None:
        """Every entry of a shard at once (batches draw from all shards, so the rest is needed soon), as views of
        its file mapping; nothing when the shard is damaged."""
        for name, states in (self.disk.read_shard(shard) or {}).items():
            if name not in self.memory:
                self.memory[name] = states

    def put(self, key: str, states: torch.Tensor) -> torch.Tensor:
        """Cache ``states`` (stored as STORE_DTYPE); returns the stored tensor."""
        states = states.detach().to("cpu", STORE_DTYPE).contiguous()
        self._remember(key, states)
        self._computed.add(key)
        if self.write and self.directory is not None:
            self.pending[key] = states
            if len(self.pending) >= self.flush_every:
                self.flush()
        return states

    def flush(self) -> None:
        """Write the states computed since the last flush as one new shard (whole, then renamed into place)."""
        if not self.pending or self.directory is None or not self.write:
            return
        self.disk.write(self.pending)
        self.pending = {}


def cache_for(identity: BaseIdentity, dtype: str, cache_dir: str | None, config: Any = None) -> StateCache:
    """The state cache of this trunk.

    Its own folder under ``cache_dir`` (default ~/.cache/mtl-decoder/states), keyed
    by ``config`` too (the trunk's transformers config; pass it: without, the folder is keyed 'none')."""
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    return StateCache(root / cache_folder(identity, dtype, config))
