"""Several blocks of a frozen trunk read at once and mixed.

Several blocks of a frozen trunk read at once (``model.trunk.read_layers``), each block's states cached on its
own, and combined by a learned mix: ELMo's scalar mix (one per route the first native layer reads, so each task
can prefer its own layers) or a projected concatenation.

What a block's cached states are: the residual stream right after block i (before the trunk's final norm, which
only the last block ever sees). In a causal trunk they depend only on the weights of the embedding and blocks
1..i, the model's config, the dtype and the token ids, so the cache key is exactly that (``prefix_digests``): one
pass through 30 blocks fills blocks 8, 16, 24 and 30 at once, and a model cut at block 8 (or a hybrid model whose
cached part ends at block 8) reuses block 8's entries.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from mtl_decoder.config import SHARED, ModelConfig
from mtl_decoder.errors import UserError
from mtl_decoder.hashing import json_bytes, update_with_tensor
from mtl_decoder.model.experts import RouteLayout
from mtl_decoder.model.heads import TaskHeadSpec
from mtl_decoder.model.layers import make_norm
from mtl_decoder.model.pretrained.frozen import FrozenDecoder, FrozenStates
from mtl_decoder.model.pretrained.hub import BaseIdentity, decoder_layers
from mtl_decoder.model.pretrained.state_cache import (
    INFERENCE_ENTRIES,
    KEY_FORMAT,
    STORE_DTYPE,
    VOLATILE_CONFIG_KEYS,
    StateCache,
    default_cache_root,
)

_DEPTH_KEYS = ("num_hidden_layers", "n_layer", "layer_types")
"""Config entries that say how deep a cut model is, not what its blocks compute: left out of the cache key."""

# ---------------------------------------------------------------------------------- the cache of several blocks


def blocks_attribute(base: nn.Module) -> str:
    """The name of the base model's list of blocks (``layers`` for Llama-style models, ``h`` for GPT-2)."""
    layers = decoder_layers(base)
    return next(name for name, child in base.named_children() if child is layers)


