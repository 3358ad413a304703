"""Small building blocks of the trunk.

Norms, rotary positions, attention (with a per-layer KV cache for
streaming), the SwiGLU MLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.model.exact_matmul import module_linear


def make_norm(kind: str, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if kind == "layernorm" else nn.RMSNorm(dim, eps=1e-6)


class RotaryEmbedding(nn.Module):
    """RoPE: dimension pairs (2i, 2i+1) of each head rotate by position x base^(-2i/D)."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        t = torch.arange(length, device=self.inv_freq.device, dtype=torch.float32)
        angles = torch.outer(t, self.inv_freq)  # (T, D/2)
        return torch.polar(torch.ones_like(angles), angles)  # (T, D/2) complex: cos + i sin

    def at(self, positions: torch.Tensor) -> torch.Tensor:
        """The rotations of any positions.

        (...) integer positions -> (..., D/2) complex, the same values as
        ``forward`` gives those positions (streaming: each row of a batch continues at its own offset)."""
        angles = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq  # what torch.outer computes
        return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, rotation: torch.Tensor | None) -> torch.Tensor:
    """Rotate queries and keys by their positions.

    Rotate (..., T, D) queries and keys by their positions, as one complex multiply (the half-split form with
    chunk/cat was the slowest op of a CPU forward pass). ``rotation`` None (no rotary positions): x unchanged."""
    if rotation is None:
        return x
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (..., T, D/2)
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


class Dropout(nn.Module):
    """Dropout drawing two random bytes per element: p is kept to 1/65,536 (0.1 acts as 6,554/65,536).

    torch's bernoulli dropout is slow on CPUs: on a (2304, 256) tensor it costs nearly three times as much as drawing
    raw random bytes (two bytes as fast as one), and a training step calls dropout about nine times. One byte per
    element would move p in steps of 1/256 and silently turn any p under 1/512 into no dropout at all; a p too
    small for two bytes is refused rather than rounded away.
    """

    STEPS = 2**16

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must lie in [0, 1), got {p}")
        self.threshold = round(p * self.STEPS)
        if p > 0 and self.threshold == 0:
            raise ValueError(f"dropout p={p} is below 1/{self.STEPS:,}, the smallest this layer draws; use 0 or more")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        n = x.numel()
        words = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
        noise = words.view(torch.int16)[:n].view(x.shape)  # 4 draws of 16 bits per int64, uniform on [-2^15, 2^15)
        keep = noise >= self.threshold - self.STEPS // 2  # signed: torch has no uint16 comparison on a CPU
        return x * keep * (self.STEPS / (self.STEPS - self.threshold))


class SelfAttention(nn.Module):
    """Multi-head self-attention through torch SDPA; the mask carries causality and padding.

    No dropout on the attention probabilities: with it SDPA leaves its fused CPU kernel (3.4x slower)."""

    def __init__(self, d_model: int, n_heads: int, causal: bool):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)  # zero-initialised by the model: identity at init

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor | None) -> torch.Tensor:
        """Self-attention over a batch.

        x (N, T, C); mask: a boolean key mask broadcastable to (N, H, T, T), or None when causal; rope: the (T,
        D/2) rotations, or None without rotary positions."""
        N, T, C = x.shape
        qkv = module_linear(self.qkv, x).view(N, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(qkv[:2], rope)  # queries and keys rotated together, each 3 x (N, H, T, D)
        v = qkv[2]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return module_linear(self.out, y.transpose(1, 2).reshape(N, T, C))  # (N, T, C)

    def forward_cached(self, x: torch.Tensor, cache: KVCache, step: CacheStep) -> torch.Tensor:
        """Causal attention of the next tokens of N streams against the cache.

        Causal attention of the next tokens of N streams: x (N, t, C) holds each row's new tokens (right-padded,
        ``step`` says how many are real); their keys and values are written into ``cache`` in place, and the
        queries attend to everything the cache holds for their row up to their own position."""
        N, T, C = x.shape
        qkv = self.qkv(x).view(N, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)  # 3 x (N, H, t, D)
        q, k = apply_rope(qkv[:2], step.rope)
        cache.write(k, qkv[2], step)
        keys, values = cache.visible(step)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask)
        return self.out(y.transpose(1, 2).reshape(N, T, C))


