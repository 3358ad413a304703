"""Pretrained trunks through the whole product: train (mtl_decoder.train) in each mode, save, load, predict;
model.trunk.save=full; the identity check; resume after a kill; bf16 autocast; gradient checkpointing; the
utilisation report over the pretrained layers; two processes; a GGUF trunk. Tiny random checkpoints only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers import FIXTURES, needs_torchrun, tiny_config, torchrun_cli
from hf_testkit import tiny_checkpoint
from trunk_runs import STEPS, overrides, trained

from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.evaluation.evaluate import evaluate
from mtl_decoder.inference import Predictor
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.saved import load_model, save_model
from mtl_decoder.training import train
from mtl_decoder.training.trainer import Trainer

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama")


def _labelled_batch(encoder: TextEncoder) -> dict:
    encoded = encoder.encode_batch([["EU", "rejects", "German", "call"], "Peter Blackburn went home.", ["Rain"]])
    T = max(len(e.ids) for e in encoded)
    ids = torch.zeros(len(encoded), T, dtype=torch.long)
    mask = torch.zeros(len(encoded), T, dtype=torch.bool)
    for i, e in enumerate(encoded):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = True
    ner = torch.full((len(encoded), T), -100)
    ner[0, :3], ner[2, 0] = torch.tensor([1, 0, 2]), 0
    return {"input_ids": ids, "attention_mask": mask, "labels": {"ner": ner, "sentiment": torch.tensor([-100, 1, 0])}}


@pytest.mark.parametrize("mode", ["upcycle", "lora"])
@pytest.mark.parametrize("ffn", ["ple", "mlp"])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(checkpoint, tmp_path, mode, ffn):
    """The backward pass recomputes each block after the forward pass's routing context has ended: the block
    must get the same route layout again (it raised 'called outside the routing context' before)."""
    results = []
    for checkpointing in (False, True):
        overrides = [
            f"model.trunk.pretrained={checkpoint}",
            f"model.trunk.mode={mode}",
            f"model.ffn={ffn}",
            f"model.trunk.gradient_checkpointing={str(checkpointing).lower()}",
            "model.trunk.lora_attention=true",
        ]
        cfg = tiny_config(tmp_path / "run", overrides)
        encoder = TextEncoder.for_model(load_tokenizer(cfg.model.trunk), cfg.model, cfg.data.max_length)
        torch.manual_seed(0)
        model = build_model(cfg, LABELS, encoder).train()
        with torch.no_grad():  # non-zero LoRA updates, so that their gradients reach every factor
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
        out = model(**_labelled_batch(encoder))
        loss = sum(out.losses.values())
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads, len(out.gates)))
    (loss_a, grads_a, gates_a), (loss_b, grads_b, gates_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)
    assert grads_a.keys() == grads_b.keys() and any(".mlp." in n for n in grads_a)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert gates_a == gates_b == 2  # the recomputation's gates are not collected a second time


# ------------------------------------------------------------------------------------ train, save, load, predict


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "trunk-runs"


def _items() -> list:
    items: list = []
    for name in ("ner_test.jsonl", "sentiment_test.jsonl"):
        for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            items.append(record["tokens"] if "tokens" in record else record["text"])
    return items


def _predictions(model, encoder, label_sets) -> list:
    return list(Predictor(model, encoder, label_sets, batch_size=16, workers=1).predict(_items()))


def _assert_same_predictions(got: list, expected: list) -> None:
    assert len(got) == len(expected) == len(_items())
    for a, b in zip(got, expected, strict=True):
        assert a.tags == b.tags and a.labels == b.labels
        for task, probs in b.probs.items():
            assert a.probs[task] == pytest.approx(probs, abs=1e-6)


@pytest.mark.parametrize("mode", ["frozen", "lora", "upcycle"])
def test_a_trained_trunk_model_saves_and_loads_with_the_same_predictions(root, mode):
    run = trained(root, mode)
    result = json.loads((run.run_dir / "summary.json").read_text())
    assert result["steps"] == STEPS and result["best_step"] == STEPS  # best/ holds the model as it ended
    saved = load_model(run.best, device="cpu")
    assert type(saved.model) is type(run.model)
    expected = _predictions(run.model, run.encoder, run.label_sets)
    _assert_same_predictions(_predictions(saved.model, saved.encoder, saved.label_sets), expected)
    assert (run.best / "README.md").is_file() and (run.best / "trunk.json").is_file()


def _saved_untrained(tmp_path: Path, mode: str, save: str) -> tuple[Path, Path, list]:
    """A model on a private checkpoint, its trainable weights moved off their initial values, saved; returns the
    model folder, the checkpoint and the in-memory model's predictions."""
    checkpoint = tiny_checkpoint(tmp_path / "checkpoint")
    cfg = tiny_config(tmp_path / "run", overrides(checkpoint, tmp_path, mode, f"model.trunk.save={save}"))
    encoder = TextEncoder.for_model(load_tokenizer(cfg.model.trunk), cfg.model, cfg.data.max_length)
    model = build_model(cfg, LABELS, encoder).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    save_model(tmp_path / "best", model, encoder, cfg, LABELS)
    return tmp_path / "best", checkpoint, _predictions(model, encoder, LABELS)


