"""Autocast never reaches a pretrained trunk's cached computation: bf16 training, prediction and evaluation run on
hybrid and several-layer (layer-mix) trunks on a CPU, and states computed under a bf16 autocast are the float32
states exactly (so a bf16 run never caches other states than an fp32 run would)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers import FIXTURES, tiny_config
from hf_testkit import tiny_checkpoint
from trunk_runs import batch

from mtl_decoder import predict_texts
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.evaluation.evaluate import evaluate
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.training import train

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [["EU", "rejects", "German", "call", "."], "Peter Blackburn went home.", ["Rain"]]
TRUNKS = {
    "frozen": ["model.trunk.mode=frozen"],
    "layer_mix": ["model.trunk.mode=frozen", "model.trunk.read_layers=[1, 2, 3]"],
    "layer_mix_concat": ["model.trunk.mode=frozen", "model.trunk.read_layers=[2, 3]", "model.trunk.layer_mix=concat"],
    "hybrid": ["model.trunk.mode=hybrid", "model.trunk.train_top=1"],
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama", layers=3)


def _states(checkpoint: Path, root: Path, overrides: list[str], ids, mask, autocast: bool) -> torch.Tensor:
    """The trunk states of (ids, mask) from a fresh cache under ``root``, twice (computed, then read back)."""
    cfg = tiny_config(root / "run", [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={root}",
                                     *overrides])  # fmt: skip
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    model = build_model(cfg, LABELS, encoder).eval()
    states = model.trunk_kind.cached_states()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), torch.no_grad():
        first = states(ids, mask)
        again = states(ids, mask)
    assert torch.equal(first, again)
    return first


@pytest.mark.parametrize("name", sorted(TRUNKS))
def test_states_under_a_bf16_autocast_are_the_fp32_states(tmp_path, checkpoint, name):
    cfg = tiny_config(tmp_path / "run", [f"model.trunk.pretrained={checkpoint}"])
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    ids, mask = batch(encoder, ITEMS)
    fp32 = _states(checkpoint, tmp_path / "fp32", TRUNKS[name], ids, mask, autocast=False)
    bf16 = _states(checkpoint, tmp_path / "bf16", TRUNKS[name], ids, mask, autocast=True)
    assert fp32.dtype == bf16.dtype == torch.float32
    assert torch.equal(bf16, fp32)


@pytest.mark.parametrize("name", ["layer_mix", "hybrid"])
def test_bf16_trains_predicts_and_evaluates_on_a_cpu(tmp_path, checkpoint, name):
    run = tmp_path / "run"
    overrides = [
        f"model.trunk.pretrained={checkpoint}",
        f"model.trunk.cache_dir={tmp_path / 'cache'}",
        "training.max_steps=2",
        "training.eval_every=2",
        "training.mixed_precision=bf16",
        *TRUNKS[name],
    ]
    result = train(tiny_config(run, overrides))
    assert result.best_dir is not None and (run / "best" / "model.safetensors").is_file()
    got = list(predict_texts(run / "best", ["Peter went home", "dull film"], precision="bf16", workers=1))
    fp32 = list(predict_texts(run / "best", ["Peter went home", "dull film"], workers=1))
    assert [p["sentiment"]["label"] in LABELS["sentiment"] for p in got] == [True, True]
    assert [len(p["ner"]["tags"]) for p in got] == [len(p["ner"]["tags"]) for p in fp32] == [3, 2]
    data = {"ner": FIXTURES / "ner_test.jsonl", "sentiment": FIXTURES / "sentiment_test.jsonl"}
    metrics = evaluate(run / "best", data=data, output_dir=tmp_path / "eval", precision="bf16").metrics
    assert metrics["settings"]["precision"] == "bf16"
    assert 0.0 <= metrics["tasks"]["sentiment"]["accuracy"] <= 1.0