@dataclass
class CacheStep:
    """Where one step's new tokens go, for one set of cache rows (rows -> their stream: ``row_example``)."""

    rows: torch.Tensor
    """(n,) the cache row of every real new token, row-major."""
    cols: torch.Tensor
    """(n,) its position in the stream (the cache slot it is written to)."""
    offsets: torch.Tensor
    """(n,) its index among the step's new tokens of its row."""
    mask: torch.Tensor
    """(R, 1, t, K) which cached positions each new token may attend to: its row's positions up to its own."""
    keys: int
    """K: the positions of the cache a query of this step can see (the longest row after the step)."""
    rope: torch.Tensor | None
    """(R, 1, t, D/2) the rotations of the new tokens' positions, or None without rotary positions."""
    positions: torch.Tensor
    """(R, t) each new token's position in its stream (padding: where it would have been)."""


class KVCache:
    """One attention layer's key and value cache.

    One attention layer's keys and values for R rows: two (R, H, capacity, D) tensors allocated once and filled
    in place; a row's positions [0, length) hold its stream's history (the lengths live in ``DecoderCache``).

    Each row is its own stream: a row's queries see only that row's keys, so streams of different lengths in one
    batch never read each other's history."""

    def __init__(self, rows: int, n_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device):
        self.k = torch.zeros(rows, n_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, k: torch.Tensor, v: torch.Tensor, step: CacheStep) -> None:
        """k, v (R, H, t, D): put the real new tokens' keys and values at their positions (padding is not written)."""
        self.k[step.rows, :, step.cols] = k[step.rows, :, step.offsets].to(self.k.dtype)
        self.v[step.rows, :, step.cols] = v[step.rows, :, step.offsets].to(self.v.dtype)

    def visible(self, step: CacheStep) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, :, : step.keys], self.v[:, :, : step.keys]

    def nbytes(self) -> int:
        return self.k.untyped_storage().nbytes() + self.v.untyped_storage().nbytes()


class DecoderCache:
    """The KV caches of every attention layer of a trunk, for B streams, and how far each stream has got.

    ``layer_rows[i]`` maps layer i's cache rows to streams: a layer that runs once per example has B rows, one that
    runs on every route's row (example, route) has one per route and example. All caches are allocated here, once,
    with room for ``capacity`` positions per row; streaming fills them in place and ``reset`` rewinds them."""

    def __init__(
        self,
        layer_rows: list[torch.Tensor],
        batch_size: int,
        n_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.capacity, self.batch_size = capacity, batch_size
        self.layer_rows = layer_rows
        self.layers = [KVCache(len(r), n_heads, head_dim, capacity, dtype, device) for r in layer_rows]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        """(B,) positions each stream holds (the same in every layer)."""

    def free(self) -> torch.Tensor:
        """(B,) positions each stream can still take."""
        return self.capacity - self.lengths

    def step(self, attention_mask: torch.Tensor, rope: RotaryEmbedding | None) -> dict[int, CacheStep]:
        """The write plan of the next tokens for each distinct row map.

        The write plan of the next tokens (``attention_mask`` (B, t): each stream's real new tokens, right-padded)
        for each distinct row map, keyed by its ``id``. A stream that would overflow the capacity is an error: the
        caller decides what to do at the maximum length (streaming restarts from a window)."""
        counts = attention_mask.sum(1)
        if bool((self.lengths + counts > self.capacity).any()):
            raise ValueError(f"a stream would pass the cache's capacity of {self.capacity} positions")
        t = attention_mask.shape[1]
        keys = int((self.lengths + counts).max()) if t else 0
        plans: dict[int, CacheStep] = {}
        for rows in self.layer_rows:
            if id(rows) in plans:
                continue
            start = self.lengths[rows]  # (R,)
            offsets = torch.arange(t, device=start.device)
            positions = (start[:, None] + offsets).clamp(max=self.capacity - 1)  # (R, t); padding kept in range
            real = attention_mask[rows]  # (R, t)
            r, o = real.nonzero(as_tuple=True)
            mask = torch.arange(keys, device=start.device) <= positions[:, :, None]  # (R, t, K)
            rotation = rope.at(positions)[:, None] if rope is not None else None
            plans[id(rows)] = CacheStep(r, positions[r, o], o, mask[:, None], keys, rotation, positions)
        return plans

    def advance(self, attention_mask: torch.Tensor) -> None:
        self.lengths += attention_mask.sum(1)

    def reset(self) -> None:
        """Forget every stream's history (the tensors stay: the next tokens are written from position 0)."""
        self.lengths.zero_()

    def nbytes(self) -> int:
        """Bytes the caches' storage takes."""
        return sum(layer.nbytes() for layer in self.layers)


class SwiGLU(nn.Module):
    """The plain MLP of the 'mlp' (hard sharing) variant."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)  # zero-initialised by the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
