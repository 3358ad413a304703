"""Distillation: a fast student learns from a slow teacher's soft targets.

Distillation: a fast student learns its tasks from a slow teacher's soft targets, on the labelled data and on
unlabelled text of the same kind (the transfer set).

    mtl-decoder distill --teacher RUN/best --config STUDENT.yaml [--unlabelled FILE ...] [--output-dir DIR]
                        [--resume | --overwrite] [key=value ...]

The student is trained by the ``Trainer`` (balancing, Accelerate, resume, validation and selection on the gold
labels, best/, the model card), which this module extends at two points: the dataset and collator carry the
teacher's targets, and each task's loss mixes the divergence from the teacher with the gold loss (``loss.py``).
The teacher labels every text once (under a launcher, each process its share: ``labelling.py``); its targets are
kept on disk (``targets.py``) and reused by later runs.
Everything that can refuse the pair (a task the teacher lacks, another label set, a teacher changed since the run's
targets were made) does so in one line before any work.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING, DistillConfig, ExperimentConfig, load_config
from mtl_decoder.data.batching import MultiTaskDataset
from mtl_decoder.distill.data import DistillCollator, attach_targets, encode_items, read_unlabelled, source_items
from mtl_decoder.distill.labelling import label_texts, target_shapes, targets_line
from mtl_decoder.distill.lexicon import (
    LEXICON_FILE,
    LEXICON_TABLE,
    build_lexicon,
    lexicon_line,
    read_lexicon_table,
    resolve_lexicon,
    take_lexicon,
)
from mtl_decoder.distill.loss import DistillLossSpec, classification_divergence, mix, tagging_divergence
from mtl_decoder.distill.states import (
    StateProjection,
    fit_projection,
    head_state_loss,
    state_part,
)
from mtl_decoder.distill.targets import TargetStore, teacher_fingerprint
from mtl_decoder.distill.targets import text_key as key_of
from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_json, atomic_write_safetensors
from mtl_decoder.model.heads import word_level
from mtl_decoder.saved import CONFIG_FILE, LABELS_FILE, REQUIRED_FILES, read_config, read_labels
from mtl_decoder.training.run_dir import RunDirectory
from mtl_decoder.training.setup import RunData
from mtl_decoder.training.state import TrainResult
from mtl_decoder.training.trainer import Trainer, run_trainer

__all__ = ["DISTILL_FILE", "DistillTrainer", "check_teacher", "distill"]

DISTILL_FILE = "distill.json"
"""In the run folder: the teacher, its fingerprint, and how many targets were computed or found in the cache."""


def distill(
    config: ExperimentConfig | str | Path,
    teacher: str | Path | None = None,
    overrides: list[str] = (),
    unlabelled: list[str] | None = None,
    output_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> TrainResult:
    """Distil a teacher into a student.

    Distil ``teacher`` (a saved model folder; default: distill.teacher) into the student ``config``;
    ``unlabelled`` (default: distill.unlabelled) are the transfer set's files. Returns what ``train`` returns."""
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, list(overrides))
    run_dir = Path(output_dir) if output_dir is not None else Path(config.training.output_dir)
    stored_hash = _stored_teacher_hash(run_dir) if resume or config.training.resume_from else None
    config = with_teacher(config, teacher, unlabelled, stored_hash)
    return run_trainer(DistillTrainer(config, output_dir, resume=resume, overwrite=overwrite))


def with_teacher(
    config: ExperimentConfig,
    teacher: str | Path | None,
    unlabelled: list[str] | None,
    stored_hash: str | None = None,
) -> ExperimentConfig:
    """The student's config with its distill section settled: ``unlabelled`` (default: distill.unlabelled) as the
    transfer set's files and ``teacher`` (default: distill.teacher) checked and recorded (``check_teacher``)."""
    settings = config.distill or DistillConfig()
    if unlabelled is not None:
        settings = dataclasses.replace(settings, unlabelled=[str(p) for p in unlabelled])
    teacher = teacher if teacher is not None else settings.teacher
    if teacher is None:
        raise UserError("distill needs a teacher: --teacher RUN/best (or distill.teacher in the config)")
    return check_teacher(dataclasses.replace(config, distill=settings), Path(teacher), stored_hash)