@pytest.mark.parametrize("mode, save", [("frozen", "full"), ("lora", "full"), ("upcycle", "reference")])
def test_a_standalone_folder_loads_after_the_original_checkpoint_is_deleted(tmp_path, mode, save):
    """save=full stores the frozen pretrained weights (modes frozen and lora); mode upcycle stores every trunk
    weight anyway. Either way the folder needs nothing but itself."""
    folder, checkpoint, expected = _saved_untrained(tmp_path, mode, save)
    shutil.rmtree(checkpoint)
    saved = load_model(folder, device="cpu")
    _assert_same_predictions(_predictions(saved.model, saved.encoder, saved.label_sets), expected)


@pytest.mark.parametrize("mode", ["frozen", "lora"])
def test_a_referenced_checkpoint_that_changed_is_refused_naming_the_hash(tmp_path, mode):
    folder, checkpoint, _ = _saved_untrained(tmp_path, mode, "reference")
    shutil.rmtree(checkpoint)
    tiny_checkpoint(checkpoint, seed=1)  # the same architecture and tokenizer, other weights
    with pytest.raises(UserError, match=r"is not the trunk this model was trained on \(weights hash"):
        load_model(folder, device="cpu")


# ------------------------------------------------------------------------------------ resume, bf16, utilisation


def test_a_lora_run_resumes_after_an_interruption_and_matches_an_unbroken_run(root, tmp_path, caplog):
    """Mode lora's experts share the frozen base weights, which Accelerate's checkpoints store once (it removes
    the shared copies, and its warning listing them is expected here, so not shown); the resumed run must restore
    every update and end where an unbroken run ends."""
    checkpoint = trained(root, "lora").checkpoint
    extra = ["training.max_steps=8", "training.eval_every=4", "model.dropout=0.1"]
    make = lambda run: tiny_config(tmp_path / run, overrides(checkpoint, tmp_path, "lora", *extra))  # noqa: E731
    with caplog.at_level("WARNING"):
        unbroken = train(make("unbroken"))
    assert not [r for r in caplog.records if "Removed shared tensor" in r.getMessage()]
    train(make("broken"))
    shutil.rmtree(tmp_path / "broken" / "checkpoints" / "step-0000008")  # as if killed after step 4's checkpoint
    resumed = train(make("broken"), resume=True)
    assert resumed.resumed_from == [4] and resumed.steps == unbroken.steps == 8
    assert resumed.best_metrics == unbroken.best_metrics
    a = load_file(tmp_path / "unbroken" / "checkpoints" / "step-0000008" / "model.safetensors")
    b = load_file(tmp_path / "broken" / "checkpoints" / "step-0000008" / "model.safetensors")
    assert a.keys() == b.keys() and any("lora_B" in k for k in a)
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=key)


