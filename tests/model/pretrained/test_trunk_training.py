"""Pretrained trunks through the whole product: train (mtl_decoder.train) in each mode, save, load, predict;
model.trunk.save=full; the identity check; resume after a kill; bf16 autocast; gradient checkpointing; the
utilisation report over the pretrained layers; two processes; a GGUF trunk. Tiny random checkpoints only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import tiny_config  # tests/ is on sys.path (pytest's rootdir conftest)
from hf_testkit import tiny_checkpoint

from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer

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
        encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
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
