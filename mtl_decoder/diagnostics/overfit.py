"""``overfit``: check that the model can learn one small batch by heart.

``overfit``: after any change to the model, can it still learn one small batch by heart, and does the saved
model give back what it learned?

    mtl-decoder overfit --config CFG [--steps N] [--threshold X] [--examples K] [--lr LR] [key=value ...]

The batch is the first K train examples of every task (read, labelled and tokenised exactly as ``train`` does:
label sets from the whole train split, the tokenizer trained on it). The model is the config's, with dropout and
word dropout off, trained by AdamW at a constant learning rate with no weight decay on the summed task losses,
until every task's loss is below the threshold or the steps run out. Then, in order (the first failure is named):

1. every task has a loss (its labels reach the model) and it stays finite;
2. every task's loss, in eval mode, is below the threshold;
3. the model saved with ``save_model`` and read back with ``load_model`` encodes the batch to the same ids and
   gives the same predictions and probabilities (through the Predictor, as predict and evaluate run it).

How many examples of the batch the fitted model predicts exactly as labelled is reported as a note, not a check:
a mean loss below the threshold can leave one token of a long sentence wrong.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mtl_decoder.config import CLASSIFICATION, ExperimentConfig, TrainingConfig
from mtl_decoder.data.batching import collator_for, encode_example
from mtl_decoder.data.tasks import Example, check_labels, infer_labels, load_split
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.diagnostics.defaults import OVERFIT_EXAMPLES, OVERFIT_LR, OVERFIT_STEPS, OVERFIT_THRESHOLD
from mtl_decoder.errors import UserError
from mtl_decoder.inference import Prediction, Predictor
from mtl_decoder.model import build_model
from mtl_decoder.runtime import default_device
from mtl_decoder.saved import load_model, save_model
from mtl_decoder.training.setup import make_optimizer, make_recaser, make_tokenizer

PROBABILITY_TOLERANCE = 1e-5
"""Largest difference of a class probability between the model and its saved copy."""


@dataclass
class OverfitResult:
    passed: bool
    failure: str | None
    """The first check that failed, in one line; None when all passed."""
    steps: int
    seconds: float
    losses: dict[str, dict[str, float]]
    """Task -> first, best and final (eval-mode) loss."""
    examples: dict[str, int]
    threshold: float
    checks: list[tuple[str, bool]] = field(default_factory=list)
    """(check, passed) in order; checks after the first failure are not run."""
    fit_examples: int | None = None
    """Examples of the batch the fitted model predicts exactly as labelled (a note; None when not measured)."""
    mismatch: str | None = None
    """The first example it does not predict as labelled."""

    def summary_lines(self) -> list[str]:
        lines = [f"{'task':12s} {'examples':>8s} {'first':>9s} {'best':>9s} {'final':>9s}"]
        for task, loss in self.losses.items():
            lines.append(
                f"{task:12s} {self.examples.get(task, 0):8d} {loss['first']:9.4f} {loss['best']:9.4f} "
                f"{loss['final']:9.4f}"
            )
        lines += [f"{'ok  ' if ok else 'FAIL'} {check}" for check, ok in self.checks]
        if self.fit_examples is not None:
            note = f" (first other: {self.mismatch})" if self.mismatch else ""
            lines.append(f"note: {self.fit_examples} example(s) of the batch predicted exactly as labelled{note}")
        if self.passed:
            lines.append(f"passed: every task below {self.threshold} in {self.steps} steps ({self.seconds:.1f} s)")
        else:
            lines.append(f"failed: {self.failure}")
        return lines


def overfit(
    config: ExperimentConfig,
    steps: int = OVERFIT_STEPS,
    threshold: float = OVERFIT_THRESHOLD,
    examples: int = OVERFIT_EXAMPLES,
    lr: float = OVERFIT_LR,
    device: str | torch.device | None = None,
) -> OverfitResult:
    """Fit one small batch per task.

    Fit one batch of ``examples`` train examples per task for at most ``steps`` steps; see the module
    docstring for the checks. Never raises for a failed check (the result says which); bad data or settings are
    a UserError."""
    if steps < 1 or examples < 1 or lr <= 0 or threshold <= 0:
        raise UserError("overfit: --steps and --examples must be at least 1, --lr and --threshold positive")
    cfg = quiet_config(config)
    torch.manual_seed(cfg.training.seed)
    device = torch.device(device) if device is not None else default_device()
    chosen, encoder, label_sets = one_batch(cfg, examples)
    kinds = {name: t.kind for name, t in cfg.tasks.items()}
    label_ids = {t: {lab: i for i, lab in enumerate(labs)} for t, labs in label_sets.items()}
    rows = [encode_example(ex, encoder, label_ids, kinds) for ex in chosen]
    batch = {k: _to(v, device) for k, v in collator_for(cfg.model, encoder.pad_id, kinds)(rows).items()}
    model = build_model(cfg, label_sets, encoder).to(device)

    started = time.perf_counter()
    with one_thread(device):
        result = _fit_and_check(model, batch, chosen, encoder, cfg, label_sets, steps, threshold, lr, device)
    result.seconds = time.perf_counter() - started
    result.passed = result.failure is None
    return result


def one_batch(cfg: ExperimentConfig, examples: int) -> tuple[list[Example], TextEncoder, dict[str, list[str]]]:
    """The train split's first examples, their encoder and label sets.

    The train split read and checked as ``train`` reads it, its label sets and tokenizer, and the first
    ``examples`` examples of every task: (examples, encoder, label sets)."""
    train = load_split(cfg.tasks, "train", repair_iob=cfg.data.repair_iob)
    label_sets = {t.name: infer_labels(t, s.examples) for s in train for t in s.tasks}
    for source in train:
        check_labels(source, label_sets, "train")
    encoder = TextEncoder.for_model(
        make_tokenizer(cfg, train), cfg.model, cfg.data.max_length, make_recaser(cfg, train)
    )
    return pick_examples(train, list(cfg.tasks), examples), encoder, label_sets


@contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """One intra-op thread on a CPU for the duration.

    A batch of a few short sentences gains nothing from a
    second thread and loses much when another process holds a core (a demo step can take several times as long
    with two threads while another job runs)."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _fit_and_check(
    model: nn.Module,
    batch: dict[str, Any],
    chosen: list[Example],
    encoder: TextEncoder,
    cfg: ExperimentConfig,
    label_sets: dict[str, list[str]],
    steps: int,
    threshold: float,
    lr: float,
    device: torch.device,
) -> OverfitResult:
    """Fit, then run the checks in order until the first failure."""
    kinds = {name: t.kind for name, t in cfg.tasks.items()}
    history, done, failure = fit(model, batch, list(cfg.tasks), steps, threshold, lr)
    counts = {task: sum(task in ex.labels for ex in chosen) for task in cfg.tasks}
    result = OverfitResult(False, failure, done, 0.0, history, counts, threshold)
    result.checks.append(("every task has a finite loss", failure is None))
    if failure is None:
        result.failure = _check_losses(model, batch, history, threshold, done, counts)
        result.checks.append((f"every task's loss below {threshold}", result.failure is None))
    items = [ex.words if ex.words is not None else ex.text for ex in chosen]
    if result.failure is None:
        preds = list(Predictor(model, encoder, label_sets, batch_size=len(items)).predict(items))
        result.fit_examples, result.mismatch = _agreement(chosen, preds, kinds)
        result.failure = _check_saved(model, encoder, cfg, label_sets, items, preds, device)
        result.checks.append(("the saved model reproduces the predictions", result.failure is None))
    return result


