"""Saved models: a folder with the resolved config, ``model.safetensors``, the tokenizer and the label sets.

    RUN/best/  config.yaml  model.safetensors  tokenizer.json  labels.json  README.md  manifest.json  [info.json]
    (a pretrained trunk adds trunk.json, its identity, and trunk/, its config and with model.trunk.save=full weights)

README.md is the model card (model_card.py): base model, tasks and labels, data, metrics, intended use and limits.

Writing goes to a temporary folder renamed into place, so a crash never leaves a half-written model. Loading
reads YAML (safe loader), JSON and safetensors only: nothing is unpickled. Every way a folder can be incomplete
or inconsistent (a missing or damaged file, labels that do not fit the weights, a config that does not describe
them) is a one-line ``UserError`` naming the file, raised before the model is used.

The weights file's metadata holds the folder's format (``FORMAT``); a folder without it is older, and its config is
read as it was meant then (``model.ffn`` 'cgc' / 'mmoe' were the stacked forms, 'cgc_stacked' / 'mmoe_stacked' now).
A folder of a newer format is refused: its keys may mean something else than this version reads into them (as
'cgc' did), so loading it could compute another function without a word. The metadata also holds the SHA-256
of the folder's tokenizer.json, so a tokenizer copied in from another run is named as the culprit.

``manifest.json`` lists every other file of the folder (the model card and trunk.json aside) with its size and
SHA-256; a load checks it last, after the checks that say more about a file, so an edit that keeps every shape
(reversed labels, a changed ``rope_theta``) is an error naming the file rather than other answers. A folder without it
loads as before.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from mtl_decoder.config import ExperimentConfig, config_from_dict
from mtl_decoder.config.variants import STACKED_BEFORE_FORMAT_2
from mtl_decoder.data.tokenization import TOKENIZER_FILE, TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.files import (
    WriteFailed,
    atomic_write_json,
    atomic_write_safetensors,
    atomic_write_text,
    path_problem,
    replace_dir,
    temporary_sibling,
)
from mtl_decoder.hashing import file_manifest, sha256_file
from mtl_decoder.model import MultiTaskModel, build_model
from mtl_decoder.model.trunks import TRUNK_DIR, TRUNK_FILE, trunk_for
from mtl_decoder.model_card import MODEL_CARD_FILE, model_card
from mtl_decoder.runtime import default_device
from mtl_decoder.termination import shielded

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
LABELS_FILE = "labels.json"
INFO_FILE = "info.json"
TRUNK_CONFIG = "config.json"
MANIFEST_FILE = "manifest.json"
"""Every file of the folder as saved (its relative path -> size and SHA-256), checked at load; a folder without it
is older and loads as it did (its tokenizer checked by the hash in the weights' metadata)."""
UNLISTED = (MANIFEST_FILE, MODEL_CARD_FILE, TRUNK_FILE)
"""Files the manifest does not cover: itself; the model card, written for people to read and edit; trunk.json, the
pretrained trunk's identity, whose weights hash is checked against the trunk loaded and whose ``source`` a user
edits when the checkpoint moves."""
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, LABELS_FILE)
FORMAT = 2
"""The saved-model format, in model.safetensors' metadata under ``FORMAT_KEY`` (the file every folder has, beside the
weights whose layout it dates). 2: cgc and mmoe are single-level over a shared bottom; absent (1): older."""
FORMAT_KEY = "mtl_decoder_format"
TOKENIZER_HASH_KEY = "mtl_decoder_tokenizer_sha256"


