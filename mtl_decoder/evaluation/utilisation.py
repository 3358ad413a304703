"""Expert utilisation from the gate weights the model returns with every forward (never from global state).

A ``UtilisationTracker`` is the Predictor's ``on_batch`` callback: for every layer and every gate it folds
the batch's (M_route, E) weights into streaming sums (sum, sum of squares, top-1 counts, entropy sum, and
per token-position bucket sums), so memory stays constant however large the evaluated split is.

Which tokens a gate's statistics cover: the real (non-pad) tokens, special tokens included, of the examples
evaluated for the gate's own task. Task gate k counts only batches run for task k (under ``ple`` every
task's route is computed for every example, but task k's gate on another task's examples says nothing
about task k); the ``ple`` shared gate counts every evaluated example. An input predicted in several
overlapping windows (longer than max_length) contributes the tokens of every window.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from mtl_decoder.config import SHARED
from mtl_decoder.model import MTLOutput, MultiTaskModel

COVERAGE = (
    "real (non-pad) tokens, special tokens included, of the examples evaluated for the gate's own task; "
    "the shared gate covers every evaluated example"
)
NO_GATES_NOTE = "model.ffn=mlp (hard sharing) has no experts or gates: no utilisation to report"


def bucket_labels(bounds: list[int]) -> list[str]:
    """Readable names of the position buckets: exclusive upper bounds, the last bucket open ('64+')."""
    labels, start = [], 0
    for end in bounds:
        labels.append(f"{start}-{end - 1}")
        start = end
    labels.append(f"{start}+")
    return labels


class GateStats:
    """Streaming sums of one gate's weights. Sums are float64 on the CPU so long runs do not drift."""

    def __init__(self, experts: list[str], bounds: list[int]):
        E, B = len(experts), len(bounds) + 1
        self.experts = experts
        self.shared = torch.tensor([name.startswith(f"{SHARED}/") for name in experts])
        self.bounds = bounds
        self.tokens = 0
        self.sum = torch.zeros(E, dtype=torch.float64)
        self.sumsq = torch.zeros(E, dtype=torch.float64)
        self.top1 = torch.zeros(E, dtype=torch.int64)
        self.entropy = 0.0
        self.bucket_tokens = torch.zeros(B, dtype=torch.int64)
        self.bucket_sum = torch.zeros(B, E, dtype=torch.float64)

    def add(self, weights: torch.Tensor, positions: torch.Tensor) -> None:
        """weights (M, E) rows summing to 1; positions (M,) each token's position in its sequence."""
        if weights.shape[0] == 0:
            return
        if weights.shape[1] != len(self.experts):
            raise ValueError(f"gate weights have {weights.shape[1]} experts, expected {len(self.experts)}")
        w = weights.detach().to("cpu", torch.float64)
        self.tokens += w.shape[0]
        self.sum += w.sum(0)
        self.sumsq += (w * w).sum(0)
        self.top1 += torch.bincount(w.argmax(-1), minlength=w.shape[1])  # ties go to the first expert
        self.entropy += float(torch.special.entr(w).sum())
        bounds = torch.tensor(self.bounds, dtype=torch.long)
        bucket = torch.bucketize(positions.detach().cpu().long(), bounds, right=True)  # bounds[i-1] <= p < bounds[i]
        self.bucket_tokens += torch.bincount(bucket, minlength=len(self.bounds) + 1)
        self.bucket_sum.index_add_(0, bucket, w)

    def merge(self, other: GateStats) -> None:
        """Add the sums of the same gate over other examples (another process's share)."""
        self.tokens += other.tokens
        self.sum += other.sum
        self.sumsq += other.sumsq
        self.top1 += other.top1
        self.entropy += other.entropy
        self.bucket_tokens += other.bucket_tokens
        self.bucket_sum += other.bucket_sum

    def summary(self, dead_fraction: float) -> dict[str, Any]:
        """The gate's statistics as plain JSON values (see SCHEMA.md)."""
        E, n = len(self.experts), max(self.tokens, 1)
        mean = self.sum / n
        std = (self.sumsq / n - mean * mean).clamp(min=0).sqrt()
        threshold = dead_fraction / E
        positions = []
        for label, count, sums in zip(bucket_labels(self.bounds), self.bucket_tokens, self.bucket_sum, strict=True):
            count = int(count)
            bucket_mean = sums / count if count else None
            positions.append(
                {
                    "bucket": label,
                    "tokens": count,
                    "mean": _named(self.experts, bucket_mean) if count else None,
                    "shared_share": float(bucket_mean[self.shared].sum()) if count else None,
                }
            )
        return {
            "experts": list(self.experts),
            "tokens": self.tokens,
            "mean": _named(self.experts, mean),
            "std": _named(self.experts, std),
            "shared_share": float(mean[self.shared].sum()),
            # A one-expert gate has no choice to make: its normalised entropy is undefined (null).
            "normalised_entropy": self.entropy / n / math.log(E) if E > 1 else None,
            "top1_share": _named(self.experts, self.top1.double() / n),
            "dead_threshold": threshold,
            "dead_experts": [name for name, m in zip(self.experts, mean.tolist(), strict=True) if m < threshold],
            "positions": positions,
        }


