"""The training recipe: setup -> train -> save -> cleanup, on one CPU, one GPU or many processes (Accelerate).

    mtl-decoder train --config configs/demo.yaml [--output-dir DIR] [--resume | --overwrite] [key=value ...]

``setup`` checks everything that can be checked cheaply first (the run folder, a resume's config), then reads
the data (bad data fails before anything is written), builds the model and restores a checkpoint; ``train``
steps, validates and checkpoints; ``save`` makes sure the last state is validated and writes the summary.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs, skip_first_batches
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import gather_object, set_seed

from mtl_decoder.config import ExperimentConfig, load_config
from mtl_decoder.data.batching import MultiTaskBatchSampler, MultiTaskDataset, collator_for, drop_words
from mtl_decoder.data.tasks import Example
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.evaluation.metrics import selection_score
from mtl_decoder.evaluation.scoring import score_sources
from mtl_decoder.files import Unwinder, terminate_unwinds
from mtl_decoder.inference import Prediction, Predictor
from mtl_decoder.locks import PathLock
from mtl_decoder.model import build_model
from mtl_decoder.runtime import default_device
from mtl_decoder.saved import save_model
from mtl_decoder.training.balancing import LossBalancer
from mtl_decoder.training.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint, verify_checkpoint
from mtl_decoder.training.failures import ending
from mtl_decoder.training.logging import RunLogger, start_banner
from mtl_decoder.training.memory import keep_freed_memory
from mtl_decoder.training.resume import check_data_unchanged, check_resume_changes, data_fingerprints
from mtl_decoder.training.run_dir import RunDirectory
from mtl_decoder.training.setup import (
    RunData,
    encode_sources,
    lr_lambda,
    make_optimizer,
    make_tokenizer,
    parameter_groups,
    precompute_trunk_states,
    read_data,
)
from mtl_decoder.training.state import TrainResult, TrainState

__all__ = ["NonFiniteLoss", "TrainResult", "Trainer", "train"]


class NonFiniteLoss(UserError):
    """A task's loss became NaN or infinite: the run stops, the last good checkpoint stays."""


def train(
    config: ExperimentConfig | str | Path,
    overrides: list[str] = (),
    output_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> TrainResult:
    """Train a multi-task model; returns where the best model went and its validation metrics. ``config`` is not
    modified (``output_dir`` overrides training.output_dir in the run's own copy)."""
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, list(overrides))
    trainer = Trainer(config, output_dir, resume=resume, overwrite=overwrite)
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


def _multi_process_cpu() -> bool:
    """Accelerate forms a gloo group for several CPU processes (torchrun, accelerate launch) only when told it
    runs on CPU; on a machine with an accelerator the launcher's device wins."""
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return several and default_device().type == "cpu"


