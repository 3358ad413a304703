"""The student's prediction path with its fast parts (word lists assembled from cached word pieces) gives exactly
the predictions of the straightforward path (the tokenizer over each whole list): tags, labels, probabilities, windows
and untagged counts, on a tiny model with every per-word feature and a CRF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING, ModelConfig, TokenizerConfig
from mtl_decoder.data.batching import EncodedExample
from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.inference.predictor import Predictor
from mtl_decoder.model import MTLDecoder, TaskHeadSpec
from mtl_decoder.model.trunks.native import NativeTrunk

FIXTURES = Path(__file__).parents[1] / "fixtures"
SENTENCES = [json.loads(line)["tokens"] for line in (FIXTURES / "ner_train.jsonl").read_text().splitlines()]
LABELS = {"ner": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], "sent": ["neg", "pos"]}


def predictor(fast: bool) -> Predictor:
    tok = train_tokenizer(SENTENCES, TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1))
    cfg = ModelConfig(
        d_model=32, n_layers=2, n_heads=2, expert_hidden=16, dropout=0.0, char_embedding=8, word_features=True,
        word_hash_buckets=256, word_hash_dim=8, tagging_decoder="crf",
    )  # fmt: skip
    tasks = [TaskHeadSpec("ner", TAGGING, tuple(LABELS["ner"])), TaskHeadSpec("sent", CLASSIFICATION, ("neg", "pos"))]
    torch.manual_seed(0)
    model = NativeTrunk(cfg).bind(MTLDecoder(cfg, tasks, vocab_size=tok.get_vocab_size())).eval()
    for p in model.parameters():  # an untrained model's heads start near zero: spread the scores
        torch.nn.init.normal_(p, std=0.5)
    encoder = TextEncoder.for_model(tok, cfg, 24)  # short: long items are tagged in windows
    if not fast:
        encoder.pieces = None
    return Predictor(model, encoder, LABELS, batch_size=4, workers=1)


def test_fast_path_predicts_exactly_what_the_reference_does():
    items = [*SENTENCES, SENTENCES[0] * 4, ["\u200b", "Paris", "Xqzvwkblorftqqqzzzyyyxxxwwwvvv" * 3], ["a"]]
    fast, slow = predictor(True), predictor(False)
    assert fast.encoder.pieces is not None
    for _ in range(2):  # cold, then every word from the cache
        got, want = list(fast.predict(items)), list(slow.predict(items))
        assert len(got) == len(want) == len(items)
        for a, b in zip(got, want, strict=True):
            assert (a.words, a.tags, a.labels, a.probs) == (b.words, b.tags, b.labels, b.probs)
            assert (a.windows, a.untagged, a.truncated) == (b.windows, b.untagged, b.truncated)
    assert any(p.windows > 1 for p in got) and len({tuple(t) for p in got for t in p.tags.values()}) > 3


def test_each_item_alone_through_the_model_gives_the_same_prediction():
    """A straightforward reference: every item that fits one window encoded by the tokenizer, collated alone, run
    through the model and decoded (softmax, Viterbi) on its own: the same tags and labels, and probabilities equal up
    to float rounding (a row's sums run over its batch's padding)."""
    fast, slow = predictor(True), predictor(False)
    items = [s for s in SENTENCES if not slow.encoder.encode_words(s).truncated]
    assert len(items) > 5
    got = list(fast.predict(items))
    for words, pred in zip(items, got, strict=True):
        enc = slow.encoder.encode_words(words)
        batch = slow.collate([EncodedExample.unlabelled(enc)])
        with torch.inference_mode():
            out = slow.model(**batch)
            tag_ids = slow.model.decode_tags("ner", out.logits["ner"], batch["word_read"])[0]
            probs = out.logits["sent"].float().softmax(-1)[0].tolist()
        assert pred.tags["ner"] == [LABELS["ner"][t] for t in tag_ids]
        assert pred.probs["sent"] == pytest.approx(dict(zip(LABELS["sent"], probs, strict=True)), abs=1e-6)
        assert pred.labels["sent"] == LABELS["sent"][probs.index(max(probs))]


def test_onednn_products_predict_exactly_what_torch_products_do(monkeypatch):
    """exact_matmul's products (on where this torch has oneDNN) against torch's own: every batch's logits equal bit
    for bit, and so every tag, label and probability."""
    from mtl_decoder.model import exact_matmul

    calls = []
    if exact_matmul._OP is not None:
        real = exact_matmul._OP
        monkeypatch.setattr(exact_matmul, "_OP", lambda *a: calls.append(1) or real(*a))
    fast = predictor(True)
    items = [*SENTENCES, SENTENCES[0] * 4]

    def run() -> tuple[list, list]:
        logits = []
        preds = list(fast.predict(items, on_batch=lambda out, _b: logits.append(dict(out.logits))))
        return preds, logits

    got, got_logits = run()
    with exact_matmul.disabled():
        want, want_logits = run()
    assert exact_matmul._OP is None or calls  # the fast products ran where they can
    assert len(got_logits) == len(want_logits) > 1
    for a, b in zip(got_logits, want_logits, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for a, b in zip(got, want, strict=True):
        assert (a.tags, a.labels, a.probs) == (b.tags, b.labels, b.probs)
