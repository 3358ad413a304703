"""Forward hooks that watch a model's inside while it runs.

Sub-layer output norms, attention entropy, and the
saturation of the experts' SwiGLU units. Modules are found by type (norms, ``SelfAttention``, ``ExpertBlock``,
``ExpertGroup``, ``SwiGLU``) and named by their path in the model (``layers.1.attn``), so any trunk built from
these pieces is covered.

Only real tokens count. A hook sees a (rows, T, C) tensor or the packed (M, C) real tokens; which positions of a
(rows, T) tensor are real is settled after the forward from the batch's attention mask and the output's route
layout (``Probes.finish``): rows are either the batch's examples or the layout's (example, route) rows.

Definitions:
- output norm: the root mean square of a token's output vector (||y|| / sqrt(C)); mean and standard deviation
  over real tokens. A norm module's *input* is the residual stream it reads (Pre-LN).
- token variance of a norm's output: per channel, the variance over real tokens; a channel whose variance is 0
  carries the same value for every token, so the sub-layer after it cannot tell tokens apart by it.
- attention entropy: softmax(QK^T / sqrt(D)) recomputed from the attention module's input (SDPA returns no
  weights), with the mask the module was given and its causal mode; entropy in nats per (row, head, query),
  normalised by log(number of keys the query may see). Queries that see a single key are left out.
- diagonal share: the weight a query puts on its own position.
- saturation: SwiGLU computes silu(g) * u. SiLU saturates on the negative side only: for g < -4, |silu(g)| < 0.08
  and |silu'(g)| < 0.06, so the unit passes almost nothing forward and almost no gradient back. The saturated
  share is the share of (token, unit) pairs with g < -SATURATION; a unit saturated on every token is dead.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.model import ExpertBlock, ExpertGroup
from mtl_decoder.model.layers import SelfAttention, SwiGLU, apply_rope

SATURATION = 4.0
"""A SwiGLU gate pre-activation below -SATURATION counts as saturated."""
NORM_TYPES = (nn.LayerNorm, nn.RMSNorm)


def is_norm(module: nn.Module) -> bool:
    """torch's norms, and a pretrained trunk's own (LlamaRMSNorm, Qwen2RMSNorm, ...) by their class name."""
    return isinstance(module, NORM_TYPES) or type(module).__name__.endswith(("RMSNorm", "LayerNorm"))


@dataclass
class _Pending:
    """A (rows, T) per-token value waiting for its real-token mask."""

    kind: str
    name: str
    values: torch.Tensor


@dataclass
class NormStats:
    """Streaming statistics of one module's per-token output RMS (and, for norms, input RMS and channels)."""

    out_rms: list[torch.Tensor] = field(default_factory=list)
    in_rms: list[torch.Tensor] = field(default_factory=list)
    channel_sum: torch.Tensor | None = None
    channel_sumsq: torch.Tensor | None = None
    tokens: int = 0
    non_finite: int = 0

    def add_channels(self, y: torch.Tensor) -> None:
        """y (M, C) real tokens' outputs."""
        y = y.detach().double().cpu()
        s, sq = y.sum(0), (y * y).sum(0)
        self.channel_sum = s if self.channel_sum is None else self.channel_sum + s
        self.channel_sumsq = sq if self.channel_sumsq is None else self.channel_sumsq + sq
        self.tokens += y.shape[0]

    def summary(self) -> dict[str, Any]:
        out = torch.cat(self.out_rms) if self.out_rms else torch.zeros(0)
        result: dict[str, Any] = {"tokens": int(out.numel()), **_mean_std(out, "output_rms")}
        if self.in_rms:
            result.update(_mean_std(torch.cat(self.in_rms), "input_rms"))
        if self.channel_sum is not None and self.tokens:
            mean = self.channel_sum / self.tokens
            var = (self.channel_sumsq / self.tokens - mean * mean).clamp(min=0)
            result["token_variance"] = float(var.mean())
            result["constant_channels"] = float((var <= 1e-12 * (1 + mean * mean)).double().mean())
        result["non_finite"] = self.non_finite
        return result


@dataclass
class AttentionStats:
    """Per head: sums of normalised entropy, entropy and diagonal share over real queries that see 2+ keys."""

    heads: int
    entropy: torch.Tensor = field(init=False)
    normalised: torch.Tensor = field(init=False)
    diagonal: torch.Tensor = field(init=False)
    queries: int = 0

    def __post_init__(self) -> None:
        self.entropy = torch.zeros(self.heads, dtype=torch.float64)
        self.normalised = torch.zeros(self.heads, dtype=torch.float64)
        self.diagonal = torch.zeros(self.heads, dtype=torch.float64)

    def summary(self) -> list[dict[str, float]]:
        n = max(self.queries, 1)
        return [
            {
                "head": h,
                "entropy": float(self.entropy[h] / n),
                "normalised_entropy": float(self.normalised[h] / n),
                "diagonal": float(self.diagonal[h] / n),
                "queries": self.queries,
            }
            for h in range(self.heads)
        ]