@pytest.mark.parametrize("mode", ["upcycle", "lora"])
def test_a_bf16_autocast_step_on_a_trunk(root, tmp_path, mode):
    checkpoint = trained(root, "frozen").checkpoint
    extra = ["training.mixed_precision=bf16", "training.max_steps=2", "training.eval_every=2"]
    result = train(tiny_config(tmp_path / "run", overrides(checkpoint, tmp_path, mode, *extra)))
    assert result.steps == 2
    weights = load_file(tmp_path / "run" / "best" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in weights.values())
    assert all(v.dtype == torch.float32 for v in weights.values())  # autocast: the weights stay float32


@pytest.mark.parametrize("mode", ["upcycle", "lora", "hybrid"])
def test_every_trained_module_is_in_training_mode_from_the_first_step(root, tmp_path, mode):
    """The loaded base model comes in eval mode: training switches the whole model to train mode before its first
    step, not at its first validation (a trunk with dropout would train its first steps without it, and a resumed
    run would differ from an unbroken one)."""
    checkpoint = trained(root, "frozen").checkpoint
    extra = ["training.max_steps=3", "training.eval_every=3"]
    trainer = Trainer(tiny_config(tmp_path / "run", overrides(checkpoint, tmp_path, mode, *extra)))
    seen: list[tuple[str, bool, bool]] = []  # (name, training, a transformers module) of every module a step runs

    def record(module, _args, name):
        if torch.is_grad_enabled():
            seen.append((name, module.training, type(module).__module__.startswith("transformers.")))

    try:
        trainer.setup()
        model = trainer.accelerator.unwrap_model(trainer.model)
        for name, module in model.named_modules():
            module.register_forward_pre_hook(lambda m, args, name=name: record(m, args, name))
        trainer.train()
    finally:
        trainer.cleanup()
    assert any(pretrained for _, _, pretrained in seen)  # the pretrained blocks' own modules ran in the steps
    assert [name for name, training, _ in seen if not training] == []


def test_the_utilisation_report_covers_the_pretrained_layers_gates(root, tmp_path):
    run = trained(root, "upcycle")
    result = evaluate(run.best, split="validation", output_dir=tmp_path / "eval")
    layers = json.loads((run.best / "trunk.json").read_text())["layers"]
    experts = result.metrics["experts"]
    assert list(experts) == [f"layer_{i}" for i in range(layers)]
    for i, gates in enumerate(experts.values()):
        assert {"ner", "sentiment"} <= set(gates)
        assert (SHARED in gates) == (i < layers - 1)  # ple: no shared gate in the last layer
    assert (tmp_path / "eval" / "plots" / f"experts_layer_{layers - 1}.png").is_file()


@needs_torchrun
def test_two_processes_train_a_lora_trunk(root, tmp_path):
    """torchrun with two CPU processes (gloo): DDP over a trunk whose frozen base weights every expert shares,
    each process's batches, the validation split between them, Accelerate's checkpoint. (Modes frozen and
    upcycle ran the same way by hand, ~30 s each on 2 busy cores: not repeated here, to keep the suite short.)"""
    checkpoint = trained(root, "lora").checkpoint
    config = tiny_config(tmp_path / "ddp", overrides(checkpoint, tmp_path, "lora", "training.max_steps=2"))
    config.save(tmp_path / "ddp.yaml")
    done = torchrun_cli("train", "--config", str(tmp_path / "ddp.yaml"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cpu x 2 process(es)" in done.stdout + done.stderr
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["validation"]["ner"]["sentences"] == 20  # every validation example scored exactly once
    assert (tmp_path / "ddp" / "checkpoints" / "step-0000002").is_dir()
    assert load_model(tmp_path / "ddp" / "best", device="cpu").config.model.trunk.mode == "lora"
