"""The training recipe: setup -> train -> save -> cleanup, on one CPU, one GPU or many processes (Accelerate).

mtl-decoder train --config configs/demo.yaml [--output-dir DIR] [--resume] [key=value ...]
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs, skip_first_batches
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import gather_object, set_seed

from mtl_decoder.config import ExperimentConfig, load_config
from mtl_decoder.data import MultiTaskBatchSampler, MultiTaskDataset, collator_for, drop_words
from mtl_decoder.errors import UserError
from mtl_decoder.evaluation.metrics import selection_score, task_metrics
from mtl_decoder.evaluation.scoring import gold_and_predicted, predict_examples
from mtl_decoder.inference import Predictor
from mtl_decoder.pretrained import CONFIG_FILE, LABELS_FILE, build_model, default_device, save_pretrained
from mtl_decoder.tokenization import TextEncoder
from mtl_decoder.training.balancing import LossBalancer
from mtl_decoder.training.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from mtl_decoder.training.logging import RunLogger, start_banner
from mtl_decoder.training.memory import keep_freed_memory
from mtl_decoder.training.setup import (
    RunData,
    encode_sources,
    lr_lambda,
    make_optimizer,
    make_tokenizer,
    parameter_groups,
    read_data,
)


def _multi_process_cpu() -> bool:
    """Accelerate forms a gloo group for several CPU processes (torchrun, accelerate launch) only when told it
    runs on CPU; on a machine with an accelerator the launcher's device wins."""
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return several and default_device().type == "cpu"


class NonFiniteLoss(UserError):
    """A task's loss became NaN or infinite: the run stops, the last good checkpoint stays."""


@dataclass
class TrainResult:
    output_dir: Path
    best_dir: Path
    best_step: int
    best_score: float
    best_metrics: dict[str, dict[str, Any]]
    steps: int
    stopped_early: bool
    wall_time_s: float
    """Training wall time: steps and validations, summed over resumed sessions."""
    tokens_per_s: float = 0.0
    """Real (non-pad) training tokens per second of training steps, all processes together."""
    parameters: int = 0
    stop_reason: str = "done"
    """'done', 'early_stopping' or 'time_budget'."""


def train(
    config: ExperimentConfig | str | Path,
    overrides: list[str] = (),
    output_dir: str | Path | None = None,
    resume: bool = False,
) -> TrainResult:
    """Train a multi-task model; returns where the best model went and its validation metrics."""
    if not isinstance(config, ExperimentConfig):
        config = load_config(config, list(overrides))
    trainer = Trainer(config, output_dir, resume)
    try:
        return trainer.fit()
    finally:
        trainer.cleanup()