@dataclass
class SaturationStats:
    """Per expert of a group: saturated (token, unit) pairs, tokens, and units ever unsaturated."""

    saturated: torch.Tensor
    alive: torch.Tensor
    """(E, H) bool: the unit was above -SATURATION on at least one token."""
    tokens: int = 0

    def summary(self) -> dict[str, Any]:
        E, H = self.alive.shape
        pairs = max(self.tokens * H, 1)
        return {
            "tokens": self.tokens,
            "saturated_share": [float(s / pairs) for s in self.saturated.tolist()],
            "dead_units_share": [float(1 - a) for a in self.alive.double().mean(1).tolist()],
            "experts": E,
        }


class Probes:
    """Hooks on every norm, attention, expert block and expert group of a model.

    Hooks on every norm, attention, expert block and expert group of ``model``; use as a context manager
    around forward passes, calling ``finish(attention_mask, out)`` after each."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.norms: dict[str, NormStats] = defaultdict(NormStats)
        self.attention: dict[str, AttentionStats] = {}
        self.saturation: dict[str, SaturationStats] = {}
        self.pending: list[_Pending] = []
        self.handles: list[Any] = []
        self.order: list[str] = []
        """Module names in the order their forward first ran."""
        self.unmapped = 0
        """Recorded values dropped because their rows could not be matched to the batch's examples."""

    def __enter__(self) -> Probes:
        for name, module in self.model.named_modules():
            if is_norm(module):
                self.handles.append(module.register_forward_hook(self._norm_hook(name)))
            elif isinstance(module, SelfAttention):
                self.handles.append(module.register_forward_hook(self._attention_hook(name), with_kwargs=True))
            elif isinstance(module, (ExpertBlock, SwiGLU)):
                self.handles.append(module.register_forward_hook(self._output_hook(name)))
            if isinstance(module, (ExpertGroup, SwiGLU)):
                self.handles.append(module.register_forward_hook(self._saturation_hook(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # ------------------------------------------------------------------------------------------ hooks

    def _seen(self, name: str) -> None:
        if name not in self.order:
            self.order.append(name)

    def _norm_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            self._seen(name)
            x = args[0]
            self._per_token(name, "in_rms", _rms(x))
            self._per_token(name, "out_rms", _rms(output))
            if output.dim() == 2:  # packed real tokens: channel statistics right away
                self.norms[name].add_channels(output)
            else:
                self.pending.append(_Pending("channels", name, output.detach()))

        return hook

    def _output_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._seen(name)
            y = output[0] if isinstance(output, tuple) else output
            self._per_token(name, "out_rms", _rms(y))

        return hook

    def _attention_hook(self, name: str):
        def hook(module: SelfAttention, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            self._seen(name)
            self._per_token(name, "out_rms", _rms(output))
            x, mask, rope = _attention_inputs(args, kwargs)
            weights, visible = attention_weights(module, x, mask, rope)
            entropy = torch.special.entr(weights).sum(-1)  # (R, H, T)
            diagonal = weights.diagonal(dim1=-2, dim2=-1)  # (R, H, T)
            packed = torch.stack([entropy, diagonal, visible.to(entropy.dtype)], dim=-1)  # (R, H, T, 3)
            self.pending.append(_Pending("attention", name, packed.detach()))

        return hook

    def _saturation_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            g = gate_preactivations(module, args[0])  # (M, E, H)
            if g.shape[0] == 0:
                return
            below = g < -SATURATION
            stats = self.saturation.get(name)
            if stats is None:
                E, H = g.shape[1:]
                stats = SaturationStats(torch.zeros(E, dtype=torch.float64), torch.zeros(E, H, dtype=torch.bool))
                self.saturation[name] = stats
            stats.saturated += below.double().sum((0, 2)).cpu()
            stats.alive |= (~below).any(0).cpu()
            stats.tokens += g.shape[0]

        return hook

    def _per_token(self, name: str, kind: str, values: torch.Tensor) -> None:
        stats = self.norms[name]
        stats.non_finite += int((~torch.isfinite(values)).sum())
        if values.dim() == 1:  # packed real tokens
            getattr(stats, kind).append(values.cpu())
        else:
            self.pending.append(_Pending(kind, name, values))

    # ------------------------------------------------------------------------------------------ after a forward

    def finish(self, attention_mask: torch.Tensor, out: Any) -> None:
        """Keep the real tokens of the values recorded during the last forward.

        Keep the real tokens of every (rows, T) value recorded during the forward just run; a value whose rows
        are none of the batch's, the layout's or its shared bottom's is dropped (counted in ``unmapped``)."""
        layouts = _row_layouts(getattr(out, "layout", None))
        for item in self.pending:
            real = _row_mask(item.values.shape[0], attention_mask.bool(), layouts)
            if real is None:
                self.unmapped += 1
            elif item.kind in ("in_rms", "out_rms"):
                getattr(self.norms[item.name], item.kind).append(item.values[real].cpu())
            elif item.kind == "channels":
                self.norms[item.name].add_channels(item.values[real])
            else:
                self._add_attention(item.name, item.values, real)
        self.pending = []

    def _add_attention(self, name: str, packed: torch.Tensor, real: torch.Tensor) -> None:
        R, H, T, _ = packed.shape
        entropy, diagonal, visible = packed.unbind(-1)
        keep = real[:, None, :].expand(R, H, T) & (visible > 1)  # (R, H, T)
        stats = self.attention.setdefault(name, AttentionStats(H))
        normalised = entropy / visible.clamp(min=2).log()
        stats.entropy += (entropy * keep).sum((0, 2)).double().cpu()
        stats.normalised += (normalised * keep).sum((0, 2)).double().cpu()
        stats.diagonal += (diagonal * keep).sum((0, 2)).double().cpu()
        stats.queries += int(keep[:, 0].sum())

    def summary(self) -> dict[str, Any]:
        """norms: module -> statistics; attention: module -> per-head list; saturation: group -> per expert."""
        names = [n for n in self.order if n in self.norms]
        return {
            "norms": {n: self.norms[n].summary() for n in names},
            "attention": {n: self.attention[n].summary() for n in self.order if n in self.attention},
            "saturation": {n: s.summary() for n, s in self.saturation.items()},
        }


# ---------------------------------------------------------------------------------------------- pieces


def _rms(x: torch.Tensor) -> torch.Tensor:
    """Per-token root mean square over the last dimension, float32, detached."""
    x = x.detach().float()
    return x.pow(2).mean(-1).sqrt()


def _mean_std(values: torch.Tensor, prefix: str) -> dict[str, float]:
    values = values[torch.isfinite(values)].double()
    if values.numel() == 0:
        return {f"{prefix}_mean": float("nan"), f"{prefix}_std": float("nan")}
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_std": float(values.std(unbiased=False))}


def _row_layouts(layout: Any) -> list[torch.Tensor]:
    """The example of every row of the layout's streams: its routes' rows, and its shared bottom's if it has one."""
    if layout is None:
        return []
    bottom = getattr(layout, "bottom", None)
    return [layout.row_example] + ([bottom.row_example] if bottom is not None else [])


def _row_mask(rows: int, attention_mask: torch.Tensor, row_examples: list[torch.Tensor]) -> torch.Tensor | None:
    """The real-token mask of a tensor's rows, or None.

    (rows, T) real-token mask of a tensor whose rows are the batch's examples or one of the layout's row
    sets; None when the row count matches none of them."""
    for row_example in row_examples:
        if rows == row_example.shape[0]:
            return attention_mask[row_example]
    return attention_mask if rows == attention_mask.shape[0] else None


def _attention_inputs(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    names = ("x", "mask", "rope")
    values = list(args) + [kwargs[n] for n in names[len(args) :]]
    return values[0], values[1], values[2]


@torch.no_grad()
def attention_weights(
    module: SelfAttention, x: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An attention module's weights, recomputed in float32.

    softmax(QK^T / sqrt(D)) as the module computes it inside SDPA, in float32: (R, H, T, T) weights and the
    (R, H, T) number of keys each query may see (mask and causal mode applied)."""
    R, T, C = x.shape
    H = module.n_heads
    D = C // H
    bias = module.qkv.bias.float() if module.qkv.bias is not None else None
    qkv = F.linear(x.float(), module.qkv.weight.float(), bias)
    qkv = qkv.view(R, T, 3, H, D).permute(2, 0, 3, 1, 4)  # 3 x (R, H, T, D)
    q, k = apply_rope(qkv[:2], rope)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)  # (R, H, T, T)
    allowed = torch.ones(R, 1, T, T, dtype=torch.bool, device=x.device)
    if mask is not None:
        allowed = allowed & mask.bool()
    if module.causal:
        allowed = allowed & torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    allowed = allowed.expand(R, H, T, T)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return weights, allowed.sum(-1)


@torch.no_grad()
def gate_preactivations(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The SwiGLU gate inputs g (M, E, H) of an ExpertGroup's E experts, or of a plain SwiGLU (E = 1)."""
    x = x.detach().reshape(-1, x.shape[-1]).float()
    if isinstance(module, ExpertGroup):
        M = x.shape[0]
        return (x @ module.w_in.float()).view(M, module.n_experts, 2, module.hidden)[:, :, 0]
    gate, _ = (x @ module.up.weight.float().t()).chunk(2, dim=-1)
    return gate[:, None, :]
