"""Applying a gate table to a loaded model's expert blocks.

Applying a gate table (built by ``gate_build.build_gate_table``; see that module for what it holds): every expert
block of a loaded model reads its gate weights from the table, except near a bucket edge, drops the experts left
under the threshold, and runs each expert only on the tokens that still read it. ``remove_gate_table`` restores
the exact blocks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mtl_decoder.config import SHARED
from mtl_decoder.errors import UserError
from mtl_decoder.inference.gate_table import (
    GateEntry,
    GateStats,
    GateTable,
    check_settings,
    gates_of,
    weights_sha256,
)
from mtl_decoder.model import ExpertBlock, ExpertGroup, RouteLayout
from mtl_decoder.saved import SavedModel


def apply_gate_table(
    saved: SavedModel,
    table: GateTable | str | Path,
    threshold: float | None = None,
    edge_margin: float | None = None,
) -> GateStats:
    """Make every expert block of a saved model use a gate table.

    Make every expert block of ``saved``'s model use the table (until ``remove_gate_table``); ``threshold`` and
    ``edge_margin`` default to the table's. Returns the counters the blocks update."""
    if not isinstance(table, GateTable):
        table = GateTable.load(table)
    threshold = table.threshold if threshold is None else threshold
    edge_margin = table.edge_margin if edge_margin is None else edge_margin
    check_settings(table.buckets, threshold, edge_margin)
    model = saved.model
    sha = weights_sha256(saved)
    if table.weights_sha256 and sha and table.weights_sha256 != sha:
        raise UserError(
            f"the gate table was built from another model (weights {table.weights_sha256[:12]}..., this one "
            f"{sha[:12]}...): build it again for {saved.directory}"
        )
    gates = gates_of(model)
    expected = {(layer, name) for layer, name, _, _ in gates}
    if set(table.entries) != expected:
        raise UserError(
            f"the gate table's gates ({len(table.entries)}) are not this model's ({len(expected)}): build it again "
            f"for {saved.directory}"
        )
    for layer, name, _, block in gates:
        if table.entries[(layer, name)].experts != block.expert_names(name, model.task_names):
            raise UserError(f"the gate table's layer {layer} gate '{name}' mixes other experts: build it again")
    remove_gate_table(saved)
    stats = GateStats()
    for layer, block in enumerate(model.expert_blocks()):
        if block is not None:
            entries = {name: table.entries[(lay, name)] for lay, name in table.entries if lay == layer}
            block.forward = _TableBlock(block, entries, threshold, edge_margin, stats)
    return stats


def remove_gate_table(saved: SavedModel) -> None:
    """Back to the exact blocks."""
    for block in saved.model.expert_blocks():
        if block is not None and isinstance(block.__dict__.get("forward"), _TableBlock):
            del block.forward


