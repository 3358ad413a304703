"""Word lists assembled from cached word pieces encode exactly as the tokenizer's own encoding of the whole list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtl_decoder.config import TokenizerConfig
from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer

FIXTURES = Path(__file__).parents[1] / "fixtures"
SENTENCES = [json.loads(line)["tokens"] for line in (FIXTURES / "ner_train.jsonl").read_text().splitlines()]
LISTS = [
    ["Netanyahu", "visited", "Xqzvwk-Blorft", "in", "1996", "."],
    ["U.S.", "officials", "said", "\u200b", "on", "Tuesday"],  # a word the normalizer erases: read as [UNK]
    ["\u200b"],
    ["café", "Straße", "naïve", "\u4e2d\u6587", "🙂", "e\u0301"],
    ["Supercalifragilisticexpialidocious", "xqzvwkblorftqqq", "a"],  # long words: several pieces each
    ["the"] * 70,  # past max_length: truncated
    ["a", "Xqzvwkblorftqqqzzzyyy"],  # the last word cut part way
]


def reference(encoder: TextEncoder, words: list[str]):
    """The encoding without the cache: the tokenizer over the whole list, then the encoder's alignment."""
    raw = encoder.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
    return encoder._from_words(words, raw)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "wordlevel"])
@pytest.mark.parametrize("word_token", ["first", "last"])
@pytest.mark.parametrize("max_length", [8, 16, 64])
def test_assembled_encodings_equal_the_tokenizers(kind, word_token, max_length):
    tok = train_tokenizer(SENTENCES, TokenizerConfig(kind=kind, vocab_size=300, min_frequency=1))
    encoder = TextEncoder(tok, max_length, word_token=word_token)
    assert encoder.pieces is not None
    for _ in range(2):  # the second pass reads every word from the cache
        batch = encoder.encode_batch(LISTS)
        for words, got in zip(LISTS, batch, strict=True):
            want = reference(encoder, words)
            assert (got.ids, got.words, got.spans, got.alignment) == (want.ids, want.words, want.spans, want.alignment)
            alone = encoder.encode_words(words)
            assert (alone.ids, alone.alignment) == (want.ids, want.alignment)
    assert any(e.truncated for e in encoder.encode_batch(LISTS))
    assert encoder.encode_words(["\u200b"]).ids[1] == encoder.unk_id


def test_blank_pieces_are_read_past():
    """A word whose first piece is a lone whitespace piece is read at its next piece, counted as blank-led."""
    tok = train_tokenizer(SENTENCES, TokenizerConfig(kind="wordlevel", vocab_size=300, min_frequency=1))
    tok.add_tokens(["\u2581"])  # a SentencePiece word mark as a piece of its own
    encoder = TextEncoder(tok, 32)
    words = ["in", "\u2581in", "1996"]
    got, want = encoder.encode_words(words), reference(encoder, words)
    assert (got.ids, got.alignment) == (want.ids, want.alignment)
    assert got.alignment.blank_led == 1 and got.alignment.reads[1] == got.alignment.spans[1][0] + 1


def test_a_full_cache_starts_afresh_and_still_encodes_exactly(monkeypatch):
    from mtl_decoder.data import wordpieces

    monkeypatch.setattr(wordpieces, "CAPACITY", 8)
    tok = train_tokenizer(SENTENCES, TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1))
    encoder = TextEncoder(tok, 64)
    for words in LISTS:
        got, want = encoder.encode_words(words), reference(encoder, words)
        assert (got.ids, got.alignment) == (want.ids, want.alignment)
        assert len(encoder.pieces.entries) <= max(8, len(set(words)))
