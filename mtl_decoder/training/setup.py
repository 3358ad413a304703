"""Setting up a run: read and check the data, build or load the tokenizer, encode, build the optimizer."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from mtl_decoder.config import ExperimentConfig, TrainingConfig
from mtl_decoder.data.batching import EncodedExample, MultiTaskDataset, encode_example
from mtl_decoder.data.tasks import Source, check_labels, infer_labels, load_split
from mtl_decoder.data.tokenization import TextEncoder, load_pretrained_tokenizer, train_tokenizer
from mtl_decoder.model.crf import CRF
from mtl_decoder.model.experts import Gate
from mtl_decoder.training.logging import RunLogger


@dataclass
class RunData:
    train_sources: list[Source]
    validation_sources: list[Source]
    label_sets: dict[str, list[str]]
    encoder: TextEncoder
    dataset: MultiTaskDataset
    report: list[str] = field(default_factory=list)
    """Human-readable lines: examples per source, skipped empty lines, repaired tags, truncations."""


def read_data(
    cfg: ExperimentConfig, stored_labels: dict[str, list[str]] | None = None
) -> tuple[list[Source], list[Source], dict[str, list[str]]]:
    """Train and validation sources, checked, with label sets (a resumed run's own, else inferred from train)."""
    train = load_split(cfg.tasks, "train", repair_iob=cfg.data.repair_iob)
    if stored_labels is not None:
        label_sets = stored_labels
    else:
        label_sets = {t.name: infer_labels(t, s.examples) for s in train for t in s.tasks}
    for source in train:
        check_labels(source, label_sets, "train")
    validation = load_split(cfg.tasks, "validation", repair_iob=cfg.data.repair_iob)
    for source in validation:
        check_labels(source, label_sets, "validation")
    return train, validation, label_sets


def make_tokenizer(cfg: ExperimentConfig, train: list[Source], stored: Path | None = None):
    """The run's tokenizer: a resumed run's own, the pretrained trunk's, a pretrained one, or one trained on the
    train texts."""
    if stored is not None:
        return load_pretrained_tokenizer(str(stored))
    if cfg.model.trunk.enabled:  # a pretrained trunk reads the ids of its own tokenizer
        from mtl_decoder.model.pretrained.hub import load_tokenizer

        return load_tokenizer(cfg.model.trunk)
    if cfg.tokenizer.kind == "pretrained":
        return load_pretrained_tokenizer(cfg.tokenizer.pretrained)
    texts = (ex.words if ex.words is not None else ex.text for s in train for ex in s.examples)
    return train_tokenizer(texts, cfg.tokenizer)


def encode_sources(
    sources: list[Source],
    encoder: TextEncoder,
    label_sets: dict[str, list[str]],
    kinds: dict[str, str],
    word_token: str = "first",
) -> tuple[list[list[EncodedExample]], list[str]]:
    label_ids = {t: {lab: i for i, lab in enumerate(labs)} for t, labs in label_sets.items()}
    encoded, report = [], []
    for source in sources:
        rows = [encode_example(ex, encoder, label_ids, kinds, word_token) for ex in source.examples]
        encoded.append(rows)
        names = "+".join(t.name for t in source.tasks)
        cut = [r for r in rows if r.truncated_words]
        line = f"{names}: {len(rows)} examples from {source.key}"
        if source.empty_lines:
            line += f"; {source.empty_lines} empty lines skipped"
        if source.repaired_tags:
            line += f"; {source.repaired_tags} IOB tags repaired to IOB2"
        if cut:
            line += (
                f"; {len(cut)} truncated to {encoder.max_length} sub-words "
                f"({sum(r.truncated_words for r in cut)} words beyond it train without labels)"
            )
        report.append(line)
    return encoded, report


NO_DECAY_MODULES = (nn.LayerNorm, nn.RMSNorm, Gate, CRF)
"""Modules none of whose parameters decay: norms, gates (their bias holds the shared-expert prior), CRF scores."""


def parameter_groups(model: nn.Module, extra: nn.Module | None, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices only, chosen by the module that owns a parameter and its shape, never by
    its name: no decay inside NO_DECAY_MODULES, on biases and other vectors, nor on ``extra`` (the balancer)."""
    exempt = {id(p) for m in model.modules() if isinstance(m, NO_DECAY_MODULES) for p in m.parameters()}
    if extra is not None:
        exempt |= {id(p) for p in extra.parameters()}
    decay, no_decay = [], []
    for module in [model] + ([extra] if extra is not None else []):
        for p in module.parameters():
            if p.requires_grad:
                (no_decay if id(p) in exempt or p.dim() < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(groups: list[dict], cfg: TrainingConfig) -> torch.optim.Optimizer:
    # The fused kernel is ~10x faster than the per-tensor loop on CPU; fall back where it is unsupported.
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, lr=cfg.lr)


def lr_lambda(cfg: TrainingConfig, total_steps: int, budget_spent: Callable[[], float] | None = None):
    """The learning-rate factor of each optimizer step (LambdaLR): linear warm-up over warmup_ratio of the run,
    then the schedule's decay to 0 at ``total_steps``.

    ``budget_spent``: where training.max_minutes is set, a function giving the fraction of it spent so far. The
    run's progress is then the larger of the step fraction and the time fraction (factor(step) is that of step
    max(step, spent * total_steps)), so a run that the wall-clock cap stops before its last step still ends
    with the rate decayed, as an unbroken run would; while the steps are ahead of the clock nothing changes."""
    warmup = max(1, int(cfg.warmup_ratio * total_steps)) if cfg.warmup_ratio else 0

    def factor(step: int) -> float:
        if budget_spent is not None:
            step = max(step, min(1.0, budget_spent()) * total_steps)
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def precompute_trunk_states(
    model: nn.Module, data: RunData, accelerator: Accelerator, batch_size: int, log: RunLogger | None
) -> tuple[str, float]:
    """Mode frozen: the trunk's states of every training and validation text, computed once into the state cache
    (shared by runs) before training, so that their one-time cost is reported apart from training time. Returns
    the line to log and the seconds spent ("" and 0 for a model without a frozen trunk)."""
    states = getattr(model, "states", None)
    if states is None or not hasattr(states, "precompute"):
        return "", 0.0
    sequences = [ex.ids for ex in data.dataset.examples]
    for source in data.validation_sources:
        items = [ex.words if ex.words is not None else ex.text for ex in source.examples]
        sequences += [e.ids for e in data.encoder.encode_batch(items) if not e.truncated]
    cache = states.cache
    before = len(cache)
    bar = log.progress(len(sequences), 0, "trunk states", unit=" sequences") if log else None
    done = [0]

    def progress(n: int, total: int) -> None:
        if bar is not None:
            bar.total = total  # the distinct sequences not yet cached: what the trunk runs on
            bar.update(n - done[0])
        done[0] = n

    with accelerator.main_process_first():  # the main process computes, the others then find them
        if not accelerator.is_main_process:
            cache.rescan()
        computed, seconds = states.precompute(sequences, batch_size, progress)
    if bar is not None:
        bar.close()
    counts = states.precomputed
    report = (
        f"trunk states (layer {states.identity.layers} of {states.identity.source}): {computed:,} computed in "
        f"{seconds / 60:.1f} min, {counts.cached:,} from the cache ({before:,} entries), {counts.repeats:,} repeats "
        f"inside the data, at {cache.directory}"
    )
    return report, seconds