def _named(names: list[str], values: torch.Tensor) -> dict[str, float]:
    return {name: float(v) for name, v in zip(names, values.tolist(), strict=True)}


class UtilisationTracker:
    """``on_batch(out, batch)`` for ``Predictor.predict``: accumulates every layer's gates from ``out.gates``."""

    def __init__(self, model: MultiTaskModel, position_buckets: list[int], dead_fraction: float):
        self.model, self.bounds, self.dead_fraction = model, list(position_buckets), dead_fraction
        self.blocks = model.expert_blocks()
        self.stats: list[dict[str, GateStats]] = [{} for _ in self.blocks]
        self.has_gates = any(block is not None for block in self.blocks)

    def __call__(self, out: MTLOutput, batch: dict[str, Any] | None = None) -> None:
        if not self.has_gates or out.layout is None:
            return
        layout = out.layout
        evaluated = set(out.logits)  # the tasks this batch was run for
        for layer_stats, block, gates in zip(self.stats, self.blocks, out.gates, strict=True):
            for gate, weights in gates.items():
                if gate != SHARED and gate not in evaluated:
                    continue  # task k's gate on examples evaluated for another task: not task k's utilisation
                span = layout.tokens(gate)
                if gate not in layer_stats:
                    layer_stats[gate] = GateStats(block.expert_names(gate, self.model.task_names), self.bounds)
                layer_stats[gate].add(weights, layout.token_position[span])

    def merge(self, shares: list[list[dict[str, GateStats]]]) -> None:
        """Merge every process's statistics into this one.

        The statistics of every process's share (``stats`` of each, in rank order; this one's among them) in
        place of this one's: the sums of one process over all the examples, up to float rounding."""
        merged: list[dict[str, GateStats]] = [{} for _ in self.blocks]
        for share in shares:
            for layer, layer_stats in zip(merged, share, strict=True):
                for gate, stats in layer_stats.items():
                    if gate in layer:
                        layer[gate].merge(stats)
                    else:
                        layer[gate] = copy.deepcopy(stats)
        self.stats = merged

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """layer_i -> gate -> statistics; gates in the model's order (tasks, then 'shared'); unseen gates left out."""
        order = [*self.model.task_names, SHARED]
        out = {}
        for i, layer_stats in enumerate(self.stats):
            gates = {g: layer_stats[g].summary(self.dead_fraction) for g in order if g in layer_stats}
            if gates:
                out[f"layer_{i}"] = gates
        return out

    def notes(self) -> list[str]:
        return [] if self.has_gates else [NO_GATES_NOTE]
