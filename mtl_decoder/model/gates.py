"""The expert blocks' gate-and-mix rule, written plainly: the reference that every fast path computes.

    gate_weights       a gate's weights over its experts: the softmax of one linear layer, in float32
    mix_experts        a gate's mix: the weighted sum of its experts' outputs
    GateRoute          one gate of a block: the rows it reads and the expert groups it mixes (``route_plan``)
    reference_forward  an expert block's output from its route plan, ``gate_weights`` and ``mix_experts``

The fast paths compute the same: ``ExpertBlock`` (kernels.py's GateMix for cgc/mmoe, one linear layer for every
gate at a fork, ProgressiveMix and ProgressiveBlock for ple) and the gate table's sparse mix
(inference/gate_apply.py); tests/model/test_model_gates.py checks each against this module in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def gate_weights(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax(x W^T + b) over the experts, in float32 whatever x's dtype (autocast off). x (M, C); one gate:
    weight (E, C), bias (E,) -> (M, E); G gates reading the same tokens: weight (G, E, C), bias (G, E) -> (M, G, E)."""
    with torch.autocast(x.device.type, enabled=False):
        logits = F.linear(x.float(), weight.flatten(0, -2).float(), bias.flatten().float())
        return logits.view(*logits.shape[:-1], *bias.shape).softmax(dim=-1)


def mix_experts(weights: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """sum_e weights[:, e] * outputs[e], in the outputs' dtype: weights (M, E), outputs (E, M, C) -> (M, C)."""
    return torch.einsum("me,emc->mc", weights.to(outputs.dtype), outputs)


@dataclass
class GateRoute:
    """One route of an expert block's output, in the block's output order."""

    name: str
    """The route (a task, or SHARED)."""
    rows: torch.Tensor
    """(M_route,) the rows of the block's input the route's gate reads, one per output token."""
    gate: nn.Module | None
    """The route's gate; None where nothing reads the route after the block (ple's last layer: zeros)."""
    groups: list[tuple[nn.Module, torch.Tensor]]
    """The expert groups the gate mixes, in its weight order, each with the (M_route,) rows of the block's input
    it reads for the route's tokens."""

    def columns(self) -> list[tuple[nn.Module, int, torch.Tensor]]:
        """Per gate weight column: (expert group, expert, the rows of the block's input that expert reads)."""
        return [(group, e, rows) for group, rows in self.groups for e in range(group.n_experts)]


def reference_forward(
    block: nn.Module,
    x: torch.Tensor,
    layout,
    fork: bool = False,
    weights: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The reference gate-and-mix computation of an expert block.

    What ``ExpertBlock.forward(x, layout, fork)`` computes, route by route of ``block.route_plan``: every expert
    group on every row it reads, mixed by ``gate_weights`` (or the given ``weights``, gate name -> (M_route, E))."""
    out, gates = [], {}
    for route in block.route_plan(layout, fork):
        if route.gate is None:
            out.append(x.new_zeros(len(route.rows), x.shape[1]))
            continue
        x_route, proj = x[route.rows], route.gate.proj
        w = gate_weights(x_route, proj.weight, proj.bias) if weights is None else weights[route.name]
        outputs = torch.cat([group(x[rows]) for group, rows in route.groups])  # (E, M_route, C)
        out.append(mix_experts(w, outputs))
        gates[route.name] = w
    return torch.cat(out), gates
