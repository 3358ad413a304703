"""What a training run knows about itself: the typed state saved in every checkpoint, and the result."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STOP_REASONS = ("done", "early_stopping", "time_budget")
"""Why training ended: the step/epoch budget ran out, patience ran out, or training.max_minutes was spent."""


@dataclass
class TrainState:
    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """Epochs completed."""
    batches_in_epoch: int = 0
    """Batches of the current epoch already trained on (resume skips them)."""
    tokens: int = 0
    """Real (non-pad) tokens trained on by this process."""
    train_seconds: float = 0.0
    """Time in training steps and batch loading, summed over resumed sessions."""
    validation_seconds: float = 0.0
    best_score: float = -math.inf
    best_step: int = 0
    best_metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    bad_validations: int = 0
    """Validations since the best one (early stopping counts them)."""
    validations: list[dict[str, float]] = field(default_factory=list)
    """Every validation: its step and selection score."""
    stop_reason: str = "done"
    resumed_from: list[int] = field(default_factory=list)
    """Steps at which this run was resumed (empty for an unbroken run)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def validated_at_this_step(self) -> bool:
        return bool(self.validations) and self.validations[-1]["step"] == self.step


@dataclass
class TrainResult:
    output_dir: Path
    best_dir: Path
    best_step: int
    best_score: float
    best_metrics: dict[str, dict[str, Any]]
    steps: int
    wall_time_s: float
    """Training wall time: steps and validations, summed over resumed sessions."""
    tokens_per_s: float = 0.0
    """Real (non-pad) training tokens per second of training steps, all processes together."""
    parameters: int = 0
    stop_reason: str = "done"
    """One of STOP_REASONS."""
    resumed_from: list[int] = field(default_factory=list)
    """Steps at which the run was resumed; a resumed run's memory and speed figures are its last session's."""
    state_cache_seconds: float = 0.0
    """Mode frozen: time spent computing the pretrained trunk's states before training (this session; not in
    wall_time_s)."""

    @property
    def stopped_early(self) -> bool:
        return self.stop_reason == "early_stopping"

    def summary(self) -> dict[str, Any]:
        """summary.json."""
        return {
            "best_step": self.best_step,
            "best_score": self.best_score,
            "steps": self.steps,
            "stopped_early": self.stopped_early,
            "stop_reason": self.stop_reason,
            "resumed_from": self.resumed_from,
            "wall_time_s": self.wall_time_s,
            "state_cache_seconds": self.state_cache_seconds,
            "tokens_per_s": self.tokens_per_s,
            "parameters": self.parameters,
            "validation": self.best_metrics,
        }
