"""The Predictor's batches: length-sorted pieces cut at ``batch_size`` rows and ``max_tokens`` padded sub-words
(rows x the longest; 0: rows only), every piece once, in order; and the predictions do not depend on how the pieces
are cut."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from alignment_testkit import byte_level, words_of_length

from mtl_decoder.config import CLASSIFICATION, TAGGING, ModelConfig
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.inference.predictor import MAX_TOKENS, Predictor, _Piece
from mtl_decoder.model import MTLDecoder, TaskHeadSpec
from mtl_decoder.model.trunks.native import NativeTrunk

LABELS = {"ner": ["O", "B-X", "I-X"], "sent": ["neg", "pos"]}


def tiny_predictor(max_tokens: int | None = None, batch_size: int = 8) -> Predictor:
    tok = byte_level()
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, expert_hidden=8, dropout=0.0)
    tasks = [TaskHeadSpec("ner", TAGGING, tuple(LABELS["ner"])), TaskHeadSpec("sent", CLASSIFICATION, ("neg", "pos"))]
    model = NativeTrunk(cfg).bind(MTLDecoder(cfg, tasks, vocab_size=tok.get_vocab_size())).eval()
    encoder = TextEncoder.for_model(tok, cfg, 48)
    return Predictor(model, encoder, LABELS, batch_size=batch_size, workers=1, max_tokens=max_tokens)


def piece(length: int) -> _Piece:
    return _Piece(0, 0, 1, SimpleNamespace(ids=[0] * length))


@pytest.mark.parametrize("max_tokens", [0, 1, 7, 40, 100])
def test_batches_keep_both_bounds_and_are_as_large_as_they_allow(max_tokens):
    predictor = tiny_predictor(max_tokens, batch_size=5)
    rng = random.Random(max_tokens or 0)
    pieces = sorted((piece(rng.randint(1, 30)) for _ in range(200)), key=lambda p: len(p.encoded.ids))
    batches = predictor._batches(pieces)
    assert [p for b in batches for p in b] == pieces  # every piece once, in order
    for i, batch in enumerate(batches):
        longest = max(len(p.encoded.ids) for p in batch)
        assert len(batch) <= 5
        assert not max_tokens or len(batch) * longest <= max_tokens or len(batch) == 1
        if i + 1 < len(batches):  # the next piece did not fit: a bound would have been broken (greedy cut)
            grown = len(batch) + 1
            nxt = len(batches[i + 1][0].encoded.ids)
            assert grown > 5 or (max_tokens and grown * nxt > max_tokens)


def test_predictions_do_not_depend_on_the_token_bound():
    items = [words_of_length(n) for n in (1, 30, 2, 3, 25, 4, 12, 40, 5, 6, 7, 8, 9, 10, 11, 60)]
    rows_only = list(tiny_predictor(0).predict(items))
    bounded = list(tiny_predictor(32).predict(items))
    assert len(bounded) == len(rows_only) == len(items)
    for a, b in zip(rows_only, bounded, strict=True):
        assert a.tags == b.tags and a.labels == b.labels and a.windows == b.windows
        for label, p in a.probs["sent"].items():
            assert b.probs["sent"][label] == pytest.approx(p, rel=1e-5, abs=1e-7)


def test_the_default_bound_is_the_native_one_and_a_bad_bound_is_refused():
    assert tiny_predictor().max_tokens == MAX_TOKENS["native"]
    with pytest.raises(UserError, match="max_tokens"):
        tiny_predictor(-1)
