"""Loss balancing: total = scale * sum_k w_k * L_k, with w_k chosen by the method.

ema          w_k = 1 / EMA_k(L_k) (detached, decay beta, started at the first value). With min_weight and/or
             max_weight set, the weights are first divided by their geometric mean and then bounded
             (``bounded_weights``): once a task's loss is tiny its weight would otherwise grow without bound.
equal        w_k = 1
static       w_k = the task file's loss_weight
dwa          Liu et al. 2019: w_k = K softmax_k(r_k / T), r_k = L_k(e-1) / L_k(e-2) of epoch mean losses
uncertainty  Kendall, Gal & Cipolla, CVPR 2018, eq. (10), the form for a softmax (classification) likelihood:
             a task's term is L_k / sigma_k^2 + log sigma_k = exp(-s_k) L_k + s_k / 2 with s_k = log sigma_k^2
             learned; its optimum is s_k = log(2 L_k), weight 1 / (2 L_k). Every task here has a softmax or CRF
             (a softmax over tag sequences) likelihood, so none takes the regression form
             exp(-s_k) L_k / 2 + s_k / 2 (nor exp(-s_k) L_k + s_k, which is twice the regression form).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from mtl_decoder.config import BalancingConfig


class LossBalancer(nn.Module):
    """Holds the state of the balancing method; an nn.Module so 'uncertainty' can learn its log-variances."""

    def __init__(self, cfg: BalancingConfig, tasks: list[str], static_weights: dict[str, float] | None = None):
        super().__init__()
        self.cfg, self.tasks = cfg, list(tasks)
        self.static = {t: (static_weights or {}).get(t, 1.0) for t in tasks}
        self.ema: dict[str, float] = {}
        self.epoch_sums: dict[str, list[float]] = {t: [0.0, 0] for t in tasks}
        self.epoch_means: list[dict[str, float]] = []
        self.log_vars = nn.Parameter(torch.zeros(len(tasks))) if cfg.method == "uncertainty" else None

    # ------------------------------------------------------------------------------------------ weights

    def observe(self, values: dict[str, float]) -> None:
        """Record this step's loss values (averaged over processes by the caller) before ``combine``."""
        for task, value in values.items():
            if self.cfg.method == "ema":
                prev = self.ema.get(task)
                self.ema[task] = value if prev is None else self.cfg.beta * prev + (1 - self.cfg.beta) * value
            acc = self.epoch_sums[task]
            acc[0] += value
            acc[1] += 1

    def weights(self) -> dict[str, float]:
        """The weight in force for every task (before the global scale)."""
        method = self.cfg.method
        if method == "equal":
            return dict.fromkeys(self.tasks, 1.0)
        if method == "static":
            return dict(self.static)
        if method == "uncertainty":
            return {t: math.exp(-float(s)) for t, s in zip(self.tasks, self.log_vars.detach(), strict=True)}
        if method == "dwa":
            return self._dwa_weights()
        return self._ema_weights()

    def _ema_weights(self) -> dict[str, float]:
        raw = {t: 1.0 / max(self.ema[t], 1e-12) if t in self.ema else 1.0 for t in self.tasks}
        lo, hi = self.cfg.min_weight, self.cfg.max_weight
        if lo is None and hi is None:
            return raw
        known = [t for t in self.tasks if t in self.ema]  # a task not seen yet keeps weight 1
        bounded = bounded_weights([raw[t] for t in known], lo or 0.0, hi or math.inf)
        return {**raw, **dict(zip(known, bounded, strict=True))}

    def _dwa_weights(self) -> dict[str, float]:
        if len(self.epoch_means) < 2:
            return dict.fromkeys(self.tasks, 1.0)
        last, before = self.epoch_means[-1], self.epoch_means[-2]
        ratios = {t: last.get(t, 1.0) / max(before.get(t, 1.0), 1e-12) for t in self.tasks}
        exps = {t: math.exp(r / self.cfg.temperature) for t, r in ratios.items()}
        total = sum(exps.values())
        return {t: len(self.tasks) * e / total for t, e in exps.items()}

    def combine(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        """The balanced total of the tasks present in this batch."""
        weights = self.weights()
        terms = []
        for task, loss in losses.items():
            if self.cfg.method == "uncertainty":
                s = self.log_vars[self.tasks.index(task)]
                terms.append(torch.exp(-s) * loss + 0.5 * s)  # Kendall et al. 2018, eq. (10), softmax form
            else:
                terms.append(weights[task] * loss)
        return self.cfg.scale * torch.stack(terms).sum()

    def end_epoch(self) -> None:
        means = {t: s / n for t, (s, n) in self.epoch_sums.items() if n}
        self.epoch_means.append(means)
        self.epoch_sums = {t: [0.0, 0] for t in self.tasks}

    # ------------------------------------------------------------------------------------------ state

    def state(self) -> dict[str, Any]:
        """JSON-able state (the learned log-variances travel with the model's optimizer state)."""
        out: dict[str, Any] = {"ema": self.ema, "epoch_sums": self.epoch_sums, "epoch_means": self.epoch_means}
        if self.log_vars is not None:
            out["log_vars"] = self.log_vars.detach().tolist()
        return out

    def load(self, state: dict[str, Any]) -> None:
        self.ema = dict(state["ema"])
        self.epoch_sums = {t: list(v) for t, v in state["epoch_sums"].items()}
        self.epoch_means = [dict(m) for m in state["epoch_means"]]
        if self.log_vars is not None and "log_vars" in state:
            with torch.no_grad():
                self.log_vars.copy_(torch.tensor(state["log_vars"]))


def bounded_weights(raw: list[float], lo: float, hi: float) -> list[float]:
    """Weights rescaled to geometric mean 1 and bounded.

    ``raw`` (positive) rescaled to geometric mean 1, each then kept within [lo, hi] with the geometric mean
    still 1: w_i = clip(c * raw_i, lo, hi), c chosen so that the product of the w_i is 1 (water-filling in log
    space). Needs lo <= 1 <= hi. Relative to the geometric mean, both bounds bind for any number of tasks: two
    tasks with raw weights 100 and 1 get 2 and 0.5 under [0.5, 2], a ratio of at most hi / lo. (Against the
    arithmetic mean, a cap of 2 could never bind with two tasks: neither weight can exceed twice their mean.)"""
    if not raw:
        return []
    logs = [math.log(r) for r in raw]
    log_lo, log_hi = (math.log(lo) if lo > 0 else -math.inf), math.log(hi)

    def clipped(shift: float) -> list[float]:
        return [min(max(x + shift, log_lo), log_hi) for x in logs]

    # sum(clipped(shift)) rises from len*log_lo to len*log_hi, piecewise linear between the points where some
    # task meets a bound: find the piece where it crosses 0 and solve the linear equation on it.
    points = sorted({b - x for x in logs for b in (log_lo, log_hi) if math.isfinite(b)})
    below = -math.inf
    for point in [*points, math.inf]:
        if point == math.inf or sum(clipped(point)) >= 0:
            if below == -math.inf:
                probe = point - 1.0
            elif point == math.inf:
                probe = below + 1.0
            else:
                probe = (below + point) / 2
            free = [x for x, v in zip(logs, clipped(probe), strict=True) if log_lo < v < log_hi]
            fixed = sum(v for v in clipped(probe) if not log_lo < v < log_hi)
            shift = (-fixed - sum(free)) / len(free) if free else probe
            return [math.exp(v) for v in clipped(shift)]
        below = point
    raise AssertionError("unreachable: the last piece always crosses")
