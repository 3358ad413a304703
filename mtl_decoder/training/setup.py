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
from mtl_decoder.data.recasing import Recaser, build_table
from mtl_decoder.data.tasks import Source, check_labels, infer_labels, load_split, source_key
from mtl_decoder.data.tokenization import TextEncoder, load_pretrained_tokenizer, train_tokenizer
from mtl_decoder.model.crf import CRF
from mtl_decoder.model.experts import Gate
from mtl_decoder.model.heads import MultiTaskModel
from mtl_decoder.model.trunks import trunk_for
from mtl_decoder.processes import deal
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
    """Read and check the train and validation sources.

    Train and validation sources, checked, with label sets (a resumed run's own, else inferred from train);
    the test split is read only to check its labels."""
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
    check_test_labels(cfg, label_sets)
    return train, validation, label_sets


def check_test_labels(cfg: ExperimentConfig, label_sets: dict[str, list[str]]) -> None:
    """Read and check the test split's labels.

    The test split of every task that has one, read and checked as validation is, then let go: a test label
    unseen in train would stop ``evaluate --split test`` after training, so it stops the run before."""
    names = [name for name, task in cfg.tasks.items() if source_key(task, "test") is not None]
    if names:
        for source in load_split(cfg.tasks, "test", names, repair_iob=cfg.data.repair_iob):
            check_labels(source, label_sets, "test")


def make_tokenizer(cfg: ExperimentConfig, train: list[Source], stored: Path | None = None):
    """The run's tokenizer.

    A resumed run's own, the pretrained trunk's, a pretrained one, or one trained on the
    train texts."""
    if stored is not None:
        return load_pretrained_tokenizer(str(stored))
    if trunk_for(cfg.model).pretrained:  # a pretrained trunk reads the ids of its own tokenizer
        from mtl_decoder.model.pretrained.hub import load_tokenizer

        return load_tokenizer(cfg.model.trunk)
    if cfg.tokenizer.kind == "pretrained":
        return load_pretrained_tokenizer(cfg.tokenizer.pretrained)
    texts = (ex.words if ex.words is not None else ex.text for s in train for ex in s.examples)
    return train_tokenizer(texts, cfg.tokenizer)


def make_recaser(cfg: ExperimentConfig, train: list[Source], stored: Path | None = None) -> Recaser:
    """How the run shows all-caps lines to its tokenizer (model.all_caps).

    For 'truecase', a resumed run's own table (``stored``: the run folder), else one built from the training
    texts."""
    mode = cfg.model.all_caps
    if mode != "truecase":
        return Recaser(mode)
    if stored is not None:
        return Recaser.load(stored, mode)
    lines = (ex.words if ex.words is not None else ex.text.split() for s in train for ex in s.examples)
    return Recaser(mode, build_table(lines))


def encode_sources(
    sources: list[Source],
    encoder: TextEncoder,
    label_sets: dict[str, list[str]],
    kinds: dict[str, str],
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


NO_DECAY_MODULES = (nn.LayerNorm, nn.RMSNorm, Gate, CRF)
"""Modules none of whose parameters decay: norms, gates (their bias holds the shared-expert prior), CRF scores."""


HELD_STEPS = "held_steps"
"""A parameter group's key: for this many optimizer steps its learning rate is held at 0 (its parameters stay as
they are, weight decay included), then it follows the run's schedule (``group_schedules``)."""


def parameter_groups(
    model: MultiTaskModel,
    extra: nn.Module | None,
    weight_decay: float,
    held: list[tuple[nn.Parameter, int]] = (),
) -> list[dict]:
    """The optimizer's parameter groups, with and without weight decay.

    Weight decay on weight matrices only, chosen by the module that owns a parameter and its shape, never by
    its name: no decay inside NO_DECAY_MODULES, on biases and other vectors, nor on ``extra`` (the balancer).
    ``held``: (parameter, steps) pairs, each put in a group of its own after the two, held for that many steps
    (``HELD_STEPS``); without them the groups are the two alone."""
    exempt = {id(p) for m in model.modules() if isinstance(m, NO_DECAY_MODULES) for p in m.parameters()}
    if extra is not None:
        exempt |= {id(p) for p in extra.parameters()}
    holding = {id(p): steps for p, steps in held}
    decay, no_decay, apart = [], [], []
    trained = model.trunk_kind.trained_parameters()  # what the trunk trains, in the model's parameter order
    for p in trained + ([p for p in extra.parameters() if p.requires_grad] if extra is not None else []):
        decays = id(p) not in exempt and p.dim() >= 2
        if id(p) in holding:
            apart.append({"params": [p], "weight_decay": weight_decay if decays else 0.0, HELD_STEPS: holding[id(p)]})
        else:
            (decay if decays else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}, *apart]


