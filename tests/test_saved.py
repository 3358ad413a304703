"""mtl_decoder.saved: every way a model folder can be incomplete or inconsistent is one line naming the file and
the fix (exit status 2 on the command line), raised before anything is predicted; nothing is unpickled."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.saved import load_model


def _truncate(folder: Path) -> str:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors: not a readable safetensors file"


def _empty(folder: Path) -> str:
    (folder / "model.safetensors").write_bytes(b"")
    return "model.safetensors: not a readable safetensors file"


def _random(folder: Path) -> str:
    (folder / "model.safetensors").write_bytes(os.urandom(20_000))
    return "model.safetensors: not a readable safetensors file"


def _labels_not_matching(folder: Path) -> str:
    labels = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    labels["sentiment"].append("neutral")
    (folder / "labels.json").write_text(json.dumps(labels), encoding="utf-8")
    return "model.safetensors: the weights do not match"


def _ffn_not_matching(folder: Path) -> str:
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["model"]["ffn"] = "mmoe"
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return "model.safetensors: the weights do not match"


def _yaml_tag(folder: Path) -> str:
    text = (folder / "config.yaml").read_text(encoding="utf-8")
    (folder / "config.yaml").write_text('x: !!python/object/apply:os.system ["echo pwned"]\n' + text, encoding="utf-8")
    return "config.yaml: not a readable config (could not determine a constructor for the tag"


def _tokenizer_damaged(folder: Path) -> str:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "trunc', encoding="utf-8")
    return "tokenizer.json: not a readable tokenizer file"


def _labels_missing(folder: Path) -> str:
    (folder / "labels.json").unlink()
    return "not a model folder (missing labels.json)"


DAMAGE = {
    "truncated weights": _truncate,
    "empty weights": _empty,
    "random weights": _random,
    "labels not matching the weights": _labels_not_matching,
    "config ffn not matching the weights": _ffn_not_matching,
    "config with a YAML tag": _yaml_tag,
    "damaged tokenizer": _tokenizer_damaged,
    "missing labels": _labels_missing,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_model_folder_is_one_line_and_exit_2(tiny_run, tmp_path, damage, capsys):
    folder = tmp_path / "model"
    shutil.copytree(tiny_run / "best", folder)
    expected = DAMAGE[damage](folder)
    with pytest.raises(UserError) as caught:
        load_model(folder)
    message = str(caught.value)
    assert f"{folder}/{expected}" in message or f"{folder}: {expected}" in message
    assert "\n" not in message
    source = tmp_path / "in.txt"
    source.write_text("a text\n", encoding="utf-8")
    argv = ["predict", "--model", str(folder), "--input", str(source), "--output", str(tmp_path / "out.jsonl")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message}\n"
    assert not (tmp_path / "out.jsonl").exists()


def test_mismatch_messages_name_the_tensor_and_the_fix(tiny_run, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_run / "best", folder)
    _labels_not_matching(folder)
    with pytest.raises(UserError, match=r"sentiment\S* is \(2, 32\), the config wants \(3, 32\).*re-save"):
        load_model(folder)
