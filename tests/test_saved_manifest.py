"""A model folder's manifest: every file as saved, checked at load, so an edit that keeps the shapes is named
rather than predicted with; folders from before the manifest load as they did. Weights get the folder's permissions,
and a weights mismatch blames the tensor with both shapes, not the tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from mtl_decoder.errors import UserError
from mtl_decoder.saved import MANIFEST_FILE, load_model, save_model


@pytest.fixture
def folder(tiny_run, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_run / "best", tmp_path / "model"))


def _logits(folder: Path) -> dict[str, torch.Tensor]:
    saved = load_model(folder, device="cpu")
    batch = saved.encoder.encode_batch([["EU", "rejects", "German", "call"]])[0]
    ids = torch.tensor([batch.ids])
    with torch.no_grad():
        out = saved.model(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool))
    return {k: v.clone() for k, v in out.logits.items()}


def test_the_manifest_lists_every_file_but_itself_and_the_model_card(folder):
    listed = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert sorted(listed) == [n for n in on_disk if n not in (MANIFEST_FILE, "README.md")]
    import hashlib

    for name, entry in listed.items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _reverse_labels(folder: Path) -> str:
    labels = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    labels["sentiment"] = labels["sentiment"][::-1]
    (folder / "labels.json").write_text(json.dumps(labels), encoding="utf-8")
    return "labels.json"


def _attention_edited(folder: Path) -> str:
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    assert config["model"]["attention"] == "bidirectional"
    config["model"]["attention"] = "causal"
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return "config.yaml"


def _word_token_edited(folder: Path) -> str:
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["model"]["word_token"] = "last" if config["model"].get("word_token") != "last" else "first"
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return "config.yaml"


def _info_edited(folder: Path) -> str:
    with open(folder / "info.json", "a", encoding="utf-8") as f:
        f.write(" ")
    return "info.json"


@pytest.mark.parametrize("edit", [_reverse_labels, _attention_edited, _word_token_edited, _info_edited])
def test_an_edit_that_keeps_the_shapes_is_an_error_naming_the_file(folder, edit):
    """Issue 38 case 4: each of these loaded and gave other answers."""
    name = edit(folder)
    with pytest.raises(UserError) as caught:
        load_model(folder, device="cpu")
    message = str(caught.value)
    assert message.startswith(f"{folder / name}: changed since the model was saved") and "\n" not in message


def test_a_listed_file_that_is_missing_is_named(folder):
    (folder / "info.json").unlink()
    with pytest.raises(UserError, match=f"^{folder / 'info.json'}: missing \\(listed in manifest.json\\)"):
        load_model(folder, device="cpu")


def test_a_folder_saved_before_the_manifest_loads_and_still_checks_its_tokenizer(folder, tmp_path):
    with_manifest = _logits(folder)
    (folder / MANIFEST_FILE).unlink()
    without = _logits(folder)
    assert with_manifest.keys() == without.keys()
    assert all(torch.equal(with_manifest[k], without[k]) for k in without)
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"] = tokenizer.get("added_tokens", [])
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1), encoding="utf-8")
    with pytest.raises(UserError, match=r"tokenizer.json: not the tokenizer saved with"):
        load_model(folder, device="cpu")


def test_the_pinned_folder_of_before_the_manifest_loads():
    pinned = Path(__file__).parent / "fixtures" / "pinned" / "model"
    assert not (pinned / MANIFEST_FILE).exists()
    assert load_model(pinned, device="cpu").label_sets


def test_weights_get_the_permissions_of_the_folders_other_files(folder):
    """Issue 38 case 15: model.safetensors was 0600 while the rest was 0644."""
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == modes["config.yaml"] == modes["labels.json"]


def _edit_weights(folder: Path, change) -> tuple[str, tuple, tuple]:
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    name = next(k for k in state if state[k].dim() == 2 and state[k].shape[0] > state[k].shape[1])
    before = tuple(state[name].shape)
    state[name] = change(state[name]).contiguous()
    save_file(state, str(weights), {"format": "pt", "mtl_decoder_format": "2"})  # as an older folder: no hashes
    (folder / MANIFEST_FILE).unlink(missing_ok=True)
    return name, before, tuple(state[name].shape)


def test_a_transposed_embedding_is_named_with_both_shapes_not_blamed_on_the_tokenizer(folder):
    """Issue 38 case 13: it was reported as 'the tokenizer comes from another model'."""
    name, wanted, found = _edit_weights(folder, lambda t: t.t())
    with pytest.raises(UserError) as caught:
        load_model(folder, device="cpu")
    message = str(caught.value)
    assert f"{name} is {found}, the config wants {wanted}" in message and "tokenizer" not in message


def test_a_changed_width_is_named_with_both_shapes_not_blamed_on_the_tokenizer(folder):
    """Issue 38 case 13: a changed d_model said 'holds 400 tokens but ... trained with 400'."""
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    config["model"]["d_model"] = 48
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(UserError) as caught:
        load_model(folder, device="cpu")
    message = str(caught.value)
    assert "the config wants" in message and ", 32), the config wants (" in message and "tokens but" not in message
    assert "changed since saved: config.yaml" in message


def test_a_save_over_an_old_folder_lists_the_new_files(tiny_run, folder, tmp_path):
    saved = load_model(folder, device="cpu")
    target = tmp_path / "again"
    save_model(target, saved.model, saved.encoder, saved.config, saved.label_sets)
    assert load_model(target, device="cpu").label_sets == saved.label_sets
    assert "info.json" not in json.loads((target / MANIFEST_FILE).read_text(encoding="utf-8"))


def test_non_finite_outputs_are_an_error_naming_the_record(folder, tmp_path, capsys):
    """Issue 38 case 4: all-NaN weights tagged every word O and wrote bare NaN into the JSON lines."""
    from mtl_decoder.cli import main

    saved = load_model(folder, device="cpu")
    with torch.no_grad():
        for p in saved.model.parameters():
            p.fill_(float("nan"))
    nan = save_model(tmp_path / "nan", saved.model, saved.encoder, saved.config, saved.label_sets)
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a fine film"}\n{"text": "EU rejects German call"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(nan), "--input", str(source), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: record 1 of the input ('a fine film'): the model's ") and err.count("\n") == 1
    assert "outputs are not finite" in err and not out.exists()
