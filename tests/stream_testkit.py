"""Shared helpers of the inference and data tests: tiny saved models (random, perturbed weights; no training) over a
tokenizer trained on the test fixtures.

Imported by name (``from stream_testkit import ...``): it lies in tests/, which pyproject's pytest ``pythonpath``
puts on sys.path, so a test in any folder finds it however pytest is started (``pytest tests/data`` included).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from helpers import FIXTURES, tiny_config

from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.model import build_model
from mtl_decoder.saved import load_model, save_model

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
FEATURES = ["model.char_embedding=8", "model.word_features=true", "model.word_hash_buckets=64", "model.word_hash_dim=8"]


def fixture_texts() -> list[str]:
    texts = []
    for name in ("ner_train.jsonl", "sentiment_train.jsonl"):
        for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            texts.append(record["text"] if "text" in record else " ".join(record["tokens"]))
    return texts


def saved_model(directory: Path, overrides: list[str] = (), seed: int = 0, std: float = 0.3) -> Path:
    """A saved model of the tiny config with ``overrides``, its weights perturbed by N(0, std) so that every
    residual branch and gate does something (a fresh model's layers are the identity)."""
    config = tiny_config(directory / "run", ["model.attention=causal", *overrides])
    tokenizer = train_tokenizer(fixture_texts(), config.tokenizer)
    encoder = TextEncoder(tokenizer, config.data.max_length)
    labels = {"ner": NER_LABELS, "sentiment": ["negative", "positive"]}
    torch.manual_seed(seed)
    model = build_model(config, labels, encoder)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)
    return save_model(directory / "model", model, encoder, config, labels)


def load(directory: Path):
    return load_model(directory)
