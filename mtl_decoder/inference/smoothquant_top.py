"""W8A8 int8 for a hybrid model's trained top blocks: their attention and every expert copy of their MLP.

Mode hybrid runs its top blocks (``model.trunk.train_top``, top_mode upcycle) once per route, each with an expert
block of several trained copies of the pretrained MLP: on SmolLM2 with 2 top blocks, 3 routes and 4 experts per
token, they cost about seven cached blocks' work, so with only the cached blocks in int8 they were over half of a
W8A8 model's time (benchmarks/results/pretrained_throughput_hybrid_bidir.json: 2.8x on the 16 cached blocks gave
1.7x on the whole hybrid). Here they go int8 too, smoothed the same way as the cached blocks (smoothquant.py), with
two differences the expert block makes:

    mlp_in   every expert of every route reads the same normed tokens: one scale per channel, the largest over
             all of them, into post_attention_layernorm's weight; every expert's gate/up columns and every gate's
             columns (the gates stay float32, their softmax read from the same input) multiplied by it
    down_in  one scale per expert (each has its own SwiGLU product), into that expert's up rows and down columns

Calibration runs the whole model in float32 through the ``Predictor`` on the calibration texts (the top blocks
read the cached blocks' states, and only the real tokens of each route's rows count). Scales are keyed
``top.{block}.{group}`` (``top.{block}.down_in.{expert}``) beside the cached blocks' own in the folder's one scales
file; a folder whose scales lack them keeps its top blocks in float32, as before they existed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from mtl_decoder.errors import UserError
from mtl_decoder.inference.smoothquant import (
    PROJECTIONS,
    Int8Linear,
    SmoothQuantSettings,
    attention_scales,
    channel_scale,
    fold_attention,
    fold_down,
    kv_layout,
    range_recorder,
)

TOP = "top."
"""Key prefix of the top blocks' scales."""


@dataclass
class TopBlock:
    """One trained top block as int8 sees it."""

    block: nn.Module
    """The transformers decoder block (self_attn, input/post_attention layernorms)."""
    experts: list[nn.Module]
    """Every MLP the block's expert block runs (gate_proj, up_proj, down_proj each), task groups then shared."""
    gates: list[nn.Module]
    """The gates reading the MLP's input (``.proj`` Linear, float32)."""


def top_blocks(model: nn.Module) -> list[TopBlock]:
    """The trained top blocks of a hybrid model (upcycled experts); none for any other model."""
    from mtl_decoder.model.pretrained.adapters import CopiedExperts, RoutedMLP
    from mtl_decoder.model.pretrained.hub import decoder_layers

    top = getattr(model, "top", None)
    if top is None or model.cfg.trunk.top_mode != "upcycle":
        return []
    out = []
    for layer in decoder_layers(top):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(isinstance(getattr(attn, n, None), nn.Linear | Int8Linear) for n in PROJECTIONS[:4]):
            return []  # not a Llama-style block (smoothquant.blocks_of refuses such a trunk's cached part)
        if isinstance(mlp, RoutedMLP):
            block = mlp.block
            groups = [*block.task_experts.values(), block.shared]
            if not all(isinstance(g, CopiedExperts) for g in groups):
                return []
            experts = [e for g in groups for e in g.experts]
            gates = [*block.task_gates.values(), *([block.shared_gate] if block.shared_gate is not None else [])]
        else:  # a shared-bottom block below the expert layers: the pretrained MLP itself
            experts, gates = [mlp], []
        if not all(isinstance(getattr(e, n, None), nn.Linear | Int8Linear) for e in experts for n in PROJECTIONS[4:]):
            return []
        out.append(TopBlock(layer, experts, [g.proj for g in gates]))
    return out


