"""Building a gate table (``gate_table.py`` says what one holds): a trained model run over a sample of inputs, every
gate's input norms and weights recorded and bucketed.

Kept apart from the table itself because it runs a ``Predictor``: the table is read and applied while a predictor is
being made (``loading`` -> ``gate_apply``), so only this builder may import the predictor."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from mtl_decoder.errors import UserError
from mtl_decoder.inference.gate_table import (
    DEFAULT_BUCKETS,
    DEFAULT_EDGE_MARGIN,
    DEFAULT_THRESHOLD,
    GateEntry,
    GateTable,
    check_settings,
    gates_of,
    weights_sha256,
)
from mtl_decoder.saved import SavedModel


def build_gate_table(
    saved: SavedModel,
    items: Iterable[str | list[str]],
    buckets: int = DEFAULT_BUCKETS,
    threshold: float = DEFAULT_THRESHOLD,
    edge_margin: float = DEFAULT_EDGE_MARGIN,
    batch_size: int | None = None,
    sample: dict[str, Any] | None = None,
) -> GateTable:
    """Build a gate table by running texts through the model.

    Run ``items`` (raw texts or word lists) through the model and bucket every gate's tokens by the norm of the
    gate's input; each bucket keeps its mean weights."""
    from mtl_decoder.inference.predictor import Predictor

    check_settings(buckets, threshold, edge_margin)
    model = saved.model
    gates = gates_of(model)
    if not gates:
        raise UserError(f"{saved.directory}: the model has no gates (model.ffn={model.cfg.ffn}): nothing to tabulate")
    seen: dict[tuple[int, str], list[tuple[torch.Tensor, torch.Tensor]]] = {(i, n): [] for i, n, _, _ in gates}
    handles = []
    for layer, block in enumerate(model.expert_blocks()):
        if block is None:
            continue

        # the block's inputs and the gate weights it returns (however it computes them): each gate's input norms
        def record(module, args, kwargs, output, layer=layer):
            x = args[0]
            layout = args[1] if len(args) > 1 else kwargs["layout"]
            fork = args[2] if len(args) > 2 else kwargs.get("fork", False)
            weights = output[1]
            for route in module.route_plan(layout, fork):
                if route.name in weights:
                    norms = x[route.rows].detach().float().norm(dim=-1).cpu()
                    seen[(layer, route.name)].append((norms, weights[route.name].detach().float().cpu()))

        handles.append(block.register_forward_hook(record, with_kwargs=True))
    records = 0
    try:
        predictor = Predictor.from_saved(saved, batch_size=batch_size, workers=1)
        for _ in predictor.predict(items):
            records += 1
    finally:
        for handle in handles:
            handle.remove()
    if records == 0:
        raise UserError("the sample holds no records: a gate table needs inputs to learn from")
    entries = {}
    for layer, name, _, block in gates:
        norms = torch.cat([n for n, _ in seen[(layer, name)]])
        weights = torch.cat([w for _, w in seen[(layer, name)]])
        entries[(layer, name)] = _bucket(norms, weights, buckets, block.expert_names(name, model.task_names))
    info = {"records": records, "tokens": int(sum(len(n) for n, _ in next(iter(seen.values()))))}
    return GateTable(entries, buckets, threshold, edge_margin, weights_sha256(saved), {**(sample or {}), **info})


def _bucket(norms: torch.Tensor, weights: torch.Tensor, buckets: int, experts: list[str]) -> GateEntry:
    quantiles = torch.linspace(0, 1, buckets + 1, dtype=torch.float64)[1:-1]
    edges = torch.quantile(norms.double(), quantiles).float() if len(norms) else torch.zeros(buckets - 1)
    which = torch.bucketize(norms, edges)  # (M,) in [0, K)
    counts = torch.bincount(which, minlength=buckets)
    sums = torch.zeros(buckets, weights.shape[1]).index_add_(0, which, weights)
    overall = weights.mean(0) if len(weights) else torch.full((weights.shape[1],), 1 / weights.shape[1])
    means = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], overall)  # an empty bucket: the mean
    low, high = (float(norms.min()), float(norms.max())) if len(norms) else (0.0, 0.0)
    return GateEntry(edges, low, high, means, counts, experts)
