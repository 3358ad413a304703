"""``mtl-decoder distill --label-only``: the teacher's targets for a student config, into the cache, and no run.

Labelling is the costly half of distillation (a pretrained teacher reads every text once), and it needs no student:
it can run under a launcher with many processes, or on the machine with the accelerator, and stop part way (the
cache keeps every written shard, and a later run labels only what is missing). A ``distill`` run with the same
teacher, transfer set and targets then finds every text in the cache (``distill.json``: 0 computed) and only trains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate import Accelerator

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.distill.data import read_unlabelled, source_items
from mtl_decoder.distill.labelling import label_texts, target_shapes, targets_line
from mtl_decoder.distill.run import state_kinds, with_teacher
from mtl_decoder.training.setup import read_data
from mtl_decoder.training.trainer import multi_process_cpu


def label_only(
    config: ExperimentConfig,
    teacher: str | Path | None = None,
    unlabelled: list[str] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Label the student ``config``'s transfer set (its training texts and ``unlabelled``, default
    distill.unlabelled) with ``teacher`` (default: distill.teacher) into the target cache, with the states its
    distill weights ask for. Returns the counts (``Labelling.run``) with ``line`` (the log's summary) added. Under a
    launcher every process labels its share and returns when all have written theirs."""
    config = with_teacher(config, teacher, unlabelled)
    kinds = {name: t.kind for name, t in config.tasks.items()}
    states = state_kinds(config)
    extra = read_unlabelled(config.distill.unlabelled, config.distill.unlabelled_limit)  # a bad record stops here
    train, _, label_sets = read_data(config)
    items = source_items(train) + [item for _, texts in extra for item in texts]
    acc = Accelerator(cpu=multi_process_cpu())
    shapes = target_shapes(kinds, label_sets)
    _, counts, _ = label_texts(config.distill, items, shapes, kinds, states, acc, progress and acc.is_main_process)
    return {**counts, "line": targets_line(config.distill, counts)}
