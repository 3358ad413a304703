"""best/README.md, the model card written with every saved model: base model, tasks and labels, data with
counts, the validation metrics of info.json, the config essentials, intended use and limits."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mtl_decoder.model_card import model_card


def _sections(card: str) -> list[str]:
    return [line[3:] for line in card.splitlines() if line.startswith("## ")]


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_every_saved_model_has_a_card_from_what_the_folder_holds(tiny_run):
    best = tiny_run / "best"
    card = (best / "README.md").read_text(encoding="utf-8")
    assert _sections(card) == [
        "Base model",
        "Tasks and labels",
        "Data",
        "Validation metrics",
        "Configuration",
        "Intended use and limits",
    ]
    meta = _front_matter(card)
    assert meta["library_name"] == "mtl-decoder" and "base_model" not in meta  # a native trunk
    assert {"token-classification", "text-classification"} <= set(meta["tags"])
    assert "trained from scratch" in card and "d_model 32" in card
    labels = json.loads((best / "labels.json").read_text(encoding="utf-8"))
    assert f"| ner | token_tagging | {', '.join(labels['ner'])} | f1 |" in card
    assert "| sentiment | sentence_classification | negative, positive | accuracy |" in card
    info = json.loads((best / "info.json").read_text(encoding="utf-8"))
    assert f"at step {info['step']} (selection score {info['score']:.4f}" in card
    assert f"| ner | f1 | {info['validation']['ner']['f1']:.4f} |" in card
    assert f"| sentiment | accuracy | {info['validation']['sentiment']['accuracy']:.4f} |" in card
    fixtures = Path(__file__).parent / "fixtures"
    assert f"| ner | train | `{fixtures / 'ner_train.jsonl'}` | 60 |" in card  # counted by the trainer
    assert f"| ner | validation | `{fixtures / 'ner_validation.jsonl'}` | 20 |" in card
    assert f"| sentiment | validation | `{fixtures / 'sentiment_validation.jsonl'}` | 20 |" in card
    assert "Not evaluated on:" in card and "inputs longer than 48 sub-words" in card


def test_a_pretrained_trunk_card_names_the_base_model_and_the_benchmark_datas_terms(make_config, tmp_path):
    tasks = [
        {"name": "conll2003", "kind": "token_tagging", "data": {"train": "/data/conll2003/train.jsonl"}},
        {"name": "sst2", "kind": "sentence_classification", "data": {"hub_id": "stanfordnlp/sst2", "train": "train"}},
    ]
    config = make_config(
        tmp_path / "run", ["model.trunk.pretrained=HuggingFaceTB/SmolLM2-135M", "model.trunk.mode=lora"], tasks
    )
    identity = {"source": "HuggingFaceTB/SmolLM2-135M", "revision": None, "architecture": "llama", "layers": 30}
    identity |= {"hidden_size": 576, "sha256": "ab" * 32}
    card = model_card(config, {"conll2003": ["O", "B-PER", "I-PER"], "sst2": ["negative", "positive"]}, identity)
    assert _front_matter(card)["base_model"] == "HuggingFaceTB/SmolLM2-135M"
    assert "`HuggingFaceTB/SmolLM2-135M`, architecture llama, first 30 blocks, hidden size 576" in card
    assert "ab" * 32 in card and "mode lora" in card and "loading needs it, and checks its hash" in card
    assert "Research use only" in card and "CoNLL-2003" in card and "SST-2" in card
    assert "hub dataset `stanfordnlp/sst2`, split `train`" in card
    assert "No validation metrics were saved" in card
    assert "read its model card" in card  # the base model's licence and biases come with it
