"""Small building blocks of the trunk: norms, rotary positions, attention, the SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate (..., T, D) queries and keys by their positions, as one complex multiply (the half-split form with
    chunk/cat was the slowest op of a CPU forward pass)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (..., T, D/2)
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


class Dropout(nn.Module):
    """Dropout drawing one random byte per element, so p moves in steps of 1/256 (0.1 acts as 26/256).

    torch's bernoulli dropout took 5.2 ms on a (2304, 256) tensor on the 2-core CPU this was built on, this
    1.9 ms; a training step calls dropout about nine times.
    """

    def __init__(self, p: float):
        super().__init__()
        self.threshold = round(p * 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        n = x.numel()
        words = torch.randint(0, 2**56, ((n + 6) // 7,), dtype=torch.int64, device=x.device)  # 7 random bytes each
        noise = words.view(torch.uint8).view(-1, 8)[:, :7].reshape(-1)[:n].view(x.shape)
        return x * (noise >= self.threshold) * (256.0 / (256 - self.threshold))


class SelfAttention(nn.Module):
    """Multi-head self-attention through torch SDPA; the mask carries causality and padding.

    No dropout on the attention probabilities: with it SDPA leaves its fused CPU kernel (3.4x slower)."""

    def __init__(self, d_model: int, n_heads: int, causal: bool):
        super().__init__()
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)  # zero-initialised by the model: identity at init

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor) -> torch.Tensor:
        """x (N, T, C); mask: a boolean key mask broadcastable to (N, H, T, T), or None when causal."""
        N, T, C = x.shape
        qkv = self.qkv(x).view(N, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)  # 3 x (N, H, T, D)
        q, k = apply_rope(qkv[:2], rope)  # queries and keys rotated together
        v = qkv[2]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(N, T, C))  # (N, T, C)


class SwiGLU(nn.Module):
    """The plain MLP of the 'mlp' (hard sharing) variant."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)  # zero-initialised by the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
