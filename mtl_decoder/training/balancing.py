"""Loss balancing: total = scale * sum_k w_k * L_k, with w_k chosen by the method.

ema          w_k = 1 / EMA_k(L_k)  (detached, decay beta, started at the first value), optionally kept
             within [min_weight, max_weight] x the mean weight: once a task's loss is tiny its weight
             would otherwise grow without bound
equal        w_k = 1
static       w_k = the task file's loss_weight
dwa          Liu et al. 2019: w_k = K softmax_k(r_k / T), r_k = L_k(e-1) / L_k(e-2) of epoch mean losses
uncertainty  Kendall et al. 2018: sum_k exp(-s_k) L_k + s_k, s_k = log sigma_k^2 learned
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
        known = [raw[t] for t in self.tasks if t in self.ema]
        mean = sum(known) / len(known) if known else 1.0
        return {t: mean * min(max(w / mean, lo or 0.0), hi or math.inf) for t, w in raw.items()}

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
                terms.append(torch.exp(-s) * loss + s)
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