class Trainer:
    def __init__(self, config: ExperimentConfig, output_dir: str | Path | None = None, resume: bool = False):
        self.cfg = config
        if output_dir is not None:
            config.training.output_dir = str(output_dir)
        self.run_dir = Path(config.training.output_dir)
        tcfg = config.training
        ddp = DistributedDataParallelKwargs(find_unused_parameters=True)  # cgc/mmoe: absent routes skip experts
        tracker = "tensorboard" if importlib.util.find_spec("tensorboard") else None
        self.accelerator = Accelerator(
            cpu=_multi_process_cpu(),
            mixed_precision=tcfg.mixed_precision,
            gradient_accumulation_steps=tcfg.grad_accum_steps,
            log_with=tracker,
            kwargs_handlers=[ddp],
            project_dir=str(self.run_dir),
        )
        self.resume_from = self._resume_path(resume)
        keep_freed_memory()  # large gradient tensors are allocated afresh every step
        set_seed(tcfg.seed)
        self.data = self._setup_data()  # first: bad data fails before anything is written
        self.log = RunLogger(self.accelerator, self.run_dir, config, progress=tcfg.progress)
        self._setup_model()
        self.state: dict[str, Any] = {
            "train_seconds": 0.0,
            "validation_seconds": 0.0,
            "tokens": 0,
            "step": 0,
            "epoch": 0,
            "batches_in_epoch": 0,
            "best_score": -math.inf,
            "best_step": 0,
            "best_metrics": {},
            "bad_validations": 0,
            "validations": [],
        }
        if self.resume_from is not None:
            self._restore(self.resume_from)

    # ------------------------------------------------------------------------------------------------ setup

    def _resume_path(self, resume: bool) -> Path | None:
        explicit = self.cfg.training.resume_from
        if explicit:
            return Path(explicit)
        if resume:
            found = latest_checkpoint(self.run_dir / "checkpoints")
            if found is None:
                raise UserError(f"--resume: no complete checkpoint in {self.run_dir / 'checkpoints'}")
            return found
        if (self.run_dir / CONFIG_FILE).is_file():
            raise UserError(f"{self.run_dir} already holds a run: use --resume to continue it, or another --output-dir")
        return None

    def _setup_data(self) -> RunData:
        cfg, acc = self.cfg, self.accelerator
        train, validation, label_sets = read_data(cfg, self.run_dir)
        with acc.main_process_first():  # the main process trains and saves the tokenizer, the others load it
            encoder = TextEncoder(make_tokenizer(cfg, train, self.run_dir), cfg.data.max_length)
            if acc.is_main_process:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                encoder.save(self.run_dir)
                (self.run_dir / LABELS_FILE).write_text(json.dumps(label_sets, indent=2), encoding="utf-8")
                cfg.save(self.run_dir / CONFIG_FILE)
        kinds = {name: t.kind for name, t in cfg.tasks.items()}
        encoded, report = encode_sources(train, encoder, label_sets, kinds)
        return RunData(train, validation, label_sets, encoder, MultiTaskDataset(encoded), report)

    def _setup_model(self) -> None:
        cfg, acc, data = self.cfg, self.accelerator, self.data
        self.model = build_model(cfg, data.label_sets, data.encoder)
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
        collate = collator_for(cfg.model, data.encoder.pad_id, {n: t.kind for n, t in cfg.tasks.items()})
        # A private generator: each new DataLoader iterator draws a seed from it, and drawing from the global
        # RNG would shift dropout on resume (the resumed run starts one more iterator than an unbroken one).
        loader = torch.utils.data.DataLoader(
            data.dataset, batch_sampler=self.sampler, collate_fn=collate, generator=torch.Generator()
        )
        self.model, self.optimizer, self.loader = acc.prepare(self.model, optimizer, loader)
        self.steps_per_epoch = max(1, len(self.loader) // cfg.training.grad_accum_steps)
        self.total_steps = cfg.training.max_steps or cfg.training.epochs * self.steps_per_epoch
        self.epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.training, self.total_steps))

    def _restore(self, path: Path) -> None:
        state = load_checkpoint(self.accelerator, path)
        self.balancer.load(state.pop("balancer"))
        self.scheduler.load_state_dict(state.pop("scheduler"))
        self.state.update(state)
        self.log.truncate_after(self.state["step"])
        self.log.info(f"resumed from {path} at step {self.state['step']} (epoch {self.state['epoch'] + 1})")

    # ------------------------------------------------------------------------------------------------ train

    def fit(self) -> TrainResult:
        model = self.accelerator.unwrap_model(self.model)
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
        self.stop_reason = "early_stopping" if patience and st["bad_validations"] >= patience else "done"
        while st["epoch"] < self.epochs and st["step"] < self.total_steps and self.stop_reason == "done":
            self._run_epoch(st["epoch"])
            if st["batches_in_epoch"] >= len(self.loader):  # the epoch ran to its end
                self.balancer.end_epoch()
                st["epoch"], st["batches_in_epoch"] = st["epoch"] + 1, 0
                if self.cfg.training.eval_every == 0 and not self._validated_at_this_step():
                    self._validate_and_checkpoint()
        if not self._validated_at_this_step():
            self._validate_and_checkpoint()
        train_s = st["train_seconds"]
        result = TrainResult(
            self.run_dir,
            self.run_dir / "best",
            st["best_step"],
            st["best_score"],
            st["best_metrics"],
            st["step"],
            self.stop_reason == "early_stopping",
            train_s + st["validation_seconds"],
            st["tokens"] * self.accelerator.num_processes / train_s if train_s else 0.0,
            self.accelerator.unwrap_model(self.model).num_parameters(),
            self.stop_reason,
        )
        self.log.summary(result, self.cfg)
        return result

    def _over_time_budget(self) -> bool:
        """Whether training.max_minutes is spent (steps and validations); every process gets the same answer."""
        budget = self.cfg.training.max_minutes
        if budget is None:
            return False
        spent = self.state["train_seconds"] + self.state["validation_seconds"]
        over = torch.tensor(float(spent > budget * 60), device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            over = self.accelerator.reduce(over, "max")
        return bool(over.item())

    def _run_epoch(self, epoch: int) -> None:
        """Train until the epoch ends, the step or time budget is spent, or early stopping triggers."""
        st = self.state
        self.sampler.set_epoch(epoch)
        self.loader.set_epoch(epoch)
        loader = skip_first_batches(self.loader, st["batches_in_epoch"]) if st["batches_in_epoch"] else self.loader
        self.sampler.set_epoch(epoch)
        bar = self.log.progress(len(self.loader), st["batches_in_epoch"], f"epoch {epoch + 1}/{self.epochs}")
        tick = time.perf_counter()
        for batch in loader:  # train_seconds counts loading and steps; validation time is counted apart
            st["batches_in_epoch"] += 1
            synced = self._train_step(batch)
            st["tokens"] += int(batch["attention_mask"].sum())
            bar.update(1)
            now = time.perf_counter()
            st["train_seconds"] += now - tick
            tick = now
            if not synced:
                continue
            st["step"] += 1
            self.scheduler.step()
            if st["step"] % self.cfg.training.log_every == 0:
                self.log.train_step(st["step"], epoch, self.scheduler.get_last_lr()[0], self.balancer, bar)
            last = st["step"] >= self.total_steps
            every = self.cfg.training.eval_every
            if self._over_time_budget():
                self.stop_reason = "time_budget"
                self.log.info(f"step {st['step']}: training.max_minutes ({self.cfg.training.max_minutes}) spent")
                if not (every and st["step"] % every == 0):
                    self._validate_and_checkpoint()
                break
            if every and (st["step"] % every == 0 or last):
                self._validate_and_checkpoint()
                tick = time.perf_counter()
                if self.stop_reason != "done":
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
            out = self.model(**batch)
            values = self._reduce_losses(out.losses)
            self.balancer.observe(values)
            total = self.balancer.combine(out.losses)
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
                last = latest_checkpoint(self.run_dir / "checkpoints")
                raise NonFiniteLoss(
                    f"non-finite loss ({value}) for task '{name}' at step {self.state['step'] + 1}; "
                    f"stopped. Last good checkpoint: {last or 'none yet'}. Try a lower training.lr "
                    "or training.mixed_precision=no"
                )
            if count:
                out[name] = value / count
        return out

    # ------------------------------------------------------------------------------------------------ validation

    def validate(self) -> dict[str, dict[str, Any]]:
        """Per-task validation metrics through the same Predictor as evaluate/predict; examples are sharded
        across processes and the predictions gathered."""
        acc = self.accelerator
        model = acc.unwrap_model(self.model)
        predictor = Predictor(model, self.data.encoder, self.data.label_sets, self.cfg.data.eval_batch_size)
        metrics = {}
        for source in self.data.validation_sources:
            names = [t.name for t in source.tasks]
            with acc.split_between_processes(source.examples) as shard:
                preds = predict_examples(predictor, shard, names)
            if acc.num_processes > 1:
                preds = gather_object(preds)
            for name in names:
                gold, pred = gold_and_predicted(self.cfg.tasks[name], source.examples, preds)
                metrics[name] = task_metrics(self.cfg.tasks[name], gold, pred, self.data.label_sets[name])
        return metrics

    def _validated_at_this_step(self) -> bool:
        return bool(self.state["validations"]) and self.state["validations"][-1]["step"] == self.state["step"]

    def _validate_and_checkpoint(self) -> None:
        """Validate, keep the best model, save a resumable checkpoint; stop when patience has run out."""
        st, acc = self.state, self.accelerator
        started = time.perf_counter()
        metrics = self.validate()
        score = selection_score(self.cfg.tasks, metrics)
        improved = score > st["best_score"]
        if improved:
            st.update(best_score=score, best_step=st["step"], best_metrics=metrics, bad_validations=0)
            if acc.is_main_process:
                info = {"step": st["step"], "score": score, "validation": metrics}
                save_pretrained(
                    self.run_dir / "best",
                    acc.unwrap_model(self.model),
                    self.data.encoder,
                    self.cfg,
                    self.data.label_sets,
                    extra=info,
                )
        else:
            st["bad_validations"] += 1
        st["validations"].append({"step": st["step"], "score": score})
        self.log.validation(st["step"], st["epoch"], metrics, score, improved, self.cfg)
        patience = self.cfg.training.patience
        if patience and st["bad_validations"] >= patience and self.stop_reason == "done":
            self.stop_reason = "early_stopping"
            self.log.info(f"step {st['step']}: no improvement in {patience} validations, stopping")
        st["validation_seconds"] += time.perf_counter() - started
        state = {**st, "balancer": self.balancer.state(), "scheduler": self.scheduler.state_dict()}
        save_checkpoint(acc, self.run_dir / "checkpoints", st["step"], state, self.cfg.training.keep_checkpoints)

    def cleanup(self) -> None:
        self.log.close()
        self.accelerator.end_training()
        if self.accelerator.num_processes == 1:
            # Accelerate keeps its settings in process-wide singletons; clear them so a second train() in the
            # same process (a notebook, the tests) may choose another precision. Multi-process runs exit instead.
            AcceleratorState._reset_state()
            GradientState._reset_state()
