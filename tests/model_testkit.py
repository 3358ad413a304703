"""Shared helpers of the model tests: tiny configs, tiny batches, parameter perturbation.

Imported by name (``from model_testkit import ...``): tests/ is on the path (``pythonpath`` in pyproject.toml,
no ``__init__.py``); the name is unique in the tree so it cannot shadow another test folder's helpers.
"""

from __future__ import annotations

import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING, ModelConfig
from mtl_decoder.model import MTLDecoder, TaskHeadSpec
from mtl_decoder.model.trunks.native import NativeTrunk

VOCAB = 40
PAD = 0
NER_LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
SENT_LABELS = ("neg", "pos", "neutral")
FFN_VARIANTS = ("ple", "cgc", "mmoe", "cgc_stacked", "mmoe_stacked", "mlp")
GATED_VARIANTS = FFN_VARIANTS[:-1]
ATTENTION_MODES = ("causal", "bidirectional")


def tiny_config(**overrides) -> ModelConfig:
    """d_model 32, 2 layers, 2 heads, expert_hidden 16, no dropout (tests are deterministic)."""
    settings = dict(d_model=32, n_layers=2, n_heads=2, expert_hidden=16, dropout=0.0)
    settings.update(overrides)
    return ModelConfig(**settings)


def tiny_specs() -> list[TaskHeadSpec]:
    return [TaskHeadSpec("ner", TAGGING, NER_LABELS), TaskHeadSpec("sent", CLASSIFICATION, SENT_LABELS)]


def tiny_model(seed: int = 0, specs: list[TaskHeadSpec] | None = None, **overrides) -> MTLDecoder:
    torch.manual_seed(seed)
    cfg = tiny_config(**overrides)
    return NativeTrunk(cfg).bind(MTLDecoder(cfg, specs or tiny_specs(), vocab_size=VOCAB, pad_id=PAD))


def perturb(model: torch.nn.Module, seed: int = 1, std: float = 0.1) -> torch.nn.Module:
    """Add N(0, std) noise to every parameter, so that zero-initialised residual branches (and gates) do
    something: a test of masking or routing on a fresh model would be vacuous (every layer is the identity).
    Noise is added rather than replacing values, so norm weights stay near 1 and softmax gates stay soft."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)
    return model


def word_spans(lengths: list[int], T: int, seed: int) -> torch.Tensor:
    """(B, T) word_index: real tokens grouped into words of 1-2 sub-words, -1 on padding."""
    gen = torch.Generator().manual_seed(seed)
    word_index = torch.full((len(lengths), T), -1, dtype=torch.long)
    for b, n in enumerate(lengths):
        word, pos = 0, 0
        while pos < n:
            size = min(int(torch.randint(1, 3, (1,), generator=gen)), n - pos)
            word_index[b, pos : pos + size] = word
            word, pos = word + 1, pos + size
    return word_index


def iob2_tags(n_words: int, gen: torch.Generator) -> list[int]:
    """A random valid IOB2 tag sequence over NER_LABELS (I-X only after B-X or I-X)."""
    tags, prev = [], "O"
    for _ in range(n_words):
        choices = ["O", "B-PER", "B-LOC"]
        if prev != "O":
            choices.append("I-" + prev[2:])
        lab = choices[int(torch.randint(len(choices), (1,), generator=gen))]
        tags.append(NER_LABELS.index(lab))
        prev = lab
    return tags


def tiny_batch(lengths: list[int], T: int | None = None, seed: int = 0) -> dict[str, torch.Tensor | dict]:
    """A right-padded batch with word_index and labels for both tiny tasks.

    ner labels sit on the first sub-word of each word (valid IOB2), -100 elsewhere; sent is one class.
    """
    T = T or max(lengths)
    gen = torch.Generator().manual_seed(seed)
    B = len(lengths)
    input_ids = torch.full((B, T), PAD, dtype=torch.long)
    attention_mask = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(lengths):
        input_ids[b, :n] = torch.randint(1, VOCAB, (n,), generator=gen)
        attention_mask[b, :n] = True
    word_index = word_spans(lengths, T, seed)
    ner = torch.full((B, T), -100, dtype=torch.long)
    for b in range(B):
        n_words = int(word_index[b].max()) + 1
        tags = iob2_tags(n_words, gen)
        for t in range(T):
            w = int(word_index[b, t])
            if w >= 0 and (t == 0 or word_index[b, t - 1] != w):
                ner[b, t] = tags[w]
    sent = torch.randint(len(SENT_LABELS), (B,), generator=gen)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "word_index": word_index,
        "word_read": first_positions(word_index),
        "labels": {"ner": ner, "sent": sent},
    }


def first_positions(word_index: torch.Tensor) -> torch.Tensor:
    """(B, W) each word's first sub-word position (the labels above sit there), -1 past a row's words."""
    rows = [[t for t, w in enumerate(wi) if w >= 0 and (t == 0 or wi[t - 1] != w)] for wi in word_index.tolist()]
    W = max([1, *(len(r) for r in rows)])
    return torch.tensor([[*r, *[-1] * (W - len(r))] for r in rows], dtype=torch.long)


def gold_word_tags(labels: torch.Tensor, word_index: torch.Tensor) -> list[list[int]]:
    """Word-level gold tags of each row (the labels on first sub-words, in word order)."""
    out = []
    for lab, wi in zip(labels.tolist(), word_index.tolist(), strict=True):
        out.append([t for t in lab if t != -100])
        assert len(out[-1]) == (max(wi) + 1 if max(wi) >= 0 else 0)
    return out