@dataclass
class SavedModel:
    """Everything a saved model folder holds, ready to predict."""

    model: MultiTaskModel
    encoder: TextEncoder
    config: ExperimentConfig
    label_sets: dict[str, list[str]]
    directory: Path

    def for_inference(self, cache_dir: str | Path | None = None, write: bool = False) -> None:
        """Make a frozen trunk's state cache an inference one.

        Make a frozen trunk's state cache an inference one, for every path that runs a loaded model over new text
        (predict, evaluate, a distillation teacher): its folder under ``cache_dir`` (default the model's
        model.trunk.cache_dir, else $MTL_DECODER_CACHE/states, else ~/.cache/mtl-decoder/states) read, written only
        with ``write``, a bounded number of states in memory. A model without a frozen trunk is left as it is."""
        self.model.trunk_kind.use_inference_cache(cache_dir, write=write)


def save_model(
    directory: str | Path,
    model: MultiTaskModel,
    encoder: TextEncoder,
    config: ExperimentConfig,
    label_sets: dict[str, list[str]],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a model folder whole (through a temporary folder), replacing an older one at ``directory``."""
    directory = Path(directory)
    tmp = temporary_sibling(directory)
    tmp.mkdir(parents=True)
    try:
        atomic_write_text(tmp / CONFIG_FILE, config.to_yaml())
        encoder.save(tmp)
        trunk = model.trunk_kind
        state = {k: v.detach().contiguous().cpu() for k, v in trunk.state_to_save().items()}
        metadata = {"format": "pt", FORMAT_KEY: str(FORMAT), TOKENIZER_HASH_KEY: sha256_file(tmp / TOKENIZER_FILE)}
        atomic_write_safetensors(tmp / WEIGHTS_FILE, state, metadata=metadata)
        identity = trunk.identity()
        trunk.save_files(tmp)  # a pretrained trunk: trunk.json (its identity) and trunk/
        atomic_write_json(tmp / LABELS_FILE, label_sets)
        if extra:
            atomic_write_json(tmp / INFO_FILE, extra)
        card = model_card(
            config, label_sets, identity.to_dict() if identity is not None else None, extra, model.num_parameters(True)
        )
        atomic_write_text(tmp / MODEL_CARD_FILE, card)
        atomic_write_json(tmp / MANIFEST_FILE, file_manifest(tmp, skip=UNLISTED))  # last: it lists the others
        replace_dir(tmp, directory)
    except (OSError, SafetensorError, WriteFailed) as err:  # a full disk
        reason = err.reason if isinstance(err, WriteFailed) else (str(err).strip().splitlines() or [""])[0]
        raise UserError(
            f"{directory}: cannot write the model ({reason}); its temporary folder was removed, {directory} is as it "
            "was"
        ) from None
    finally:
        with shielded():
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_model(directory: str | Path, device: torch.device | str | None = None) -> SavedModel:
    """A saved model folder, ready to predict, on ``device`` (default: the machine's accelerator, if any)."""
    directory = Path(directory)
    problem = path_problem(directory, "folder")
    if problem:
        raise UserError(f"{directory}: no such model folder" if "not found" in problem else f"{directory}: {problem}")
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise UserError(f"{directory}: not a model folder (missing {name})")
    metadata = _metadata(directory / WEIGHTS_FILE)
    config = read_config(directory / CONFIG_FILE, _saved_format(directory / WEIGHTS_FILE, metadata))
    label_sets = read_labels(directory / LABELS_FILE, config)
    words_as_text = trunk_for(config.model).pretrained or config.model.lexicon.words_as_text
    encoder = TextEncoder.load(
        directory, config.data.max_length, words_as_text, config.model.word_token_position, config.model.all_caps
    )
    _check_tokenizer(directory, metadata)  # readable (above), but is it this model's?
    manifest = _read_manifest(directory)
    identity = _read_identity(directory / TRUNK_FILE) if trunk_for(config.model).pretrained else None
    saved_trunk = directory / TRUNK_DIR if identity is not None else None
    if saved_trunk is not None and not (saved_trunk / TRUNK_CONFIG).is_file():
        raise UserError(
            f"{saved_trunk / TRUNK_CONFIG}: missing (the pretrained trunk's config): not a complete model folder; "
            "copy the whole folder again"
        )
    changed = _changed(directory, manifest)
    model = build_model(config, label_sets, encoder, saved_trunk=saved_trunk, expected_identity=identity)
    _load_weights(model, directory / WEIGHTS_FILE, encoder.vocab_size, changed)
    _check_manifest(directory, changed)  # what passed every check above may still have been edited
    model.eval()
    model.to(device if device is not None else default_device())
    return SavedModel(model, encoder, config, label_sets, directory)


def _metadata(weights: Path) -> dict[str, str] | None:
    """The weights file's metadata; None when unreadable (reported by _load_weights, naming it)."""
    try:
        with safe_open(str(weights), "pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError, ValueError):
        return None


def _saved_format(weights: Path, metadata: dict[str, str] | None) -> int:
    """The folder's format from its weights' metadata.

    1 when absent (saved before formats were recorded); a
    newer format than this version's is refused (see the module doc)."""
    if metadata is None:
        return FORMAT
    value = metadata.get(FORMAT_KEY, "1")
    if not value.isdigit() or int(value) > FORMAT:
        raise UserError(
            f"{weights}: saved in model-folder format {value}, newer than this mtl-decoder reads (up to {FORMAT}); "
            "upgrade mtl-decoder to load it"
        )
    return int(value)


def _check_tokenizer(directory: Path, metadata: dict[str, str] | None) -> None:
    """The folder's tokenizer.json is the one saved with its weights (folders of before the hash: not checked)."""
    expected = (metadata or {}).get(TOKENIZER_HASH_KEY)
    tokenizer = directory / TOKENIZER_FILE
    if expected and tokenizer.is_file() and sha256_file(tokenizer) != expected:
        raise UserError(
            f"{tokenizer}: not the tokenizer saved with {directory / WEIGHTS_FILE} (another model's?): the folder's "
            "files must come from one saved model; copy the whole folder again"
        )


def add_to_manifest(directory: str | Path, name: str) -> None:
    """List a file added to (or replaced in) a saved model folder, e.g. by ``quantize``, in its manifest.

    The other files' entries are unchanged. A folder saved before manifests is left without one; the other files
    are checked first, so a folder whose files were edited is refused rather than blessed."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    if manifest is None:
        return
    others = {key: entry for key, entry in manifest.items() if key != name}
    _check_manifest(directory, _changed(directory, others))
    path = directory / name
    manifest[name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    atomic_write_json(directory / MANIFEST_FILE, dict(sorted(manifest.items())))


def _read_manifest(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The folder's manifest (None: a folder saved before manifests); a listed file that is missing is an error."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err}); copy the whole model folder again") from None
    ok = isinstance(files, dict) and all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("bytes"), int)
        for v in files.values()
    )
    if not ok:
        raise UserError(f"{path}: expected file -> {{bytes, sha256}}; copy the whole model folder again")
    missing = next((name for name in files if not (directory / name).is_file()), None)
    if missing is not None:
        raise UserError(f"{directory / missing}: missing (listed in {MANIFEST_FILE}); copy the whole folder again")
    return files


def _changed(directory: Path, manifest: dict[str, dict[str, Any]] | None) -> list[str]:
    """The manifest's files whose size or SHA-256 is no longer the saved one (none without a manifest)."""
    changed = []
    for name, saved in (manifest or {}).items():
        if name in UNLISTED:
            continue
        path = directory / name
        if path.stat().st_size != saved["bytes"] or sha256_file(path) != saved["sha256"]:
            changed.append(name)
    return changed


def _check_manifest(directory: Path, changed: list[str]) -> None:
    """A one-line error naming the first file that differs from the manifest."""
    if changed:
        also = f" (also changed: {', '.join(changed[1:4])})" if len(changed) > 1 else ""
        raise UserError(
            f"{directory / changed[0]}: changed since the model was saved (not the SHA-256 in {MANIFEST_FILE}){also}: "
            "a model folder's files must stay as saved; restore the file or copy the whole folder again"
        )


def read_config(path: Path, saved_format: int = FORMAT) -> ExperimentConfig:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        reason = str(err).splitlines()[0]
        fix = (
            "a saved config has no YAML tags: remove the tag"
            if "tag" in reason
            else "restore the file from the saved model"
        )
        raise UserError(f"{path}: not a readable config ({reason}); {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a config (expected a mapping)")
    model = data.get("model")
    if saved_format < 2 and isinstance(model, dict) and model.get("ffn") in STACKED_BEFORE_FORMAT_2:
        data["model"] = {**model, "ffn": STACKED_BEFORE_FORMAT_2[model["ffn"]]}  # what it meant then
    if isinstance(model, dict) and "word_token" not in model:  # saved before the key: the default then was 'first'
        data["model"] = {**data["model"], "word_token": "first"}
    try:
        return config_from_dict(data)
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    except (TypeError, KeyError, AttributeError) as err:
        raise UserError(f"{path}: not a config this version can read ({err})") from None


def read_labels(path: Path, config: ExperimentConfig) -> dict[str, list[str]]:
    try:
        labels = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    ok = isinstance(labels, dict) and all(
        isinstance(v, list) and v and all(isinstance(x, str) for x in v) for v in labels.values()
    )
    if not ok:
        raise UserError(f"{path}: expected task -> list of label names")
    missing = [t for t in config.tasks if t not in labels]
    if missing:
        raise UserError(f"{path}: no labels for task '{missing[0]}' of {path.parent / CONFIG_FILE}")
    return {t: labels[t] for t in config.tasks}


def _load_weights(
    model: MultiTaskModel, path: Path, vocab_size: int | None = None, changed: list[str] | tuple[str, ...] = ()
) -> None:
    """The weights into ``model``; a mismatch names the tensor, both shapes and (with a manifest) the changed files."""
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise UserError(f"{path}: not a readable safetensors file ({err}); re-save or re-train the model") from None
    expected = model.trunk_kind.state_to_save()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    rows = next((state[k].shape[0] for k in wrong if _only_rows_differ(state[k], expected[k], vocab_size)), None)
    if rows is not None and (
        not changed or TOKENIZER_FILE in changed
    ):  # the vocabulary is the tokenizer's: a folder of before the tokenizer hash
        raise UserError(
            f"{path.parent / TOKENIZER_FILE}: holds {vocab_size} tokens but {path.name} was trained with {rows}: the "
            "tokenizer comes from another model; copy the whole folder again"
        )
    if missing or unexpected or wrong:
        details = []
        if missing:
            details.append(f"missing {', '.join(missing[:3])}")
        if unexpected:
            details.append(f"unexpected {', '.join(unexpected[:3])}")
        if wrong:
            k = wrong[0]
            details.append(f"{k} is {tuple(state[k].shape)}, the config wants {tuple(expected[k].shape)}")
        if changed:
            details.append(f"changed since saved: {', '.join(changed[:3])}")
        raise UserError(
            f"{path}: the weights do not match {path.parent / CONFIG_FILE} and {path.parent / LABELS_FILE} "
            f"({'; '.join(details)}): the folder's files must come from one saved model; copy the whole folder again "
            "or re-save the model"
        )
    model.load_state_dict(state, strict=model.trunk_kind.loads_strictly)


def _only_rows_differ(saved: torch.Tensor, wanted: torch.Tensor, vocab_size: int | None) -> bool:
    """A tensor of one row per token whose row count alone differs: the vocabulary (the tokenizer) changed."""
    return (
        wanted.dim() > 0
        and wanted.shape[0] == vocab_size
        and saved.dim() == wanted.dim()
        and saved.shape[0] != vocab_size
        and saved.shape[1:] == wanted.shape[1:]
    )


def _read_identity(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path.parent}: not a complete model folder (missing {TRUNK_FILE}, the trunk's identity)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
