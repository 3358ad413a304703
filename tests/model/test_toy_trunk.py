"""Adding a way of reading a trunk is one class and one registry line: a toy trunk registered from this file alone
(a native decoder over a fixed sinusoid embedding that never trains) is trained, saved, loaded, evaluated and
predicted with through the public functions, and everything the package asks of a trunk is asked of it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from helpers import FIXTURES, tiny_config
from safetensors.torch import load_file

from mtl_decoder import evaluate, predict_texts
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.trunks import Trunk, register_trunk
from mtl_decoder.saved import load_model
from mtl_decoder.training import train


def sinusoid(vocab: int, width: int) -> torch.Tensor:
    """(vocab, width): row i holds sin/cos of i at width/2 geometric frequencies (the Transformer's table)."""
    rows = torch.arange(vocab, dtype=torch.float64)[:, None]
    freqs = torch.exp(-math.log(10000.0) * torch.arange(0, width, 2, dtype=torch.float64) / width)
    table = torch.zeros(vocab, width, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(rows * freqs), torch.cos(rows * freqs)
    return table.float()


class SinusoidTrunk(Trunk):
    name = "toy_sinusoid"

    def build(self, specs, encoder, saved_trunk: Path | None, expected_identity: dict[str, Any] | None):
        model = MTLDecoder(self.cfg, specs, vocab_size=encoder.vocab_size, pad_id=encoder.pad_id)
        with torch.no_grad():
            model.embed.weight.copy_(sinusoid(encoder.vocab_size, self.cfg.d_model))
        model.embed.requires_grad_(False)
        return model

    def describe(self) -> str:
        return f"a fixed sinusoid embedding + {self.cfg.n_layers} layers x d_model {self.cfg.d_model}"


register_trunk(SinusoidTrunk)

DATA = {"ner": FIXTURES / "ner_test.jsonl", "sentiment": FIXTURES / "sentiment_test.jsonl"}


def test_a_trunk_registered_here_trains_saves_loads_evaluates_and_predicts(tmp_path, capfd):
    run = tmp_path / "run"
    cfg = tiny_config(run, ["model.trunk.mode=toy_sinusoid", "training.max_steps=6", "training.eval_every=6"])
    result = train(cfg)
    assert "a fixed sinusoid embedding + 2 layers x d_model 32" in "".join(capfd.readouterr())  # the banner

    weights = load_file(str(result.best_dir / "model.safetensors"))
    vocab = weights["embed.weight"].shape[0]
    assert torch.equal(weights["embed.weight"], sinusoid(vocab, 32))  # not trained, as the trunk says
    assert any(name.startswith("layers.") for name in weights)
    assert "A toy_sinusoid trunk (" in (result.best_dir / "README.md").read_text(encoding="utf-8")

    saved = load_model(result.best_dir, device="cpu")
    assert isinstance(saved.model.trunk_kind, SinusoidTrunk) and saved.model.trunk_kind.model is saved.model
    assert saved.model.trunk_kind.cached_states() is None and saved.model.trunk_kind.identity() is None
    got = list(predict_texts(saved, ["Peter went home", "a dull film"], workers=1))
    again = list(predict_texts(result.best_dir, ["Peter went home", "a dull film"], workers=1))
    assert got == again and [len(p["ner"]["tags"]) for p in got] == [3, 3]
    assert all(p["sentiment"]["label"] in ("negative", "positive") for p in got)

    metrics = evaluate(result.best_dir, data=DATA, output_dir=tmp_path / "eval").metrics
    assert set(metrics["tasks"]) == {"ner", "sentiment"}
    assert 0.0 <= metrics["tasks"]["sentiment"]["accuracy"] <= 1.0