@torch.no_grad()
def calibrate_top(model: nn.Module, run: Callable[[], None]) -> dict[str, torch.Tensor]:
    """max|x_j| of every smoothed input of the top blocks over the real tokens ``run()`` sends through ``model``."""
    tops = top_blocks(model)
    amax: dict[str, torch.Tensor] = {}
    real: dict[str, torch.Tensor] = {}
    record = range_recorder(amax, real)

    def rows_mask(_module, _args, kwargs):  # the routes' rows (N, T): which of the attention inputs are real tokens
        real["mask"] = kwargs["attention_mask"].bool()

    hooks = [model.top.register_forward_pre_hook(rows_mask, with_kwargs=True)]
    for i, t in enumerate(tops):
        attn = t.block.self_attn
        hooks.append(attn.q_proj.register_forward_pre_hook(record(f"{TOP}{i}.attn_in")))
        hooks.append(attn.o_proj.register_forward_pre_hook(record(f"{TOP}{i}.o_in")))
        for e, expert in enumerate(t.experts):
            hooks.append(expert.gate_proj.register_forward_pre_hook(record(f"{TOP}{i}.mlp_in")))
            hooks.append(expert.down_proj.register_forward_pre_hook(record(f"{TOP}{i}.down_in.{e}")))
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    missing = [f"{TOP}{i}.attn_in" for i in range(len(tops)) if f"{TOP}{i}.attn_in" not in amax]
    if missing:
        raise UserError(f"int8 (W8A8): the calibration texts never reached the top blocks ({missing[0]})")
    return amax


def top_scales(
    model: nn.Module, amax: dict[str, torch.Tensor], settings: SmoothQuantSettings
) -> dict[str, torch.Tensor]:
    """The smoothing scales of the top blocks (keys as ``calibrate_top``'s)."""
    layout = kv_layout(model.top)
    a, scales = settings.alpha, {}
    for i, t in enumerate(top_blocks(model)):
        key = f"{TOP}{i}"
        scales[f"{key}.attn_in"], scales[f"{key}.o_in"] = attention_scales(
            t.block.self_attn, amax[f"{key}.attn_in"], amax[f"{key}.o_in"], a, layout
        )
        readers = [w for e in t.experts for w in (e.gate_proj.weight, e.up_proj.weight)]
        scales[f"{key}.mlp_in"] = channel_scale(amax[f"{key}.mlp_in"], readers, a)
        for e, expert in enumerate(t.experts):
            down = f"{key}.down_in.{e}"
            scales[down] = channel_scale(amax[down], [expert.down_proj.weight], settings.down_alpha)
    return scales


def has_top_scales(scales: dict[str, torch.Tensor]) -> bool:
    return any(k.startswith(TOP) for k in scales)


@torch.no_grad()
def fold_top_scales(model: nn.Module, scales: dict[str, torch.Tensor]) -> None:
    """Divide each top-block activation by its scale where it is made, multiply its readers' columns (in place)."""
    layout = kv_layout(model.top)
    for i, t in enumerate(top_blocks(model)):
        key = f"{TOP}{i}"
        fold_attention(t.block, scales[f"{key}.attn_in"], scales[f"{key}.o_in"], layout)
        s = scales[f"{key}.mlp_in"]  # every expert's gate/up and every gate read the same normed tokens
        t.block.post_attention_layernorm.weight.div_(s)
        for linear in [*(lin for e in t.experts for lin in (e.gate_proj, e.up_proj)), *t.gates]:
            linear.weight.mul_(s)
        for e, expert in enumerate(t.experts):
            fold_down(expert, scales[f"{key}.down_in.{e}"])


def quantize_top(model: nn.Module, scales: dict[str, torch.Tensor], settings: SmoothQuantSettings) -> list[str]:
    """Fold the top blocks' scales and put every Linear of their attention and experts in int8; the names replaced."""
    tops = top_blocks(model)
    needed = [f"{TOP}{i}.{g}" for i in range(len(tops)) for g in ("attn_in", "o_in", "mlp_in")]
    needed += [f"{TOP}{i}.down_in.{e}" for i, t in enumerate(tops) for e in range(len(t.experts))]
    missing = [k for k in needed if k not in scales]
    if missing:
        raise UserError(f"int8 (W8A8): the stored scales do not cover the model's top blocks (no {missing[0]})")
    fold_top_scales(model, scales)
    done = []
    for i, t in enumerate(tops):
        for name in PROJECTIONS[:4]:
            setattr(t.block.self_attn, name, Int8Linear(getattr(t.block.self_attn, name), settings.all_per_token))
            done.append(f"top.{i}.self_attn.{name}")
        for e, expert in enumerate(t.experts):
            for name in PROJECTIONS[4:]:
                per_token = settings.all_per_token or (settings.down_per_token and name == "down_proj")
                setattr(expert, name, Int8Linear(getattr(expert, name), per_token))
                done.append(f"top.{i}.expert{e}.{name}")
    return done
