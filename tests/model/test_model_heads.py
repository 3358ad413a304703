"""Task heads: a linear map per token for tagging; for classification a linear map or, with
``model.classifier_hidden``, an MLP over the pooled state (checked against a float64 reference)."""

from __future__ import annotations

import math

import pytest
import torch
from model_testkit import perturb, tiny_batch, tiny_model
from safetensors.torch import load_file, save_file
from torch import nn

from mtl_decoder.config import ModelConfig
from mtl_decoder.errors import ConfigError


def _mlp_reference(head: nn.Sequential, pooled: torch.Tensor) -> torch.Tensor:
    """Linear -> exact (erf) GELU -> Linear in float64, from the head's weights."""
    first, last = head[0], head[-1]
    x = pooled.double() @ first.weight.double().T + first.bias.double()
    x = 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    return x @ last.weight.double().T + last.bias.double()


def test_a_classifier_hidden_head_is_an_mlp_over_the_pooled_state_and_tagging_stays_linear():
    model = perturb(tiny_model(seed=3, classifier_hidden=24)).eval()
    assert isinstance(model.heads["ner"], nn.Linear) and model.heads["ner"].in_features == 32
    assert [p.shape for p in model.heads["sent"].parameters()] == [(24, 32), (24,), (3, 24), (3,)]
    batch = tiny_batch([6, 3, 5], seed=4)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"], keep_hidden=True)
    pooled = out.hidden["sent"]  # what the head reads: one (C,) state per text
    assert pooled.shape == (3, 32)
    torch.testing.assert_close(
        out.logits["sent"].double(), _mlp_reference(model.heads["sent"], pooled), atol=1e-5, rtol=1e-5
    )


def test_without_classifier_hidden_the_heads_keep_their_saved_names():
    """0 (the default) is the linear head every earlier model folder holds: its tensors keep their names."""
    keys = {k for k in tiny_model().state_dict() if k.startswith("heads.")}
    assert keys == {"heads.ner.weight", "heads.ner.bias", "heads.sent.weight", "heads.sent.bias"}


def test_the_mlp_head_trains_and_survives_a_round_trip(tmp_path):
    model = tiny_model(seed=5, classifier_hidden=16)
    batch = tiny_batch([6, 4, 5, 2], seed=6)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        out = model(batch["input_ids"], batch["attention_mask"], labels={"sent": batch["labels"]["sent"]})
        optimiser.zero_grad()
        out.loss.backward()
        optimiser.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.05 * losses[0]
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    fresh = tiny_model(seed=99, classifier_hidden=16)
    fresh.load_state_dict(load_file(str(tmp_path / "model.safetensors")), strict=True)
    model.eval(), fresh.eval()
    with torch.no_grad():
        a = model(batch["input_ids"], batch["attention_mask"]).logits["sent"]
        b = fresh(batch["input_ids"], batch["attention_mask"]).logits["sent"]
    assert torch.equal(a, b)
    assert torch.equal(a.argmax(-1), batch["labels"]["sent"])


def test_a_negative_classifier_hidden_names_its_key():
    with pytest.raises(ConfigError, match="classifier_hidden"):
        ModelConfig(classifier_hidden=-1)