def check_teacher(config: ExperimentConfig, teacher: Path, stored_hash: str | None = None) -> ExperimentConfig:
    """Check a teacher-student pair and record the teacher.

    The student's config with its teacher recorded (folder, fingerprint) and, for a task without a ``labels``
    list, the teacher's; a one-line UserError where the pair cannot be distilled. Reads the teacher's config and
    labels only. A task's labels stay in the student's order (the ids in its files are read through it); the
    teacher's targets are put in that order when attached (``label_columns``). A student that inherits the
    teacher's lexicon gets its tokenizer (``lexicon.resolve_lexicon``)."""
    if not teacher.is_dir():
        raise UserError(f"--teacher {teacher}: no such model folder")
    for name in REQUIRED_FILES:
        if not (teacher / name).is_file():
            raise UserError(f"--teacher {teacher}: not a model folder (missing {name})")
    teacher_cfg = read_config(teacher / CONFIG_FILE)
    teacher_labels = read_labels(teacher / LABELS_FILE, teacher_cfg)
    tasks = dict(config.tasks)
    for name, task in config.tasks.items():
        theirs = teacher_cfg.tasks.get(name)
        if theirs is None:
            raise UserError(
                f"--teacher {teacher} has no task '{name}' (its tasks: {', '.join(teacher_cfg.tasks)}): a student "
                "learns only tasks its teacher predicts"
            )
        if theirs.kind != task.kind:
            raise UserError(f"task '{name}' is {task.kind} for the student but {theirs.kind} for --teacher {teacher}")
        labels = teacher_labels[name]
        if task.labels is not None and set(task.labels) != set(labels):
            raise UserError(
                f"config key 'tasks.{name}.labels': {sorted(task.labels)} is not --teacher {teacher}'s label set "
                f"{sorted(labels)}: student and teacher must share each task's labels"
            )
        if task.labels is None:  # the teacher's label set; a student's own list keeps its order (its files' ids)
            tasks[name] = dataclasses.replace(task, labels=list(labels))
    fingerprint = teacher_fingerprint(teacher, config.distill.teacher_precision)
    for pinned, where in ((config.distill.teacher_hash, "distill.teacher_hash"), (stored_hash, "the run's config")):
        if pinned is not None and pinned != fingerprint:
            raise UserError(
                f"--teacher {teacher} changed since the targets of {where} were made (fingerprint {pinned} -> "
                f"{fingerprint}): distil into a new --output-dir, or restore that teacher"
            )
    distill_cfg = dataclasses.replace(config.distill, teacher=str(teacher.resolve()), teacher_hash=fingerprint)
    return resolve_lexicon(dataclasses.replace(config, tasks=tasks, distill=distill_cfg), teacher, teacher_cfg)


def label_columns(teacher: Path, label_sets: dict[str, list[str]]) -> dict[str, list[int]]:
    """Per task, the teacher's target column of each of the student's labels, in the student's order."""
    labels = read_labels(teacher / LABELS_FILE, read_config(teacher / CONFIG_FILE))
    columns = {}
    for task, ours in label_sets.items():
        theirs = labels.get(task, [])
        if sorted(ours) != sorted(theirs):
            raise UserError(
                f"task '{task}': the run's labels {sorted(ours)} are not --teacher {teacher}'s label set "
                f"{sorted(theirs)}: student and teacher must share each task's labels"
            )
        columns[task] = [theirs.index(label) for label in ours]
    return columns


def _stored_teacher_hash(run_dir: Path) -> str | None:
    """The teacher fingerprint a run to resume was distilled with.

    The teacher fingerprint a run to resume was distilled with (None: not a distilled run, or no run there;
    the trainer's own resume checks report those)."""
    run = RunDirectory(run_dir)
    if not run.config.is_file():
        return None
    section = run.stored_config().get("distill") or {}
    return section.get("teacher_hash") if isinstance(section, dict) else None


STATE_KEYS = {TAGGING: "state_weight", CLASSIFICATION: "sentence_state_weight"}
"""The distill key that weights the teacher's states of each kind of task: per word, per text."""


def state_kinds(config: ExperimentConfig) -> list[str]:
    """The kinds of task whose teacher states the student learns (a distill weight above 0); a UserError naming the
    key where the student has no task of that kind."""
    kinds = {t.kind for t in config.tasks.values()}
    out = []
    for kind, key in STATE_KEYS.items():
        if getattr(config.distill, key) > 0:
            if kind not in kinds:
                what = "tagging" if kind == TAGGING else "classification"
                raise UserError(
                    f"distill.{key}: the student has no {what} task to take the teacher's states: leave it at 0"
                )
            out.append(kind)
    return out


