"""Setting up a run: read and check the data, build or load the tokenizer, encode, build the optimizer."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mtl_decoder.config import ExperimentConfig, TrainingConfig
from mtl_decoder.data import EncodedExample, MultiTaskDataset, encode_example
from mtl_decoder.pretrained import LABELS_FILE
from mtl_decoder.tasks import Source, check_labels, infer_labels, load_split
from mtl_decoder.tokenization import TOKENIZER_FILE, TextEncoder, load_pretrained_tokenizer, train_tokenizer


@dataclass
class RunData:
    train_sources: list[Source]
    validation_sources: list[Source]
    label_sets: dict[str, list[str]]
    encoder: TextEncoder
    dataset: MultiTaskDataset
    report: list[str] = field(default_factory=list)
    """Human-readable lines: examples per source, skipped empty lines, repaired tags, truncations."""


def read_data(cfg: ExperimentConfig, run_dir: Path) -> tuple[list[Source], list[Source], dict[str, list[str]]]:
    """Train and validation sources, checked, with label sets (from the run directory when resuming)."""
    train = load_split(cfg.tasks, "train", repair_iob=cfg.data.repair_iob)
    saved = run_dir / LABELS_FILE
    if saved.is_file():
        label_sets = json.loads(saved.read_text(encoding="utf-8"))
    else:
        label_sets = {t.name: infer_labels(t, s.examples) for s in train for t in s.tasks}
    for source in train:
        check_labels(source, label_sets, "train")
    validation = load_split(cfg.tasks, "validation", repair_iob=cfg.data.repair_iob)
    for source in validation:
        check_labels(source, label_sets, "validation")
    return train, validation, label_sets


def make_tokenizer(cfg: ExperimentConfig, train: list[Source], run_dir: Path):
    """The run's tokenizer: the one saved in the run directory, a pretrained one, or trained on train texts."""
    saved = run_dir / TOKENIZER_FILE
    if saved.is_file():
        return load_pretrained_tokenizer(str(saved))
    if cfg.tokenizer.kind == "pretrained":
        return load_pretrained_tokenizer(cfg.tokenizer.pretrained)
    texts = (ex.words if ex.words is not None else ex.text for s in train for ex in s.examples)
    return train_tokenizer(texts, cfg.tokenizer)


def encode_sources(
    sources: list[Source], encoder: TextEncoder, label_sets: dict[str, list[str]], kinds: dict[str, str]
) -> tuple[list[list[EncodedExample]], list[str]]:
    label_ids = {t: {lab: i for i, lab in enumerate(labs)} for t, labs in label_sets.items()}
    encoded, report = [], []
    for source in sources:
        rows = [encode_example(ex, encoder, label_ids, kinds) for ex in source.examples]
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


def parameter_groups(model: nn.Module, extra: nn.Module | None, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: not on norms, biases, gates (their bias holds the shared-expert prior) or
    CRF transitions."""
    decay, no_decay = [], []
    modules = [("", model)] + ([("balancer.", extra)] if extra is not None else [])
    for prefix, module in modules:
        for name, p in module.named_parameters(prefix=prefix.rstrip(".")):
            if not p.requires_grad:
                continue
            plain = p.dim() >= 2 and "gate" not in name and "crfs" not in name and not name.startswith("balancer")
            (decay if plain else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(groups: list[dict], cfg: TrainingConfig) -> torch.optim.Optimizer:
    # The fused kernel is ~10x faster than the per-tensor loop on CPU; fall back where it is unsupported.
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, lr=cfg.lr)


def lr_lambda(cfg: TrainingConfig, total_steps: int):
    warmup = max(1, int(cfg.warmup_ratio * total_steps)) if cfg.warmup_ratio else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
