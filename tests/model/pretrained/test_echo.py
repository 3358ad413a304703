"""model.trunk.mode=echo: each text read twice by the frozen trunk, the states of its second copy kept and cached.
AutoModel's own hidden states over the doubled ids, one text at a time, are the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import assert_fp16_rounded, tiny_checkpoint
from trunk_runs import batch

from mtl_decoder.cli import main
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.model.trunks.echo import EchoStates

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [["EU", "rejects", "German", "call", "."], "Peter Blackburn went home.", ["Rain"]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama")


def _model(checkpoint: Path, cache: Path, mode: str):
    overrides = [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={cache}", f"model.trunk.mode={mode}"]
    cfg = tiny_config(cache.parent / "run", overrides)
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    return build_model(cfg, LABELS, encoder).eval(), encoder


def _reference(checkpoint: Path, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per row: the last block's states over its ids given twice, positions n..2n-1, each row run on its own."""
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(checkpoint).eval()
    out = []
    with torch.no_grad():
        for row, n in zip(ids, mask.sum(1).tolist(), strict=True):
            twice = torch.cat([row[:n], row[:n]]).unsqueeze(0)
            out.append(ref(input_ids=twice).last_hidden_state[0, n:])
    return out


def test_echo_states_are_the_second_copys_and_cached_apart_from_frozen(checkpoint, tmp_path):
    model, encoder = _model(checkpoint, tmp_path / "cache", "echo")
    assert isinstance(model.states, EchoStates) and model.trunk_kind.name == "echo"
    ids, mask = batch(encoder, ITEMS)
    got = model.states(ids, mask)  # computed (padded batch), stored as float16, read back
    for i, want in enumerate(_reference(checkpoint, ids, mask)):
        n = len(want)
        assert_fp16_rounded(got[i, :n], want)
        assert (got[i, n:] == 0).all()
    frozen, _ = _model(checkpoint, tmp_path / "cache", "frozen")
    assert frozen.states.cache.directory != model.states.cache.directory
    assert frozen.states.cache.directory.name + "-echo" == model.states.cache.directory.name
    plain = frozen.states(ids, mask)
    assert not torch.allclose(plain[0, 1:5], got[0, 1:5], atol=1e-3)  # the later copy has seen the whole text


def test_an_echo_model_trains_saves_and_predicts_through_the_cli(checkpoint, tmp_path):
    config = tiny_config(tmp_path / "run", [f"model.trunk.pretrained={checkpoint}", "model.trunk.mode=echo",
                                            f"model.trunk.cache_dir={tmp_path / 'cache'}", "training.max_steps=4",
                                            "training.eval_every=4", "training.epochs=1"])  # fmt: skip
    config.save(tmp_path / "echo.yaml")
    assert main(["train", "--config", str(tmp_path / "echo.yaml")]) == 0
    best = tmp_path / "run" / "best"
    assert "echo: each text given twice" in (best / "README.md").read_text()
    source = tmp_path / "in.txt"
    source.write_text("EU rejects German call .\nA gripping film\n", encoding="utf-8")
    outputs = []
    for name in ("a", "b"):
        assert main(["predict", "--model", str(best), "--input", str(source), "--output", str(tmp_path / name)]) == 0
        outputs.append([json.loads(line) for line in (tmp_path / name).read_text().splitlines()])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2
    assert set(outputs[0][0]["predictions"]) == {"ner", "sentiment"}