class DistillTrainer(Trainer):
    """The Trainer with the teacher's targets in every batch and each task's loss mixed with them."""

    takes_lexicon = True

    def __init__(self, config: ExperimentConfig, output_dir=None, resume: bool = False, overwrite: bool = False):
        if config.distill is None or config.distill.teacher_hash is None:
            raise UserError("DistillTrainer needs a config from check_teacher (distill.teacher and teacher_hash)")
        super().__init__(config, output_dir, resume=resume, overwrite=overwrite)
        d = self.cfg.distill
        self.spec = DistillLossSpec(d.temperature, d.alpha, d.soft)
        self.kinds = {name: t.kind for name, t in self.cfg.tasks.items()}
        self.state_weights = {kind: getattr(d, key) for kind, key in STATE_KEYS.items()}  # by task kind
        self.with_states = state_kinds(self.cfg)  # a weight without a task of its kind stops the run here
        self.projections: dict[str, StateProjection] = {}
        self.unlabelled = read_unlabelled(d.unlabelled, d.unlabelled_limit)  # a bad record stops it before any work
        self.targets_line = self.lexicon_line = ""
        self.resumed = False

    # ------------------------------------------------------------------------------------------------ data

    def _setup_data(self, resumed: bool, to_remove: list[Path]) -> RunData:
        data = super()._setup_data(resumed, to_remove)
        self.resumed = resumed
        acc = self.accelerator
        train_items = source_items(data.train_sources)
        extra_items = [item for _, items in self.unlabelled for item in items]
        items = train_items + extra_items
        # Every process labels its share of the texts missing from the cache, then reads the others'. Building the
        # teacher draws from torch's RNG: forked, so the student starts from the same weights whether its targets
        # were cached or not.
        columns = label_columns(Path(self.cfg.distill.teacher), data.label_sets)
        with torch.random.fork_rng(devices=[]):
            shapes = target_shapes(self.kinds, data.label_sets)
            progress = acc.is_main_process and self.cfg.training.progress
            targets, counts, state_stores = label_texts(
                self.cfg.distill, items, shapes, self.kinds, self.with_states, acc, progress
            )
            found = [dict(targets.get(key_of(item))) for item in items]
        for kind, store in state_stores.items():
            self._attach_states(found, [key_of(item) for item in items], store, kind)
        encoded = data.dataset.examples + encode_items(extra_items, data.encoder)
        examples = attach_targets(encoded, items, found, data.encoder, self.kinds, columns)
        sizes = data.dataset.source_sizes + [len(texts) for _, texts in self.unlabelled]
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        weights = data.dataset.source_weights + [1.0] * len(self.unlabelled)  # an unlabelled file: weight 1
        dataset = MultiTaskDataset([examples[a:b] for a, b in itertools.pairwise(bounds)], weights)
        report = [f"unlabelled: {len(texts)} texts from {path}" for path, texts in self.unlabelled]
        d = self.cfg.distill
        self.targets_line = targets_line(d, counts)
        teacher = {
            "folder": d.teacher,
            "fingerprint": d.teacher_hash,
            "precision": d.teacher_precision,
            "temperature": d.temperature,
            "alpha": d.alpha,
            "soft": d.soft,
            "unlabelled": {path: len(texts) for path, texts in self.unlabelled},
        }
        for kind, name in ((TAGGING, "states"), (CLASSIFICATION, "sentence_states")):
            if kind in self.projections:
                teacher[name] = {"weight": self.state_weights[kind], **self.projections[kind].record()}
        self.card_info = {"teacher": teacher}
        if acc.is_main_process:
            atomic_write_json(self.run.path / DISTILL_FILE, {**teacher, "targets": counts})
        return dataclasses.replace(data, dataset=dataset, report=data.report + report)

    # ------------------------------------------------------------------------------------------------ lexicon

    def _initialise(self, model: torch.nn.Module) -> None:
        """A student with model.lexicon: its token-embedding table from the teacher's (frozen when freeze_steps -1).

        Made once, before the first step, by the main process (the others read it from the run folder); a resumed
        run takes the table from its checkpoint and only reads the record."""
        lexicon = self.cfg.model.lexicon
        if not lexicon.enabled:
            return
        acc, table_path, record_path = self.accelerator, self.run.path / LEXICON_TABLE, self.run.path / LEXICON_FILE
        if self.resumed:  # the table (a learned projection) comes from the checkpoint; a learned one's rows from here
            record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {}
            tensors = read_lexicon_table(table_path) if lexicon.projection == "learned" else None
        else:
            with acc.main_process_first(), torch.random.fork_rng(devices=[]):
                if acc.is_main_process:
                    rows = model.embed.weight.shape[0]
                    tensors, record = build_lexicon(Path(self.cfg.distill.teacher), self.cfg, rows, acc.device)
                    atomic_write_safetensors(table_path, tensors, metadata={"format": "pt"})
                    atomic_write_json(record_path, record)
                else:
                    tensors = read_lexicon_table(table_path)
                    record = json.loads(record_path.read_text(encoding="utf-8"))
        if tensors is not None:
            take_lexicon(model, tensors)
        if lexicon.frozen:
            model.embed.weight.requires_grad_(False)
        self.card_info.setdefault("teacher", {})["lexicon"] = record
        self.lexicon_line = lexicon_line(record, lexicon, self.cfg.model.d_model)

    def _held_parameters(self) -> list[tuple[torch.nn.Parameter, int]]:
        lexicon = self.cfg.model.lexicon
        if lexicon.enabled and lexicon.freeze_steps > 0:
            embed = self.model.embed  # a learned projection holds its projection, else the table is held
            return [(embed.projection if lexicon.projection == "learned" else embed.weight, lexicon.freeze_steps)]
        return []

    def _attach_states(self, found: list[dict], keys: list[str], store: TargetStore, kind: str) -> None:
        """Each entry's teacher states of ``kind``'s tasks, on the projection to the student's width, added to
        ``found``.

        The projection is fitted here, once, on the first FIT_WORDS states in the run's text order (the same texts
        give the same projection on resume); the states are then read a shard at a time and only their projection
        kept, at the student's width."""
        parts = [state_part(t) for t, k in self.kinds.items() if k == kind]
        setting = f"distill.{STATE_KEYS[kind]}"
        in_order = (entry[p] for entry in store.scan(keys) for p in parts if p in entry)
        projection = self.projections[kind] = fit_projection(in_order, self.cfg.model.d_model, setting)
        store.load(keys, transform=lambda part, t: projection(t) if part in parts else t)
        lost = sum(key not in store.memory for key in set(keys))
        if lost:  # a shard damaged since it was verified: set aside (with its warning), its texts labelled next run
            raise UserError(f"{setting}: {lost} texts' teacher states were unreadable; run the command again")
        for entry, key in zip(found, keys, strict=True):
            entry.update(store.get(key))
        store.forget()

    def _collator(self):
        counts = {name: len(labels) for name, labels in self.data.label_sets.items()}
        return DistillCollator(super()._collator(), self.kinds, counts)

    # ------------------------------------------------------------------------------------------------ loss

    def train(self) -> None:
        self.log.info(self.targets_line)
        if self.lexicon_line:
            self.log.info(self.lexicon_line)
        super().train()

    def _losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Per task: alpha * the divergence from the teacher + (1 - alpha) * the gold loss (where gold exists)."""
        targets = batch.pop("targets")
        routes = {
            task: mask.any(1) if mask.dim() == 2 else mask for task, (_, mask) in targets.items() if task in self.kinds
        }
        keep = any(w > 0 for w in self.state_weights.values())
        out = self.model(**batch, tasks=list(self.kinds), route_examples=routes, keep_hidden=keep)
        losses = {}
        for task, kind in self.kinds.items():
            if task not in out.logits:
                continue
            rows = out.examples[task]
            probs, mask = targets[task]
            if kind == TAGGING:
                emissions, _, words = word_level(out.logits[task], batch["word_read"][rows])
                kd = tagging_divergence(emissions, words, probs[rows], mask[rows], self.spec)
            else:
                kd = classification_divergence(out.logits[task], probs[rows], mask[rows], self.spec)
            loss = mix(kd, out.losses.get(task), self.spec.alpha)
            if state_part(task) in targets:
                states, has = targets[state_part(task)]
                word_read = batch["word_read"][rows] if kind == TAGGING else None
                regression = head_state_loss(out.hidden[task], word_read, states[rows], has[rows])
                if regression is not None:
                    weighted = self.state_weights[kind] * regression
                    loss = weighted if loss is None else loss + weighted
            if loss is not None:
                losses[task] = loss
        return losses