def group_schedules(groups: list[dict], factor: Callable[[int], float]) -> list[Callable[[int], float]]:
    """The learning-rate factor of each parameter group.

    ``factor`` (``lr_lambda``) for every group, but 0 for the first ``HELD_STEPS`` steps of a held one: LambdaLR
    gives step s (0-based) the factor of s, so the group's first ``HELD_STEPS`` steps change nothing."""

    def held(steps: int) -> Callable[[int], float]:
        return lambda step: 0.0 if step < steps else factor(step)

    return [held(g[HELD_STEPS]) if g.get(HELD_STEPS) else factor for g in groups]


def make_optimizer(groups: list[dict], cfg: TrainingConfig) -> torch.optim.Optimizer:
    # The fused kernel is ~10x faster than the per-tensor loop on CPU; fall back where it is unsupported.
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(groups, lr=cfg.lr)


def lr_lambda(cfg: TrainingConfig, total_steps: int, budget_spent: Callable[[], float] | None = None):
    """The learning-rate factor of each optimizer step.

    The learning-rate factor of each optimizer step (LambdaLR): linear warm-up over warmup_ratio of the run,
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
    """Compute a frozen trunk's states of every text before training.

    Mode frozen: the trunk's states of every training and validation text, computed once into the state cache
    (shared by runs) before training, so that their one-time cost is reported apart from training time. Returns
    the line to log and the seconds spent ("" and 0 for a model without a frozen trunk).

    Several processes split the work: each computes the missing ones among every n-th of the sequences (sorted by
    length, so the shares cost about the same) on its own device into the shared cache folder, then waits for the
    others and reads their shards, so n devices take about 1/n of the time."""
    states = model.trunk_kind.cached_states()
    if states is None:
        return "", 0.0
    sequences = [ex.ids for ex in data.dataset.examples]
    for source in data.validation_sources:
        items = [ex.words if ex.words is not None else ex.text for ex in source.examples]
        sequences += [e.ids for e in data.encoder.encode_batch(items) if not e.truncated]
    cache = states.cache
    accelerator.wait_for_everyone()  # every process looks at the cache as it is now
    cache.rescan()
    before = len(cache)
    mine = _share(sequences, accelerator.process_index, accelerator.num_processes)
    states.to(accelerator.device)  # the trunk only; the model follows in prepare
    bar = log.progress(len(mine), 0, "trunk states", unit=" sequences") if log else None
    done = [0]

    def progress(n: int, total: int) -> None:
        if bar is not None:
            bar.total = total  # the distinct sequences not yet cached: what the trunk runs on
            bar.update(n - done[0])
        done[0] = n

    computed, seconds = states.precompute(mine, batch_size, progress)
    if bar is not None:
        bar.close()
    accelerator.wait_for_everyone()  # the others' shards are on disk: index them
    cache.rescan()
    if accelerator.num_processes > 1:
        counts = accelerator.gather(torch.tensor([computed, seconds], dtype=torch.float64, device=accelerator.device))
        counts = counts.view(-1, 2)
        computed, seconds = int(counts[:, 0].sum()), float(counts[:, 1].max())  # wall time: the slowest share
    processes = f" by {accelerator.num_processes} processes" if accelerator.num_processes > 1 else ""
    distinct = len({tuple(ids) for ids in sequences})
    report = (
        f"trunk states (layer {states.identity.layers} of {states.identity.source}): {computed:,} computed in "
        f"{seconds / 60:.1f} min{processes}, {distinct - computed:,} from the cache ({before:,} entries), "
        f"{len(sequences) - distinct:,} repeats inside the data, at {cache.directory}"
    )
    from mtl_decoder.model.pretrained.layermix import cache_footprint  # the trunk's own imports stay lazy

    report += f"; {cache_footprint(states, sum(len(ids) for ids in sequences))}"
    return report, seconds


def _share(sequences: list[list[int]], rank: int, world: int) -> list[list[int]]:
    """This process's share of the distinct sequences.

    Every world-th of them, longest first (the same order on
    every process, so the shares do not overlap and cost about the same). ``precompute`` skips the cached ones."""
    distinct = sorted({tuple(ids) for ids in sequences})  # one order on every process; deal breaks ties by it
    return [list(ids) for ids in deal(distinct, len, rank, world)]
