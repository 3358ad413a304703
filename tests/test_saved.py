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


def _other_tokenizer(tmp_path: Path, vocab_size: int) -> Path:
    """The tokenizer.json of another run: trained on other text, of ``vocab_size`` tokens."""
    from mtl_decoder.config import TokenizerConfig
    from mtl_decoder.data.tokenization import train_tokenizer

    texts = [f"another corpus line {i} with words like zebra{i % 7} and quartz" for i in range(200)]
    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=vocab_size, min_frequency=1))
    path = tmp_path / "other-tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_another_runs_tokenizer_is_named_as_the_culprit(tiny_run, tmp_path):
    """Issue 27 case 20: the error blamed config.yaml and labels.json."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_run / "best", folder)
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    shutil.copy(_other_tokenizer(tmp_path, len(vocab) - 37), folder / "tokenizer.json")
    with pytest.raises(UserError) as caught:
        load_model(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder}/tokenizer.json: not the tokenizer saved with") and "config.yaml" not in message


def test_an_older_folders_foreign_tokenizer_is_named_by_its_vocabulary(tiny_run, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(tiny_run / "best", folder)
    weights = folder / "model.safetensors"
    save_file(load_file(str(weights)), str(weights), {"format": "pt", "mtl_decoder_format": "2"})  # no hash
    shutil.copy(_other_tokenizer(tmp_path, 150), folder / "tokenizer.json")
    with pytest.raises(UserError, match=r"tokenizer.json: holds \d+ tokens but model.safetensors was trained with"):
        load_model(folder)


def test_a_folder_of_a_newer_format_is_refused(tiny_run, tmp_path, capsys):
    """Issue 27 case 21: it loaded and predicted without a word, though its keys may mean something else."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from mtl_decoder.saved import FORMAT, FORMAT_KEY

    folder = tmp_path / "model"
    shutil.copytree(tiny_run / "best", folder)
    weights = folder / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    save_file(load_file(str(weights)), str(weights), {**metadata, FORMAT_KEY: str(FORMAT + 1)})
    source = tmp_path / "in.txt"
    source.write_text("a text\n", encoding="utf-8")
    argv = ["predict", "--model", str(folder), "--input", str(source), "--output", str(tmp_path / "out.jsonl")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: {weights}: saved in model-folder format {FORMAT + 1}, newer than this mtl-decoder reads (up to "
        f"{FORMAT}); upgrade mtl-decoder to load it\n"
    )
