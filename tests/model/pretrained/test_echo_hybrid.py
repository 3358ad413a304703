"""Mode echo_hybrid: mode hybrid whose cached blocks read each text twice. AutoModel's own states over the doubled
ids, one text at a time, are the reference for step 0; the CLI trains, saves, predicts and quantizes one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import FAMILIES, tiny_checkpoint
from trunk_runs import batch

import mtl_decoder.model.pretrained.state_cache as state_cache
from mtl_decoder.cli import main
from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.model.trunks.echo_hybrid import EchoHybridDecoder, EchoLayerStates
from mtl_decoder.saved import load_model

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [["EU", "rejects", "German", "call", "."], "Peter Blackburn went home.", ["Rain"]]
BLOCKS = 3


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {family: tiny_checkpoint(root / family, family, layers=BLOCKS) for family in FAMILIES}


def _model(checkpoint: Path, tmp: Path, mode: str, *overrides: str):
    cfg = tiny_config(tmp / "run", [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={tmp}/cache",
                                    f"model.trunk.mode={mode}", *overrides])  # fmt: skip
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    return build_model(cfg, LABELS, encoder).eval(), encoder


def _echo_reference(checkpoint: Path, ids: torch.Tensor, mask: torch.Tensor, cached: int) -> list[torch.Tensor]:
    """Per row, one text at a time: AutoModel's states after block ``cached`` over its ids given twice, the second
    copy's (positions n..2n-1), then AutoModel's blocks above over those alone, from position 0, and its final norm."""
    from transformers import AutoModel

    lower, upper = AutoModel.from_pretrained(checkpoint).eval(), AutoModel.from_pretrained(checkpoint).eval()
    blocks = "h" if hasattr(upper, "h") else "layers"
    setattr(upper, blocks, getattr(upper, blocks)[cached:])
    upper.config.num_hidden_layers = upper.config.n_layer = BLOCKS - cached
    if hasattr(upper, "wpe"):  # GPT-2's learned positions were added below block 1, at n..2n-1
        upper.wpe.weight.data.zero_()
    out = []
    with torch.no_grad():
        for row, n in zip(ids, mask.sum(1).tolist(), strict=True):
            twice = torch.cat([row[:n], row[:n]]).unsqueeze(0)
            states = lower(input_ids=twice, output_hidden_states=True).hidden_states[cached][:, n:]  # (1, n, H)
            out.append(upper(inputs_embeds=states, use_cache=False).last_hidden_state[0])
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_step_zero_is_the_pretrained_top_over_the_second_copys_states(checkpoints, tmp_path, monkeypatch, family):
    """Block 1 cached from the doubled text, blocks 2-3 trained (causal, as pretrained) on the second copy's states
    alone, no native layers: every task route's states equal the pretrained blocks' over the same states."""
    monkeypatch.setattr(state_cache, "STORE_DTYPE", torch.float32)
    model, encoder = _model(checkpoints[family], tmp_path, "echo_hybrid", "model.trunk.train_top=2", "model.n_layers=0")
    assert isinstance(model, EchoHybridDecoder) and isinstance(model.states, EchoLayerStates)
    ids, mask = batch(encoder, ITEMS)
    expected = _echo_reference(checkpoints[family], ids, mask, cached=1)
    layout = model.route_layout(mask, model.task_names, None)
    with torch.no_grad():
        hidden, _ = model.encode(ids, mask, layout, {})
    for route in [r for r in layout.names if r != SHARED]:
        rows = layout.rows(route)
        for row, example in zip(range(rows.start, rows.stop), layout.row_example[rows].tolist(), strict=True):
            n = len(expected[example])
            torch.testing.assert_close(hidden[row][:n], expected[example], atol=1e-4, rtol=1e-4)


def test_echo_states_are_cached_apart_from_the_hybrids(checkpoints, tmp_path):
    echo, encoder = _model(checkpoints["llama"], tmp_path, "echo_hybrid", "model.trunk.train_top=1")
    plain, _ = _model(checkpoints["llama"], tmp_path, "hybrid", "model.trunk.train_top=1")
    ids, mask = batch(encoder, ITEMS)
    got, want = echo.states(ids, mask), plain.states(ids, mask)  # (B, T, H) each
    echo.states.cache.flush()
    plain.states.cache.flush()
    (echo_dir,) = (c.directory for c in echo.states.cache.caches.values())
    (plain_dir,) = (c.directory for c in plain.states.cache.caches.values())
    assert echo_dir.parent == plain_dir.parent and echo_dir.name == plain_dir.name.replace("-fp32-", "-fp32-echo-")
    assert any(echo_dir.glob("shard-*.safetensors")) and any(plain_dir.glob("shard-*.safetensors"))
    assert (got[0, 0] - want[0, 0]).abs().max() > 1e-2  # the first token has now read the whole text
    n = int(mask[2].sum())
    assert got.shape == want.shape and (got[2, n:] == 0).all()


def test_an_echo_hybrid_trains_saves_predicts_and_quantizes_through_the_cli(checkpoints, tmp_path):
    config = tiny_config(tmp_path / "run", [f"model.trunk.pretrained={checkpoints['llama']}",
                                            "model.trunk.mode=echo_hybrid", "model.trunk.train_top=1",
                                            "model.trunk.top_attention=bidirectional",
                                            f"model.trunk.cache_dir={tmp_path / 'cache'}", "training.max_steps=4",
                                            "training.eval_every=4", "training.epochs=1"])  # fmt: skip
    config.save(tmp_path / "echo.yaml")
    assert main(["train", "--config", str(tmp_path / "echo.yaml")]) == 0
    best = tmp_path / "run" / "best"
    assert "echo_hybrid: each text given twice" in (best / "README.md").read_text()
    assert type(load_model(best, device="cpu").model) is EchoHybridDecoder
    source = tmp_path / "in.txt"
    source.write_text("EU rejects German call .\nA gripping film\n", encoding="utf-8")
    outputs = []
    for name in ("a", "b"):  # the second run reads the states the first one cached
        args = ["predict", "--model", str(best), "--input", str(source), "--output", str(tmp_path / name)]
        assert main([*args, "--cache-states"]) == 0
        outputs.append([json.loads(line) for line in (tmp_path / name).read_text().splitlines()])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2
    assert set(outputs[0][0]["predictions"]) == {"ner", "sentiment"}
    quantize = ["quantize", "--model", str(best), "--min-tags", "0", "--min-labels", "0"]
    assert main([*quantize, "--cache-dir", str(tmp_path / "cache")]) == 0
    int8 = tmp_path / "int8.jsonl"
    args = ["predict", "--model", str(best), "--input", str(source), "--output", str(int8), "--precision", "int8"]
    assert main([*args, "--cache-states", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert len(int8.read_text().splitlines()) == 2
    folders = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert any("-w8a8-" in name and "-echo-" in name for name in folders), folders  # int8 echo states: their own