class _TableBlock:
    """An expert block's forward with table gates and skipped experts.

    An expert block's forward with table gates and skipped experts (same inputs and outputs as
    ``ExpertBlock.forward``)."""

    def __init__(self, block: ExpertBlock, entries: dict[str, GateEntry], threshold: float, margin: float, stats):
        self.block, self.threshold, self.margin, self.stats = block, threshold, margin, stats
        self.entries = {}
        for name, entry in entries.items():
            bounds = torch.cat([torch.tensor([entry.low]), entry.edges.float(), torch.tensor([entry.high])])
            self.entries[name] = (entry.edges.float(), bounds, entry.means.float(), entry.low, entry.high)
        self.experts: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, layout: RouteLayout, fork: bool = False):
        block = self.block
        M_in = x.shape[0]
        device = x.device
        plan = [(route, route.columns()) for route in block.route_plan(layout, fork)]  # the block's own routes
        gates: dict[str, torch.Tensor] = {}
        needed: dict[tuple[int, int], torch.Tensor] = {}
        possible: dict[tuple[int, int], torch.Tensor] = {}
        for route, cols in plan:
            if route.gate is None:
                continue
            weights = self._weights(route.name, x[route.rows], block)
            gates[route.name] = weights
            for j, (group, e, col_rows) in enumerate(cols):
                key = (id(group), e)
                if key not in needed:
                    needed[key] = torch.zeros(M_in, dtype=torch.bool, device=device)
                    possible[key] = torch.zeros(M_in, dtype=torch.bool, device=device)
                needed[key][col_rows[weights[:, j] > 0]] = True
                possible[key][col_rows] = True

        outputs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        for _, cols in plan:
            for group, e, _ in cols:
                key = (id(group), e)
                if key in outputs:
                    continue
                idx = needed[key].nonzero().squeeze(1)
                inverse = torch.full((M_in,), -1, dtype=torch.long, device=device)
                inverse[idx] = torch.arange(len(idx), device=device)
                outputs[key] = (self._expert(group, e, x[idx]), inverse)
                self.stats.expert_rows += int(possible[key].sum())
                self.stats.expert_rows_run += len(idx)

        outs = []  # each route's mix (gates.mix_experts), expert by expert on the rows that kept it
        for route, cols in plan:
            out = x.new_zeros(len(route.rows), x.shape[1])
            if route.gate is None:  # ple's last layer: nothing reads the shared route
                outs.append(out)
                continue
            weights = gates[route.name]
            for j, (group, e, col_rows) in enumerate(cols):
                y, inverse = outputs[(id(group), e)]
                if len(y) == 0:  # no token reads this expert here
                    continue
                # every row at once: a row that dropped the expert has weight 0 and picks some computed row (finite)
                picked = y[inverse[col_rows].clamp(min=0)]
                out.addcmul_(weights[:, j : j + 1].to(y.dtype), picked)
            outs.append(out)
        return torch.cat(outs), gates

    def _weights(self, name: str, x: torch.Tensor, block: ExpertBlock) -> torch.Tensor:
        """(M, E): the bucket's mean weights (the real gate's near an edge), under-threshold experts dropped."""
        edges, bounds, means, low, high = self.entries[name]
        if edges.device != x.device:  # the model on an accelerator: the table follows it, once
            edges, bounds, means = (t.to(x.device) for t in (edges, bounds, means))
            self.entries[name] = (edges, bounds, means, low, high)
        norms = x.float().norm(dim=-1)
        which = torch.bucketize(norms, edges)
        weights = means[which]
        lo, hi = bounds[which], bounds[which + 1]
        width = (hi - lo) * self.margin
        near = (norms < low) | (norms > high)
        if self.margin >= 0.5:  # every token's real gate: only the skipping approximates
            near = torch.ones_like(near)
        elif len(edges):
            near |= ((which > 0) & (norms - lo < width)) | ((which < len(edges)) & (hi - norms < width))
        gate = block.shared_gate if name == SHARED else block.task_gates[name]
        n_near = int(near.sum())
        if n_near:
            weights = weights.clone()
            weights[near] = gate(x[near])
        self.stats.tokens += len(norms)
        self.stats.full_gates += n_near
        keep = (weights >= self.threshold) | (weights == weights.amax(dim=-1, keepdim=True))
        weights = weights * keep
        return weights / weights.sum(dim=-1, keepdim=True)

    def _expert(self, group, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` of ``group`` on the rows x: (n, C)."""
        if not isinstance(group, ExpertGroup):  # another kind of expert: run the group, keep the one
            return group(x)[e] if len(x) else x.new_zeros(0, x.shape[1])
        key = (id(group), e)
        if key not in self.experts:  # expert e's own weights, contiguous (read once: the model is not training)
            H = group.hidden
            self.experts[key] = (group.w_in[:, e * 2 * H : (e + 1) * 2 * H].contiguous(), group.w_out[e])
        w_in, w_out = self.experts[key]
        h = x @ w_in.to(x.dtype)
        gate, up = h[:, : group.hidden], h[:, group.hidden :]
        return (torch.nn.functional.silu(gate) * up) @ w_out.to(x.dtype)
