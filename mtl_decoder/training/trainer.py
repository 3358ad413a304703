"""The training recipe: setup -> train -> save -> cleanup, on one CPU, one GPU or many processes (Accelerate).

    mtl-decoder train --config configs/demo.yaml [--output-dir DIR] [--resume | --overwrite] [key=value ...]

``setup`` checks everything that can be checked cheaply first (the run folder, a resume's config), then reads
the data (bad data fails before anything is written), builds the model and restores a checkpoint; ``train``
(``TrainingLoop``, training/loop.py) steps, validates and checkpoints; ``save`` makes sure the last state is
validated and writes the summary.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import set_seed

from mtl_decoder.config import ExperimentConfig, load_config
from mtl_decoder.data.batching import MultiTaskBatchSampler, MultiTaskDataset, collator_for
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import ConfigError, UserError
from mtl_decoder.locks import PathLock
from mtl_decoder.model import build_model
from mtl_decoder.runtime import default_device
from mtl_decoder.termination import Terminated, Unwinder, terminate_unwinds
from mtl_decoder.training.balancing import LossBalancer
from mtl_decoder.training.checkpoints import latest_checkpoint, load_checkpoint, verify_checkpoint
from mtl_decoder.training.failures import ending
from mtl_decoder.training.logging import RunLogger
from mtl_decoder.training.loop import NonFiniteLoss, TrainingLoop
from mtl_decoder.training.memory import keep_freed_memory
from mtl_decoder.training.resume import check_data_unchanged, check_resume_changes, data_fingerprints
from mtl_decoder.training.run_dir import RunDirectory
from mtl_decoder.training.setup import (
    RunData,
    encode_sources,
    group_schedules,
    lr_lambda,
    make_optimizer,
    make_recaser,
    make_tokenizer,
    parameter_groups,
    precompute_trunk_states,
    read_data,
)
from mtl_decoder.training.state import TrainResult, TrainState

__all__ = ["NonFiniteLoss", "TrainResult", "Trainer", "run_trainer", "train"]


def train(
    config: ExperimentConfig | str | Path,
    overrides: list[str] = (),
    output_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> TrainResult:
    """Train a multi-task model.

    Returns where the best model went and its validation metrics. ``config`` is not
    modified (``output_dir`` overrides training.output_dir in the run's own copy). An error that would name one of
    the train command's flags names the argument of this function instead (``resume=True``, not ``--resume``)."""
    try:
        return run_training(config, overrides, output_dir, resume, overwrite)
    except (UserError, Terminated) as err:
        err.args = (python_terms(str(err)),)
        raise


PYTHON_ARGUMENTS = {"--resume": "resume=True", "--overwrite": "overwrite=True", "--output-dir": "output_dir"}
"""The train command's flags -> the arguments of ``train`` that do the same."""


def python_terms(message: str) -> str:
    """``message`` with the train command's flags replaced by ``train``'s arguments (``PYTHON_ARGUMENTS``)."""
    return re.sub(r"--(?:resume|overwrite|output-dir)\b(?!-)", lambda m: PYTHON_ARGUMENTS[m.group(0)], message)


def run_training(
    config: ExperimentConfig | str | Path,
    overrides: list[str] = (),
    output_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> TrainResult:
    """``train`` as the train command runs it: its errors name the command's flags."""
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, list(overrides))
    return run_trainer(Trainer(config, output_dir, resume=resume, overwrite=overwrite))


def run_trainer(trainer: Trainer) -> TrainResult:
    """Run a trainer from set-up to clean-up.

    setup -> train -> save -> cleanup, ending as ``failures.ending`` says when the run cannot go on (a run
    that fails before its first step leaves its folder as it found it)."""
    with terminate_unwinds() as trainer.unwinder:  # SIGTERM unwinds: temporaries go, the lock is let go
        try:
            trainer.setup()
            trainer.train()
            return trainer.save()
        except BaseException as err:
            main = trainer.accelerator is None or trainer.accelerator.is_main_process
            final = ending(err, trainer.run, trainer.started, main, trainer.state.step)
            if final is err:
                raise
            raise final from None
        finally:
            trainer.cleanup()


def multi_process_cpu() -> bool:
    """Whether the run is several processes on a CPU.

    Accelerate forms a gloo group for several CPU processes (torchrun, accelerate launch) only when told it
    runs on CPU; on a machine with an accelerator the launcher's device wins."""
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return several and default_device().type == "cpu"


class Trainer(TrainingLoop):
    """setup (this module) -> train, validate and keep (``TrainingLoop``) -> save -> cleanup."""

    takes_lexicon: ClassVar[bool] = False
    """Whether this trainer gives the model its teacher's lexicon (model.lexicon): distillation's does."""

    def __init__(
        self,
        config: ExperimentConfig,
        output_dir: str | Path | None = None,
        resume: bool = False,
        overwrite: bool = False,
    ):
        if output_dir is not None:  # the run's own copy: the caller's config is left as it was
            config = dataclasses.replace(
                config, training=dataclasses.replace(config.training, output_dir=str(output_dir))
            )
        if resume and overwrite:
            raise UserError("--resume continues a run and --overwrite starts it over: choose one")
        if config.model.lexicon.enabled and not self.takes_lexicon:
            raise ConfigError(
                "model.lexicon.source",
                f"'{config.model.lexicon.source}' inherits a teacher's table, and train has no teacher: run "
                "mtl-decoder distill --teacher RUN/best, or leave model.lexicon.source at none",
            )
        self.cfg = config
        self.run = RunDirectory(config.training.output_dir)
        self.resume, self.overwrite = resume or bool(config.training.resume_from), overwrite
        self.state = TrainState()
        self.verified: dict[str, Any] | None = None
        """The trainer state of the checkpoint to resume, checked against its manifest in setup."""
        self.accelerator: Accelerator | None = None
        self.log: RunLogger | None = None
        self.budget_spent = 0.0
        """Fraction of training.max_minutes spent, the same on every process (the schedule follows it)."""
        self.trunk_report, self.state_cache_seconds = "", 0.0
        """A frozen trunk's state precompute: its log line and its one-time cost (not training time)."""
        self.unwinder = Unwinder()
        """Holds SIGTERM back while the best model and its checkpoint are written (``train`` sets a live one)."""
        self.lock: PathLock | None = None
        self.started = False
        """Whether setup finished: a failure before that leaves the run folder as it was found."""
        self.card_info: dict[str, Any] = {}
        """More for best/'s info.json and model card (a distilled student names its teacher)."""

    # ------------------------------------------------------------------------------------------------ setup

    def setup(self) -> None:
        cfg = self.cfg
        ddp = DistributedDataParallelKwargs(find_unused_parameters=True)  # cgc/mmoe: absent routes skip experts
        tracker = "tensorboard" if importlib.util.find_spec("tensorboard") else None
        self.accelerator = acc = Accelerator(
            cpu=multi_process_cpu(),
            mixed_precision=cfg.training.mixed_precision,
            gradient_accumulation_steps=cfg.training.grad_accum_steps,
            log_with=tracker,
            kwargs_handlers=[ddp],
            project_dir=str(self.run.path),
        )
        checkpoint, honoured, to_remove = None, {}, []
        if acc.is_main_process:  # one process at a time in a run folder, from before its first look at it
            self.lock = self.run.lock()
        self.fingerprints = data_fingerprints(cfg)  # before the data is read: a later change is a change
        if self.resume:  # everything a resume needs is checked before anything is read or written
            checkpoint = self._checkpoint_to_resume()
            honoured = check_resume_changes(self.run.stored_config(), cfg.to_dict(), str(self.run.config))
            check_data_unchanged(self.run.stored_fingerprints(), self.fingerprints, str(self.run.data))
            self.verified = verify_checkpoint(checkpoint)  # a damaged file stops the run before the data is read
        else:
            to_remove = self.run.check_fresh(self.overwrite)
        acc.wait_for_everyone()  # every process has looked at the folder before the main one writes to it
        if cfg.training.keep_freed_memory:
            keep_freed_memory()
        set_seed(cfg.training.seed)  # the same initial weights on every process (DDP also broadcasts them)
        self.data = self._setup_data(resumed=checkpoint is not None, to_remove=to_remove)
        self.log = RunLogger(acc, self.run.metrics, cfg, progress=cfg.training.progress)
        self._setup_model()
        # Dropout and word dropout draw from torch's RNG: a different stream on every process, or every
        # process would drop the same units of its different examples.
        set_seed(cfg.training.seed, device_specific=True)
        if checkpoint is not None:
            self._restore(checkpoint, honoured)
        self.started = True

    def _checkpoint_to_resume(self) -> Path:
        self.run.check_resumable()
        explicit = self.cfg.training.resume_from
        if explicit:
            return Path(explicit)
        found = latest_checkpoint(self.run.checkpoints)
        if found is None:
            raise UserError(
                f"--resume: no complete checkpoint in {self.run.checkpoints} (the run stopped before its first): "
                "start it over with --overwrite"
            )
        return found

    def _setup_data(self, resumed: bool, to_remove: list[Path]) -> RunData:
        cfg, acc = self.cfg, self.accelerator
        stored_labels = self.run.stored_labels() if resumed else None
        train, validation, label_sets = read_data(cfg, stored_labels)
        with acc.main_process_first():  # the main process trains and saves the tokenizer, the others load it
            stored_tokenizer = self.run.tokenizer if resumed or not acc.is_main_process else None
            tokenizer = make_tokenizer(cfg, train, stored_tokenizer)
            recaser = make_recaser(cfg, train, stored_tokenizer.parent if stored_tokenizer is not None else None)
            encoder = TextEncoder.for_model(tokenizer, cfg.model, cfg.data.max_length, recaser)
            if acc.is_main_process and not resumed:
                self.run.claim(to_remove)
                encoder.save(self.run.path)
                self.run.write_labels(label_sets)
                self.run.write_config(cfg.to_yaml())
                self.run.write_fingerprints(self.fingerprints)
        kinds = {name: t.kind for name, t in cfg.tasks.items()}
        encoded, report = encode_sources(train, encoder, label_sets, kinds)
        dataset = MultiTaskDataset(encoded, [source.sampling_weight for source in train])
        return RunData(train, validation, label_sets, encoder, dataset, report)

    def _setup_model(self) -> None:
        cfg, acc, data = self.cfg, self.accelerator, self.data
        self.model = build_model(cfg, data.label_sets, data.encoder)
        self._initialise(self.model)
        self.trunk_report, self.state_cache_seconds = precompute_trunk_states(
            self.model, data, acc, cfg.data.eval_batch_size, self.log
        )
        static = {name: t.loss_weight for name, t in cfg.tasks.items()}
        self.balancer = LossBalancer(cfg.balancing, list(cfg.tasks), static).to(acc.device)
        groups = parameter_groups(self.model, self.balancer, cfg.training.weight_decay, self._held_parameters())
        optimizer = make_optimizer(groups, cfg.training)
        self.sampler = MultiTaskBatchSampler(
            data.dataset.source_sizes,
            cfg.data.batch_size,
            cfg.data.sampling,
            cfg.data.temperature,
            data.dataset.lengths,
            cfg.data.group_by_length,
            seed=cfg.training.seed,
            weights=data.dataset.source_weights,
        )
        collate = self._collator()
        # A private generator: each new DataLoader iterator draws a seed from it, and drawing from the global
        # RNG would shift dropout on resume (the resumed run starts one more iterator than an unbroken one).
        loader = torch.utils.data.DataLoader(
            data.dataset, batch_sampler=self.sampler, collate_fn=collate, generator=torch.Generator()
        )
        self.model, self.optimizer, self.loader = acc.prepare(self.model, optimizer, loader)
        self.steps_per_epoch = max(1, len(self.loader) // cfg.training.grad_accum_steps)
        self.total_steps = cfg.training.max_steps or cfg.training.epochs * self.steps_per_epoch
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        spent = (lambda: self.budget_spent) if cfg.training.max_minutes else None
        self.lr_factor = lr_lambda(cfg.training, self.total_steps, spent)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, group_schedules(groups, self.lr_factor))

    def _initialise(self, model: torch.nn.Module) -> None:
        """Extension point: set a freshly built model's weights before training (a distilled student's lexicon)."""

    def _held_parameters(self) -> list[tuple[torch.nn.Parameter, int]]:
        """Extension point: (parameter, steps) pairs whose learning rate is held at 0 for their first steps."""
        return []

    def _collator(self):
        """Extension point: what turns a list of dataset examples into a batch."""
        return collator_for(self.cfg.model, self.data.encoder.pad_id, {n: t.kind for n, t in self.cfg.tasks.items()})

    def _restore(self, path: Path, honoured: dict[str, tuple]) -> None:
        state = load_checkpoint(self.accelerator, path, self.verified)
        self.balancer.load(state.pop("balancer"))
        self.scheduler.load_state_dict(state.pop("scheduler"))
        self.state = TrainState.from_dict(state)
        # why the last session stopped is decided again under the settings in force now: a run its time budget
        # stopped goes on when training.max_minutes was raised (patience is re-checked as train() begins); the
        # time fraction is also the schedule's, before a changed lr recomputes the rate below
        self.state.stop_reason = "time_budget" if self._over_time_budget() else "done"
        if "training.lr" in honoured:  # the schedule keeps its shape around the new peak, from this step on
            lr = self.cfg.training.lr
            self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]
            for group, factor in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas, strict=True):
                group["initial_lr"] = lr
                group["lr"] = lr * factor(self.scheduler.last_epoch)
        self.state.resumed_from.append(self.state.step)
        self.log.truncate_after(self.state.step)
        if self.accelerator.is_main_process:
            self.run.write_config(self.cfg.to_yaml())  # only now that the checkpoint restored
        changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in honoured.items())
        self.log.info(
            f"resumed from {path} at step {self.state.step} (epoch {self.state.epoch + 1})"
            + (f"; changed: {changed}" if changed else "")
        )

    # ------------------------------------------------------------------------------------------------ save

    def save(self) -> TrainResult:
        """Validate and checkpoint the last step if that has not happened; write summary.json; the result."""
        st = self.state
        if not st.validated_at_this_step():
            self._validate_and_checkpoint()
        train_s = st.train_seconds
        result = TrainResult(
            output_dir=self.run.path,
            best_dir=self.run.best,
            best_step=st.best_step,
            best_score=st.best_score,
            best_metrics=st.best_metrics,
            steps=st.step,
            wall_time_s=train_s + st.validation_seconds,
            tokens_per_s=st.tokens * self.accelerator.num_processes / train_s if train_s else 0.0,
            parameters=self.accelerator.unwrap_model(self.model).num_parameters(),
            stop_reason=st.stop_reason,
            resumed_from=list(st.resumed_from),
            state_cache_seconds=self.state_cache_seconds,
        )
        self.log.summary(result, self.cfg)
        if self.accelerator.is_main_process:
            self.run.write_summary(result.summary())
        return result

    def cleanup(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if self.log is not None:
            self.log.close()
        if self.accelerator is None:
            return
        self.accelerator.end_training()
        if self.accelerator.num_processes == 1:
            # Accelerate keeps its settings in process-wide singletons; clear them so a second train() in the
            # same process (a notebook, the tests) may choose another precision. Multi-process runs exit instead.
            AcceleratorState._reset_state()
            GradientState._reset_state()