def prefix_digests(base: nn.Module, blocks: Iterable[int]) -> dict[int, str]:
    """A hash per block of what its states depend on.

    Block i -> a hash of what its states depend on: the config (depth left out), and in state-dict order the
    weights in front of the blocks (embeddings) and those of blocks 1..i. One pass over the weights."""
    wanted = sorted(set(blocks))
    skip = VOLATILE_CONFIG_KEYS | set(_DEPTH_KEYS)  # the same entries state_cache.config_digest leaves out, and depth
    config = {k: v for k, v in base.config.to_dict().items() if k not in skip and not k.startswith("_")}
    digest = hashlib.sha256(json_bytes(config))
    pattern = re.compile(rf"^{re.escape(blocks_attribute(base))}\.(\d+)\.")
    by_block: dict[int, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in base.state_dict().items():
        match = pattern.match(name)
        if match is not None:
            by_block.setdefault(int(match.group(1)), []).append((name, tensor))
        elif not by_block:  # in front of the first block; what follows the blocks (the final norm) is left out
            update_with_tensor(digest, name, tensor)
    out = {}
    for i in range(wanted[-1]):
        for name, tensor in by_block.get(i, []):
            update_with_tensor(digest, name, tensor)
        if i + 1 in wanted:
            out[i + 1] = digest.copy().hexdigest()
    return out


class LayeredCache:
    """The states of several blocks, cached block by block.

    The (T, L*H) states of L blocks side by side by token sequence, kept as one ``StateCache`` per block (its
    own folder), so that models reading other sets of blocks share the blocks they have in common. Answers what
    ``FrozenStates`` asks of a ``StateCache``."""

    key = staticmethod(StateCache.key)

    def __init__(self, caches: dict[int, StateCache], width: int, digests: dict[int, str]):
        self.caches, self.width, self.digests = caches, width, digests
        self.hits = self.misses = self.repeats = 0
        first = next(iter(caches.values()))
        self.flush_every, self.write, self.max_entries = first.flush_every, first.write, first.max_entries

    @property
    def directory(self) -> Path | None:
        """The folder that holds the blocks' folders (None: in memory only)."""
        first = next(iter(self.caches.values())).directory
        return first.parent if first is not None else None

    def rescan(self) -> None:
        for cache in self.caches.values():
            cache.rescan()

    def __contains__(self, key: str) -> bool:
        return all(key in cache for cache in self.caches.values())

    def __len__(self) -> int:
        return min(len(cache) for cache in self.caches.values())

    def get(self, key: str) -> torch.Tensor | None:
        parts = [cache.get(key) for cache in self.caches.values()]
        return None if any(p is None for p in parts) else torch.cat(parts, dim=-1)  # (T, L*H)

    def lookup(self, key: str) -> torch.Tensor | None:
        """get(), counting the row as a hit, a repeat (this cache computed it) or a miss, as StateCache.lookup."""
        found = self.get(key)
        if found is None:
            self.misses += 1
        elif all(key in cache._computed for cache in self.caches.values()):
            self.repeats += 1
        else:
            self.hits += 1
        return found

    def put(self, key: str, states: torch.Tensor) -> torch.Tensor:
        """Store each block's slice of the states where it is missing.

        Store each block's (T, H) slice of (T, L*H) ``states`` where that block does not hold it yet; returns
        the stored (T, L*H) states (each block's as it is cached)."""
        parts = []
        for cache, part in zip(self.caches.values(), states.split(self.width, dim=-1), strict=True):
            stored = cache.get(key) if key in cache else None
            parts.append(stored if stored is not None else cache.put(key, part))
        return torch.cat(parts, dim=-1)

    def flush(self) -> None:
        for cache in self.caches.values():
            cache.flush()

    def disk_bytes(self) -> int:
        return sum(
            shard.stat().st_size
            for cache in self.caches.values()
            if cache.directory is not None and cache.directory.is_dir()
            for shard in cache.directory.glob("shard-*.safetensors")
        )


def layered_cache(
    base: nn.Module, identity: BaseIdentity, blocks: list[int], dtype: str, cache_dir: str | Path | None
) -> LayeredCache:
    """The layered state cache of a set of blocks.

    The cache of ``blocks``' states: a folder per block under ``cache_dir`` (default ~/.cache/mtl-decoder/states),
    named by the block and the hash of what its states depend on (``prefix_digests``)."""
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    return block_caches(root, identity, blocks, dtype, prefix_digests(base, blocks))


def block_caches(
    root: Path | None,
    identity: BaseIdentity,
    blocks: list[int],
    dtype: str,
    digests: dict[int, str],
    compute: str = "fp32",
    **options,
) -> LayeredCache:
    """One StateCache per block under ``root`` (None: in memory only), keyed by what the block's states depend on:
    the prefix digest, the block, the weights' dtype and how the trunk computes (fp32, int8). ``options``: write,
    max_entries, as StateCache takes them."""

    def folder(i: int) -> Path | None:
        name = f"{identity.architecture}-{digests[i][:16]}-block{i}-{dtype}-{compute}-residual-k{KEY_FORMAT}"
        return None if root is None else root / name

    return LayeredCache({i: StateCache(folder(i), **options) for i in blocks}, identity.hidden_size, digests)


_CAPTURE: contextvars.ContextVar[dict[int, torch.Tensor] | None] = contextvars.ContextVar("capture", default=None)


@contextlib.contextmanager
def capturing() -> Iterator[dict[int, torch.Tensor]]:
    """Collect the outputs of the hooked blocks during one forward pass (per thread: prediction workers)."""
    found: dict[int, torch.Tensor] = {}
    token = _CAPTURE.set(found)
    try:
        yield found
    finally:
        _CAPTURE.reset(token)


class LayerStates(FrozenStates):
    """(B, T) ids -> (B, T, L*H): the residual stream after each of ``blocks`` side by side, cached or computed."""

    def __init__(self, base: nn.Module, identity: BaseIdentity, cache: LayeredCache, blocks: list[int]):
        super().__init__(base, identity, cache)
        self.blocks = list(blocks)
        layers = decoder_layers(base)
        if blocks[-1] > len(layers):
            raise UserError(
                f"model.trunk.read_layers: block {blocks[-1]} asked, '{identity.source}' keeps {len(layers)} blocks"
            )
        for i in self.blocks:
            layers[i - 1].register_forward_hook(lambda module, args, out, i=i: _capture(i, out))

    @property
    def width(self) -> int:
        return len(self.blocks) * self.identity.hidden_size

    def for_inference(
        self, cache_dir: str | Path | None = None, write: bool = False, max_entries: int | None = None
    ) -> LayeredCache:
        """FrozenStates.for_inference for the blocks' folders: read, written only with ``write``, a bounded memory."""
        root = Path(cache_dir).expanduser() if cache_dir is not None else self.cache.directory
        self.cache = self._rebuilt(root, write=write, max_entries=max_entries or INFERENCE_ENTRIES)
        return self.cache

    def set_compute(self, tag: str) -> None:
        """The trunk now computes differently (int8): each block's states go to their own folders."""
        self.cache.flush()
        self.compute_tag = tag
        old = self.cache
        self.cache = self._rebuilt(old.directory, write=old.write, max_entries=old.max_entries)

    def _rebuilt(self, root: Path | None, **options) -> LayeredCache:
        digests = self.cache.digests
        return block_caches(root, self.identity, self.blocks, self.dtype, digests, self.compute_tag, **options)

    def hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """The trunk's forward pass: the residual stream after each read block, side by side, float32."""
        with capturing() as found:
            self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return torch.cat([found[i].float() for i in self.blocks], dim=-1)  # (B, T, L*H)


def _capture(block: int, output) -> None:
    found = _CAPTURE.get()
    if found is not None:
        found[block] = output[0] if isinstance(output, tuple) else output


def cache_footprint(states: FrozenStates, tokens: int) -> str:
    """What the state cache of a run costs: bytes per token and block, memory for ``tokens`` tokens, disk."""
    read = states.blocks
    per = states.identity.hidden_size * STORE_DTYPE.itemsize
    cache = states.cache
    disk = cache.disk_bytes() if isinstance(cache, LayeredCache) else _folder_bytes(cache.directory)
    return (
        f"block(s) {', '.join(map(str, read))} cached, {per:,} bytes per token per block "
        f"({str(STORE_DTYPE).removeprefix('torch.')}): {tokens * len(read) * per / 2**20:,.1f} MiB in memory for "
        f"{tokens:,} tokens, {disk / 2**20:,.1f} MiB on disk"
    )


def _folder_bytes(directory: Path | None) -> int:
    if directory is None or not directory.is_dir():
        return 0
    return sum(shard.stat().st_size for shard in directory.glob("shard-*.safetensors"))


# ---------------------------------------------------------------------------------- the mix, and the model


def final_norm_of(base: nn.Module) -> nn.Module:
    """The trunk's final norm module (Llama-style ``norm``, GPT-2 ``ln_f``)."""
    for name in ("norm", "ln_f", "final_layernorm", "final_norm"):
        module = getattr(base, name, None)
        if isinstance(module, nn.Module):
            return module
    raise UserError(f"{type(base).__name__}: cannot find its final norm (supported: Llama-style, GPT-2)")


class LayerMix(nn.Module):
    """A learned combination of several blocks' states.

    (B, T, L*H) states of L blocks -> each block normed by its own trainable copy of the trunk's final norm
    (residual streams grow with depth, and the copy starts where the trunk's own reading of its last block is),
    then combined by the subclass (``model.trunk.layer_mix``, resolved once through ``LAYER_MIXES``)."""

    per_route: ClassVar[bool] = False
    """Whether each route can read its own combination (otherwise one feeds the shared bottom)."""

    def __init__(self, norm: nn.Module, blocks: int, hidden: int, routes: list[str]):
        super().__init__()
        self.hidden = hidden
        self.norms = nn.ModuleList(_trainable_copy(norm) for _ in range(blocks))
        self.routes: dict[str, int] = {}

    @property
    def width(self) -> int:
        """The width of one token's combined states."""
        return self.hidden

    def normed(self, states: torch.Tensor) -> list[torch.Tensor]:
        """(B, T, L*H) -> L x (B, T, H), each block through its own norm."""
        return [norm(h) for norm, h in zip(self.norms, states.split(self.hidden, dim=-1), strict=True)]

    def shared(self, states: torch.Tensor) -> torch.Tensor:
        """(B, T, L*H) -> (B, T, width): the one combination every route reads."""
        raise NotImplementedError


class ScalarMix(LayerMix):
    """ELMo's scalar mix, one per route: ``scale_r * sum_l softmax(w_r)_l * norm_l(h_l)``."""

    per_route = True

    def __init__(self, norm: nn.Module, blocks: int, hidden: int, routes: list[str]):
        super().__init__(norm, blocks, hidden, routes)
        self.routes = {name: i for i, name in enumerate(routes)}
        self.weights = nn.Parameter(torch.zeros(len(routes), blocks))  # softmax: the blocks weigh the same
        self.scale = nn.Parameter(torch.ones(len(routes)))

    def mixed(self, layers: list[torch.Tensor], route: str, examples: torch.Tensor | None = None) -> torch.Tensor:
        """Route ``route``'s mix of the normed blocks of ``examples`` (None: all): (n, T, H)."""
        r = self.routes[route]
        weights = torch.softmax(self.weights[r].float(), dim=0)
        picked = layers if examples is None else [h[examples] for h in layers]
        return self.scale[r] * sum(w * h for w, h in zip(weights, picked, strict=True))

    def shared(self, states: torch.Tensor) -> torch.Tensor:
        return self.mixed(self.normed(states), SHARED)

    def mix(self, states: torch.Tensor, layout: RouteLayout) -> torch.Tensor:
        """(B, T, L*H) -> (N, T, H): each row of ``layout`` gets its route's mix of its example's blocks."""
        layers = self.normed(states)
        return torch.cat([self.mixed(layers, name, layout.row_example[layout.rows(name)]) for name in layout.names])


class ConcatMix(LayerMix):
    """The normed blocks side by side, one for all routes (projected by the model's input layer)."""

    @property
    def width(self) -> int:
        return len(self.norms) * self.hidden

    def shared(self, states: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.normed(states), dim=-1)  # (B, T, L*H)


LAYER_MIXES: dict[str, type[LayerMix]] = {"scalar_mix": ScalarMix, "concat": ConcatMix}
"""model.trunk.layer_mix -> the module that combines the read blocks."""


def _trainable_copy(module: nn.Module) -> nn.Module:
    import copy

    clone = copy.deepcopy(module)
    clone.requires_grad_(True)
    return clone


class LayerMixDecoder(FrozenDecoder):
    """A frozen-trunk decoder reading several blocks.

    ``FrozenDecoder`` reading several blocks: the mixed (or concatenated) states go through the same norm and
    projection to the native layers' width. With a scalar mix and a variant whose first layer already holds
    the routes (ple, cgc_stacked), each route reads its own mix; otherwise one mix feeds the shared bottom."""

    def __init__(self, cfg: ModelConfig, tasks: list[TaskHeadSpec], identity: BaseIdentity, states: LayerStates):
        super().__init__(cfg, tasks, identity, states)
        base, blocks, H = states.base, states.blocks, identity.hidden_size
        kind = LAYER_MIXES[cfg.trunk.layer_mix]
        self.per_route = kind.per_route and cfg.variant.gated and self.fork_layer == 0
        routes = [*self.task_names, SHARED] if self.per_route else [SHARED]
        self.mix = kind(final_norm_of(base), len(blocks), H, routes)
        width = self.mix.width
        if width != H:  # the norm and projection of the combined width
            self.embed = nn.Sequential(make_norm(cfg.norm, width), nn.Linear(width, cfg.d_model))
            nn.init.normal_(self.embed[1].weight, std=0.02)
            nn.init.zeros_(self.embed[1].bias)

    def embed_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.embed(self.mix.shared(self.states(input_ids, attention_mask)))  # (B, T, C)

    def embed_routes(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: RouteLayout
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]] | None:
        if not self.per_route:
            return None
        return self.embed(self.mix.mix(self.states(input_ids, attention_mask), layout)), []  # (N, T, C)

    def layer_weights(self) -> dict[str, list[float]]:
        """Route -> the softmax weight each read block gets (scalar mix; what each task prefers)."""
        return {
            name: torch.softmax(self.mix.weights[r].detach().float(), 0).tolist() for name, r in self.mix.routes.items()
        }
