"""Saved-model formats: a model folder saved before format 2 with model.ffn cgc or mmoe holds the stacked form (an
expert block in every layer), and loads as cgc_stacked / mmoe_stacked; a folder of today's format is read as
written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mtl_decoder.errors import UserError
from mtl_decoder.model import build_model
from mtl_decoder.model.layers import SwiGLU
from mtl_decoder.saved import FORMAT, FORMAT_KEY, load_model, save_model


def _save(tiny_run: Path, folder: Path, ffn: str):
    """A perturbed model with ``ffn`` saved at ``folder``, with the tiny run's tokenizer and labels."""
    saved = load_model(tiny_run / "best", device="cpu")
    config = dataclasses.replace(saved.config, model=dataclasses.replace(saved.config.model, ffn=ffn))
    torch.manual_seed(0)
    model = build_model(config, saved.label_sets, saved.encoder).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_model(folder, model, saved.encoder, config, saved.label_sets)
    return model, saved.encoder


def _as_before_format_2(folder: Path, ffn: str) -> None:
    """What the same model's folder looked like before format 2: ffn named without '_stacked', no format key."""
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["model"]["ffn"] = ffn
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    save_file(load_file(str(folder / "model.safetensors")), str(folder / "model.safetensors"), {"format": "pt"})
    (folder / "manifest.json").unlink()  # folders of then had no manifest


def _logits(model, encoder):
    encoded = encoder.encode_batch([["EU", "rejects", "German", "call"], ["A", "fine", "film", "."]])
    T = max(len(e.ids) for e in encoded)
    ids = torch.zeros(len(encoded), T, dtype=torch.long)
    mask = torch.zeros(len(encoded), T, dtype=torch.bool)
    for i, e in enumerate(encoded):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = True
    with torch.no_grad():
        return model(ids, mask).logits


def test_a_new_folder_records_its_format(tiny_run, tmp_path):
    _save(tiny_run, tmp_path / "m", "cgc")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        assert f.metadata()[FORMAT_KEY] == str(FORMAT)
    loaded = load_model(tmp_path / "m", device="cpu")
    assert loaded.config.model.ffn == "cgc"
    assert isinstance(loaded.model.layers[0].ffn, SwiGLU)  # single-level: a shared bottom under the expert layer


@pytest.mark.parametrize("ffn", ["cgc", "mmoe"])
def test_a_folder_from_before_format_2_loads_as_the_stacked_variant(tiny_run, tmp_path, ffn):
    model, encoder = _save(tiny_run, tmp_path / "m", f"{ffn}_stacked")
    _as_before_format_2(tmp_path / "m", ffn)
    loaded = load_model(tmp_path / "m", device="cpu")
    assert loaded.config.model.ffn == f"{ffn}_stacked"
    assert all(block is not None for block in loaded.model.expert_blocks())
    expected, got = _logits(model, encoder), _logits(loaded.model, encoder)
    assert expected.keys() == got.keys()
    for task in expected:
        torch.testing.assert_close(got[task], expected[task], atol=0, rtol=0)


def test_a_new_folder_is_not_reinterpreted(tiny_run, tmp_path):
    """Format 2 says what 'cgc' means: stacked weights under a config saying 'cgc' are a mismatch, not an old model."""
    _save(tiny_run, tmp_path / "m", "cgc_stacked")
    config = yaml.safe_load((tmp_path / "m" / "config.yaml").read_text(encoding="utf-8"))
    config["model"]["ffn"] = "cgc"
    (tmp_path / "m" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    with pytest.raises(UserError, match="the weights do not match"):
        load_model(tmp_path / "m", device="cpu")
