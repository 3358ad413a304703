"""The stepping half of the trainer.

Epochs of optimiser steps under the step and time budgets, each task's loss
reduced over the processes, validation through evaluate's scoring loop, best/ and the resumable checkpoints.

``Trainer`` (trainer.py) builds everything this steps in its ``setup``: the attributes declared on ``TrainingLoop``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.utils import gather_object

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.data.batching import MultiTaskBatchSampler, drop_words
from mtl_decoder.data.tasks import Example
from mtl_decoder.errors import UserError
from mtl_decoder.evaluation.metrics import selection_score
from mtl_decoder.evaluation.scoring import score_sources
from mtl_decoder.inference import Prediction, Predictor
from mtl_decoder.saved import save_model
from mtl_decoder.termination import Unwinder
from mtl_decoder.training.balancing import LossBalancer
from mtl_decoder.training.checkpoints import latest_checkpoint, save_checkpoint
from mtl_decoder.training.logging import RunLogger, start_banner
from mtl_decoder.training.run_dir import RunDirectory
from mtl_decoder.training.setup import RunData
from mtl_decoder.training.state import TrainState

MAX_EPOCH_VALIDATIONS = 20
"""With training.eval_every 0, the most validations a run makes: a run of more epochs validates every k-th."""


def epoch_ends_in_validation(epochs_done: int, epochs: int) -> bool:
    """Whether the end of an epoch is validated.

    training.eval_every 0: whether the end of epoch ``epochs_done`` (1-based) of ``epochs`` is validated. Every
    k-th epoch is, k = ceil(epochs / MAX_EPOCH_VALIDATIONS), so tiny epochs (30 examples: two steps) do not make a
    validation of every few steps; the last epoch always is."""
    every = max(1, math.ceil(epochs / MAX_EPOCH_VALIDATIONS))
    return epochs_done % every == 0 or epochs_done >= epochs


class NonFiniteLoss(UserError):
    """A task's loss became NaN or infinite: the run stops, the last good checkpoint stays."""


class TrainingLoop:
    """Steps, validates and keeps the best model; ``Trainer.setup`` sets everything below first."""

    cfg: ExperimentConfig
    run: RunDirectory
    state: TrainState
    accelerator: Accelerator
    log: RunLogger
    data: RunData
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    loader: torch.utils.data.DataLoader
    sampler: MultiTaskBatchSampler
    balancer: LossBalancer
    steps_per_epoch: int
    total_steps: int
    epochs: int
    budget_spent: float
    trunk_report: str
    unwinder: Unwinder
    card_info: dict[str, Any]

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
        # A pretrained base model is loaded in eval mode: every module trains in train mode from the first step
        # (validation restores whatever mode it found, so without this the first steps would run without dropout).
        self.model.train()
        st = self.state
        patience = self.cfg.training.patience
        if patience and st.bad_validations >= patience:
            st.stop_reason = "early_stopping"
        while st.epoch < self.epochs and st.step < self.total_steps and st.stop_reason == "done":
            self._run_epoch(st.epoch)
            if st.batches_in_epoch >= len(self.loader):  # the epoch ran to its end
                self.balancer.end_epoch()
                st.epoch, st.batches_in_epoch = st.epoch + 1, 0
                due = epoch_ends_in_validation(st.epoch, self.epochs) or st.step >= self.total_steps
                if self.cfg.training.eval_every == 0 and due and not st.validated_at_this_step():
                    self._validate_and_checkpoint()

    def _over_time_budget(self) -> bool:
        """Update the time budget and say whether it is spent.

        Updates budget_spent (steps and validations, the largest over processes, so every process gets the
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
                limit = cfg.training.max_grad_norm or math.inf  # 0: no clip, the norm still logged
                norm = float(acc.clip_grad_norm_(self.model.parameters(), limit))
                self.log.record_grad_norm(norm, clipped=norm > limit)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.log.record_losses(values, self.balancer.weights())
        return acc.sync_gradients

    def _losses(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Each task's loss on a batch.

        Extension point: each task's loss on a batch (the model's gold losses; distillation mixes in the
        teacher's)."""
        return self.model(**batch).losses

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
        """Per-task validation metrics.

        Per-task validation metrics through the scoring loop of ``evaluate`` (the same Predictor, batch size
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