class Trainer:
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
            cpu=_multi_process_cpu(),
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
            raise UserError(f"--resume: no complete checkpoint in {self.run.checkpoints}")
        return found

    def _setup_data(self, resumed: bool, to_remove: list[Path]) -> RunData:
        cfg, acc = self.cfg, self.accelerator
        stored_labels = self.run.stored_labels() if resumed else None
        train, validation, label_sets = read_data(cfg, stored_labels)
        with acc.main_process_first():  # the main process trains and saves the tokenizer, the others load it
            stored_tokenizer = self.run.tokenizer if resumed or not acc.is_main_process else None
            tokenizer = make_tokenizer(cfg, train, stored_tokenizer)
            encoder = TextEncoder.for_model(tokenizer, cfg.model, cfg.data.max_length)
            if acc.is_main_process and not resumed:
                self.run.claim(to_remove)
                encoder.save(self.run.path)
                self.run.write_labels(label_sets)
                self.run.write_config(cfg.to_yaml())
                self.run.write_fingerprints(self.fingerprints)
        kinds = {name: t.kind for name, t in cfg.tasks.items()}
        encoded, report = encode_sources(train, encoder, label_sets, kinds)
        return RunData(train, validation, label_sets, encoder, MultiTaskDataset(encoded), report)

    def _setup_model(self) -> None:
        cfg, acc, data = self.cfg, self.accelerator, self.data
        self.model = build_model(cfg, data.label_sets, data.encoder)
        self.trunk_report, self.state_cache_seconds = precompute_trunk_states(
            self.model, data, acc, cfg.data.eval_batch_size, self.log
        )
        static = {name: t.loss_weight for name, t in cfg.tasks.items()}
        self.balancer = LossBalancer(cfg.balancing, list(cfg.tasks), static).to(acc.device)
        optimizer = make_optimizer(parameter_groups(self.model, self.balancer, cfg.training.weight_decay), cfg.training)
        self.sampler = MultiTaskBatchSampler(
            data.dataset.source_sizes,
            cfg.data.batch_size,
            cfg.data.sampling,
            cfg.data.temperature,
            data.dataset.lengths,
            cfg.data.group_by_length,
            seed=cfg.training.seed,
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
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self.lr_factor)

    def _collator(self):
        """Extension point: what turns a list of dataset examples into a batch."""
        return collator_for(self.cfg.model, self.data.encoder.pad_id, {n: t.kind for n, t in self.cfg.tasks.items()})

    def _losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Extension point: each task's loss on a batch (the model's gold losses; distillation mixes in the
        teacher's)."""
        return self.model(**batch).losses

    def _restore(self, path: Path, honoured: dict[str, tuple]) -> None:
        state = load_checkpoint(self.accelerator, path, self.verified)
        self.balancer.load(state.pop("balancer"))
        self.scheduler.load_state_dict(state.pop("scheduler"))
        self.state = TrainState.from_dict(state)
        self._over_time_budget()  # the schedule's time fraction, before a changed lr recomputes the rate below
        if "training.lr" in honoured:  # the schedule keeps its shape around the new peak, from this step on
            lr = self.cfg.training.lr
            self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]
            for group in self.optimizer.param_groups:
                group["initial_lr"] = lr
                group["lr"] = lr * self.lr_factor(self.scheduler.last_epoch)
        self.state.resumed_from.append(self.state.step)
        self.log.truncate_after(self.state.step)
        if self.accelerator.is_main_process:
            self.run.write_config(self.cfg.to_yaml())  # only now that the checkpoint restored
        changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in honoured.items())
        self.log.info(
            f"resumed from {path} at step {self.state.step} (epoch {self.state.epoch + 1})"
            + (f"; changed: {changed}" if changed else "")
        )

    # ------------------------------------------------------------------------------------------------ train

    def train(self) -> None:
        """Step until the step budget, patience or training.max_minutes runs out, validating along the way."""
        model = self.accelerator.unwrap_model(self.model)
        if self.trunk_report:
            self.log.info(self.trunk_report)
        self.log.banner(
            start_banner(
                self.cfg,
                self.data.report,
                self.data.label_sets,
                model.num_parameters(),
                self.accelerator,
                self.total_steps,
                self.steps_per_epoch,
            )
        )
        st = self.state
        patience = self.cfg.training.patience
        if patience and st.bad_validations >= patience:
            st.stop_reason = "early_stopping"
        while st.epoch < self.epochs and st.step < self.total_steps and st.stop_reason == "done":
            self._run_epoch(st.epoch)
            if st.batches_in_epoch >= len(self.loader):  # the epoch ran to its end
                self.balancer.end_epoch()
                st.epoch, st.batches_in_epoch = st.epoch + 1, 0
                if self.cfg.training.eval_every == 0 and not st.validated_at_this_step():
                    self._validate_and_checkpoint()

    def _over_time_budget(self) -> bool:
        """Updates budget_spent (steps and validations, the largest over processes, so every process gets the
        same learning rate and the same answer); whether training.max_minutes is all spent."""
        budget = self.cfg.training.max_minutes
        if budget is None:
            return False
        spent = (self.state.train_seconds + self.state.validation_seconds) / (budget * 60)
        spent = torch.tensor(spent, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            spent = self.accelerator.reduce(spent, "max")
        self.budget_spent = float(spent.item())
        return self.budget_spent > 1.0

    def _run_epoch(self, epoch: int) -> None:
        """Train until the epoch ends, the step or time budget is spent, or early stopping triggers."""
        st = self.state
        self.sampler.set_epoch(epoch)
        self.loader.set_epoch(epoch)
        loader = skip_first_batches(self.loader, st.batches_in_epoch) if st.batches_in_epoch else self.loader
        self.sampler.set_epoch(epoch)
        bar = self.log.progress(len(self.loader), st.batches_in_epoch, f"epoch {epoch + 1}/{self.epochs}")
        tick = time.perf_counter()
        for batch in loader:  # train_seconds counts loading and steps; validation time is counted apart
            st.batches_in_epoch += 1
            synced = self._train_step(batch)
            st.tokens += int(batch["attention_mask"].sum())
            bar.update(1)
            now = time.perf_counter()
            st.train_seconds += now - tick
            tick = now
            if not synced:
                continue
            st.step += 1
            over = self._over_time_budget()
            self.scheduler.step()  # the schedule follows the larger of the step and time fractions
            if st.step % self.cfg.training.log_every == 0:
                self.log.train_step(st.step, epoch, self.scheduler.get_last_lr()[0], self.balancer, bar)
            last = st.step >= self.total_steps
            every = self.cfg.training.eval_every
            if over:
                st.stop_reason = "time_budget"
                self.log.info(f"step {st.step}: training.max_minutes ({self.cfg.training.max_minutes}) spent")
                if not (every and st.step % every == 0):
                    self._validate_and_checkpoint()
                break
            if every and (st.step % every == 0 or last):
                self._validate_and_checkpoint()
                tick = time.perf_counter()
                if st.stop_reason != "done":
                    break
            if last:
                break
        bar.close()

    def _train_step(self, batch: dict[str, Any]) -> bool:
        acc, cfg = self.accelerator, self.cfg
        if cfg.data.word_dropout:
            batch["input_ids"] = drop_words(
                batch["input_ids"], batch["word_index"], cfg.data.word_dropout, self.data.encoder.unk_id
            )
        with acc.accumulate(self.model):
            losses = self._losses(batch)
            values = self._reduce_losses(losses)
            self.balancer.observe(values)
            total = self.balancer.combine(losses)
            acc.backward(total)
            if acc.sync_gradients:
                if self.balancer.log_vars is not None and acc.num_processes > 1:
                    self.balancer.log_vars.grad = acc.reduce(self.balancer.log_vars.grad, "mean")
                if cfg.training.max_grad_norm:
                    norm = acc.clip_grad_norm_(self.model.parameters(), cfg.training.max_grad_norm)
                    self.log.record_grad_norm(float(norm))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.log.record_losses(values, self.balancer.weights())
        return acc.sync_gradients

    def _reduce_losses(self, losses: dict[str, torch.Tensor]) -> dict[str, float]:
        """Each task's loss averaged over the processes that saw it; stops on a non-finite value anywhere."""
        names = list(self.cfg.tasks)
        device = self.accelerator.device
        values = torch.zeros(len(names), device=device)
        counts = torch.zeros(len(names), device=device)
        for name, loss in losses.items():
            values[names.index(name)] = loss.detach().float()
            counts[names.index(name)] = 1
        if self.accelerator.num_processes > 1:
            values, counts = self.accelerator.reduce(values, "sum"), self.accelerator.reduce(counts, "sum")
        out = {}
        for name, value, count in zip(names, values.tolist(), counts.tolist(), strict=True):
            if count and not math.isfinite(value):
                last = latest_checkpoint(self.run.checkpoints)
                raise NonFiniteLoss(
                    f"non-finite loss ({value}) for task '{name}' at step {self.state.step + 1}; "
                    f"stopped. Last good checkpoint: {last or 'none yet'}. Try a lower training.lr "
                    "or training.mixed_precision=no"
                )
            if count:
                out[name] = value / count
        return out

    # ------------------------------------------------------------------------------------------------ validation

    def validate(self) -> dict[str, dict[str, Any]]:
        """Per-task validation metrics through the scoring loop of ``evaluate`` (the same Predictor, batch size
        and metrics); each process predicts its share of the examples and the predictions are gathered."""
        acc = self.accelerator
        model = acc.unwrap_model(self.model)
        predictor = Predictor(model, self.data.encoder, self.data.label_sets, self.cfg.data.eval_batch_size)

        def distribute(examples: list[Example], run) -> list[Prediction]:
            with acc.split_between_processes(examples) as shard:
                preds = run(shard)
            return gather_object(preds) if acc.num_processes > 1 else preds

        return score_sources(
            predictor, self.data.validation_sources, self.cfg.tasks, self.data.label_sets, distribute=distribute
        )

    def _validate_and_checkpoint(self) -> None:
        """Validate, keep the best model, save a resumable checkpoint; stop when patience has run out."""
        started = time.perf_counter()
        metrics = self.validate()
        score = selection_score(self.cfg.tasks, metrics)
        improved = score > self.state.best_score
        with self.unwinder.deferred():  # SIGTERM waits for best/ and the checkpoint: --resume then has both
            self._keep(metrics, score, improved, started)

    def _keep(self, metrics: dict[str, dict[str, Any]], score: float, improved: bool, started: float) -> None:
        """Write best/ (when improved), log the validation and save the resumable checkpoint."""
        st, acc = self.state, self.accelerator
        if improved:
            st.best_score, st.best_step, st.best_metrics, st.bad_validations = score, st.step, metrics, 0
            if acc.is_main_process:
                train_data = [
                    {"tasks": [t.name for t in src.tasks], "source": src.key, "examples": len(src.examples)}
                    for src in self.data.train_sources
                ]  # for the model card
                info = {"step": st.step, "score": score, "validation": metrics, "data": {"train": train_data}}
                info.update(self.card_info)
                model = acc.unwrap_model(self.model)
                save_model(self.run.best, model, self.data.encoder, self.cfg, self.data.label_sets, extra=info)
        else:
            st.bad_validations += 1
        st.validations.append({"step": st.step, "score": score})
        self.log.validation(st.step, st.epoch, metrics, score, improved, self.cfg)
        patience = self.cfg.training.patience
        if patience and st.bad_validations >= patience and st.stop_reason == "done":
            st.stop_reason = "early_stopping"
            self.log.info(f"step {st.step}: no improvement in {patience} validations, stopping")
        st.validation_seconds += time.perf_counter() - started
        state = {**st.to_dict(), "balancer": self.balancer.state(), "scheduler": self.scheduler.state_dict()}
        save_checkpoint(acc, self.run.checkpoints, st.step, state, self.cfg.training.keep_checkpoints)

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
