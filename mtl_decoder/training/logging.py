"""What a run reports to the person watching it and writes down.

What a run tells the person watching it, and what it writes down: a start banner, a tqdm bar per epoch
with per-task losses and balancing weights, ``metrics.jsonl`` (always) and Accelerate trackers
(TensorBoard when installed), and a final per-task summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from tqdm.auto import tqdm

from mtl_decoder.config import METRICS, ExperimentConfig
from mtl_decoder.files import atomic_write_text
from mtl_decoder.model.experts import shared_logit_bias
from mtl_decoder.model.trunks import trunk_for
from mtl_decoder.training.state import TrainResult


def start_banner(
    cfg: ExperimentConfig,
    data_report: list[str],
    label_sets: dict[str, list[str]],
    parameters: int,
    accelerator: Accelerator,
    total_steps: int,
    steps_per_epoch: int,
) -> list[str]:
    """What a run is about to do: model, device and precision, steps, data per source, tasks, gates, balancing."""
    m = cfg.model
    shape = trunk_for(m).describe()
    lines = [
        f"mtl-decoder: {parameters:,} parameters, ffn={m.ffn}, attention={m.attention}, {shape}",
        f"device: {accelerator.device.type} x {accelerator.num_processes} process(es), precision: "
        f"{cfg.training.mixed_precision}",
        f"steps: {total_steps} ({steps_per_epoch}/epoch, batch {cfg.data.batch_size} per process)",
        *data_report,
    ]
    for name, task in cfg.tasks.items():
        lines.append(f"task {name} ({task.kind}): {len(label_sets[name])} labels, primary metric {task.primary_metric}")
    if m.variant.task_experts:
        p, n_own = m.initial_shared_weight, m.n_task_experts
        bias = shared_logit_bias(p, n_own, m.n_shared_experts)
        line = f"gate bias init: shared-expert logits {bias:+.3f} -> task gates put {p:.0%} on the shared experts"
        if m.variant.shared_route:  # the shared gate's own experts are every task's experts
            shared = shared_logit_bias(p, n_own * len(cfg.tasks), m.n_shared_experts)
            line += f" (shared gate: {shared:+.3f}, also {p:.0%})"
        lines.append(line)
    guards = [
        f"{k} {v}"
        for k, v in (("min_weight", cfg.balancing.min_weight), ("max_weight", cfg.balancing.max_weight))
        if v is not None
    ]
    lines.append(
        f"balancing: {cfg.balancing.method}, scale {cfg.balancing.scale}" + (f", {', '.join(guards)}" if guards else "")
    )
    return lines


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, text: str) -> None: ...
    def close(self) -> None: ...


class RunLogger:
    def __init__(self, accelerator: Accelerator, metrics_file: Path, config: ExperimentConfig, progress: bool = True):
        self.acc, self.progress_enabled = accelerator, progress
        self.main = accelerator.is_main_process
        self.path = metrics_file
        self._losses: dict[str, list[float]] = {}
        self._weights: dict[str, float] = {}
        self._grad_norms: list[float] = []
        self._clipped = 0
        self._file = None
        if accelerator.log_with:
            accelerator.init_trackers("tensorboard", config=_flat(config.to_dict()))

    # ---------------------------------------------------------------------------------------------- output

    def info(self, text: str) -> None:
        if self.main:
            tqdm.write(text)

    def banner(self, lines: list[str]) -> None:
        for line in lines:
            self.info(line)

    def progress(self, total: int, done: int, desc: str, unit: str = "batch"):
        if not (self.main and self.progress_enabled):
            return _NoBar()
        return tqdm(total=total, initial=done, desc=desc, unit=unit, dynamic_ncols=True, leave=False)

    def _write(self, record: dict[str, Any]) -> None:
        if not self.main:
            return
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def truncate_after(self, step: int) -> None:
        """On resume: drop what a killed run logged after its checkpoint, so the log reads like one run."""
        if not (self.main and self.path.is_file()):
            return
        kept = [
            line
            for line in self.path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    # ---------------------------------------------------------------------------------------------- records

    def record_losses(self, values: dict[str, float], weights: dict[str, float]) -> None:
        for task, value in values.items():
            self._losses.setdefault(task, []).append(value)
        self._weights = weights

    def record_grad_norm(self, norm: float, clipped: bool) -> None:
        """One optimizer step's gradient norm before clipping, and whether the clip scaled the step down."""
        self._grad_norms.append(norm)
        self._clipped += clipped

    def train_step(self, step: int, epoch: int, lr: float, balancer, bar) -> None:
        losses = {t: sum(v) / len(v) for t, v in self._losses.items() if v}
        weights = balancer.weights()
        record: dict[str, Any] = {"type": "train", "step": step, "epoch": epoch + 1, "lr": lr}
        record.update({f"loss/{t}": v for t, v in losses.items()})
        record.update({f"weight/{t}": w * balancer.cfg.scale for t, w in weights.items()})
        if self._grad_norms:
            record["grad_norm"] = sum(self._grad_norms) / len(self._grad_norms)
            record["clipped_share"] = self._clipped / len(self._grad_norms)  # of the window's steps
        self._write(record)
        self.acc.log({k: v for k, v in record.items() if k != "type"}, step=step)
        bar.set_postfix_str("  ".join(f"{t} {losses[t]:.3f} x{weights[t]:.2f}" for t in losses))
        self._losses, self._grad_norms, self._clipped = {}, [], 0

    def validation(
        self,
        step: int,
        epoch: int,
        metrics: dict[str, dict[str, Any]],
        score: float,
        improved: bool,
        config: ExperimentConfig,
    ) -> None:
        record: dict[str, Any] = {"type": "validation", "step": step, "epoch": epoch, "score": score}
        for task, m in metrics.items():
            record.update({f"{task}/{k}": v for k, v in m.items() if isinstance(v, (int, float))})
        self._write(record)
        self.acc.log({f"validation/{k}": v for k, v in record.items() if k not in ("type", "step", "epoch")}, step=step)
        parts = [
            f"{t} {config.tasks[t].primary_metric} {m[config.tasks[t].primary_metric]:.4f}" for t, m in metrics.items()
        ]
        self.info(f"step {step}: validation {'  '.join(parts)}  score {score:.4f}{'  (best)' if improved else ''}")

    def summary(self, result: TrainResult, config: ExperimentConfig) -> None:
        if not self.main:
            return
        why = {"done": "", "early_stopping": " (early stop)", "time_budget": " (time budget)"}[result.stop_reason]
        lines = [
            f"done: {result.steps} steps in {result.wall_time_s / 60:.1f} min{why}, {result.tokens_per_s:,.0f} "
            f"tokens/s; best at step {result.best_step} (score {result.best_score:.4f}) -> {result.best_dir}"
        ]
        for task, m in result.best_metrics.items():
            keys = [k for k in METRICS[config.tasks[task].kind] if k != "token_accuracy"]
            lines.append(f"  {task:<20} " + "  ".join(f"{k} {m[k]:.4f}" for k in keys))
        self.banner(lines)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Config as flat scalar hyper-parameters (TensorBoard's hparams take no lists or dicts)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    key = prefix.rstrip(".")
    if isinstance(tree, list):
        return {key: json.dumps(tree)}
    return {key: "none" if tree is None else tree}