def quiet_config(config: ExperimentConfig) -> ExperimentConfig:
    """The config with dropout and word dropout off: the check is whether the model can fit, not regularise."""
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, dropout=0.0),
        data=dataclasses.replace(config.data, word_dropout=0.0),
    )


def pick_examples(sources: list, tasks: list[str], k: int) -> list[Example]:
    """The first ``k`` train examples carrying each task's label (an example may count for several tasks)."""
    chosen: list[Example] = []
    counts = dict.fromkeys(tasks, 0)
    for source in sources:
        for ex in source.examples:
            wanted = [t for t in ex.labels if t in counts and counts[t] < k]
            if not wanted:
                continue
            chosen.append(ex)
            for t in ex.labels:
                if t in counts:
                    counts[t] += 1
    return chosen


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value.to(device)


def fit(
    model: nn.Module, batch: dict[str, Any], tasks: list[str], steps: int, threshold: float, lr: float
) -> tuple[dict[str, dict[str, float]], int, str | None]:
    """Train on one batch until every task's loss is below a threshold.

    Train on ``batch`` until every task's loss is below ``threshold`` (or ``steps`` run out): per-task loss
    history (first, best, last seen), steps taken, and the first failure (a task without or with a non-finite
    loss), else None."""
    settings = TrainingConfig(lr=lr, weight_decay=0.0)
    optimizer = make_optimizer([{"params": list(model.parameters()), "weight_decay": 0.0}], settings)
    history: dict[str, dict[str, float]] = {}
    model.train()
    step = 0
    for step in range(steps + 1):
        out = model(**batch)
        missing = [t for t in tasks if t not in out.losses]
        if missing:
            return history, step, f"task '{missing[0]}' has no loss: its labels do not reach the model"
        for task, loss in out.losses.items():
            value = float(loss.detach())
            if not torch.isfinite(loss):
                return history, step, f"task '{task}' loss is {value} at step {step}: lower --lr or check the model"
            seen = history.setdefault(task, {"first": value, "best": value, "final": value})
            seen["best"], seen["final"] = min(seen["best"], value), value
        if step == steps or all(h["final"] < threshold for h in history.values()):
            break
        optimizer.zero_grad(set_to_none=True)
        sum(out.losses.values()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return history, step, None


@torch.no_grad()
def _check_losses(
    model: nn.Module,
    batch: dict[str, Any],
    history: dict[str, dict[str, float]],
    threshold: float,
    steps: int,
    counts: dict[str, int],
) -> str | None:
    model.eval()
    out = model(**batch)
    for task, loss in out.losses.items():
        history[task]["final"] = float(loss)
    for task, h in history.items():
        if not h["final"] < threshold:
            return (
                f"task '{task}' loss {h['final']:.4f} is not below {threshold} after {steps} steps (first "
                f"{h['first']:.4f}, best {h['best']:.4f}): the model cannot fit {counts[task]} examples; check that "
                "labels reach the loss, the masks, and the learning rate (--lr)"
            )
    return None


def _agreement(examples: list[Example], preds: list[Prediction], kinds: dict[str, str]) -> tuple[int, str | None]:
    """How many examples the fitted model predicts exactly as labelled (every task), and the first that is not.
    A note, not a check: a mean loss below the threshold can leave one token of a long sentence wrong."""
    matched, first = 0, None
    for ex, pred in zip(examples, preds, strict=True):
        wrong = [
            task
            for task, gold in ex.labels.items()
            if (pred.labels.get(task) if kinds[task] == CLASSIFICATION else pred.tags.get(task)) != gold
        ]
        matched += not wrong
        if wrong and first is None:
            first = f"line {ex.line} ({', '.join(wrong)})"
    return matched, first


def _check_saved(
    model: nn.Module,
    encoder: TextEncoder,
    cfg: ExperimentConfig,
    label_sets: dict[str, list[str]],
    items: list,
    preds: list[Prediction],
    device: torch.device,
) -> str | None:
    with tempfile.TemporaryDirectory(prefix="mtl-overfit-") as tmp:
        save_model(tmp, model, encoder, cfg, label_sets)
        saved = load_model(tmp, device)
        for item, a, b in zip(items, encoder.encode_batch(items), saved.encoder.encode_batch(items), strict=True):
            if a.ids != b.ids:
                return f"the saved tokenizer encodes {item!r} differently ({a.ids[:8]} vs {b.ids[:8]})"
        again = list(Predictor.from_saved(saved, batch_size=len(items)).predict(items))
    for i, (a, b) in enumerate(zip(preds, again, strict=True)):
        if a.tags != b.tags or a.labels != b.labels:
            return f"the saved model predicts otherwise on example {i + 1}: {_diff(a, b)}"
        for task, probs in a.probs.items():
            gap = max(abs(p - b.probs[task][label]) for label, p in probs.items())
            if gap > PROBABILITY_TOLERANCE:
                return f"the saved model's '{task}' probabilities differ by {gap:.2e} on example {i + 1}"
    return None


def _diff(a: Prediction, b: Prediction) -> str:
    for task in a.tags:
        if a.tags[task] != b.tags.get(task):
            return f"task '{task}' tags {a.tags[task]} vs {b.tags.get(task)}"
    for task in a.labels:
        if a.labels[task] != b.labels.get(task):
            return f"task '{task}' label {a.labels[task]!r} vs {b.labels.get(task)!r}"
    return "?"
