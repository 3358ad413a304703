"""Segmenter: a text fed in pieces is cut into the same words, with the same tokens, as the text fed whole; a word
is held back until something after it closes it."""

from __future__ import annotations

import random

import pytest
from stream_testkit import fixture_texts, tiny_config

from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.inference.segmenter import Segmenter

TEXT = "Peter Blackburn lives in  London.\tEU rejects German call, said Müller (again)! 😀 end"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    config = tiny_config(tmp_path_factory.mktemp("seg"), [])
    return train_tokenizer(fixture_texts(), config.tokenizer)


def _words(segmenter: Segmenter, pieces: list[str]) -> list:
    out = []
    for piece in pieces:
        out += segmenter.feed(piece)
    return out + segmenter.feed("", final=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pieces_give_the_words_and_tokens_of_the_whole_text(tokenizer, seed):
    whole = _words(Segmenter(tokenizer), [TEXT])
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(TEXT):
        k = rng.randint(1, 6)
        pieces.append(TEXT[i : i + k])
        i += k
    chunked = _words(Segmenter(tokenizer), pieces)
    assert [(w.text, w.start, w.end, w.ids) for w in chunked] == [(w.text, w.start, w.end, w.ids) for w in whole]
    # the words and spans `predict` finds in the same text (TextEncoder.encode_text)
    encoded = TextEncoder(tokenizer, 512).encode_text(TEXT)
    assert [w.text for w in whole] == encoded.words
    assert [(w.start, w.end) for w in whole] == encoded.spans
    assert all(TEXT[w.start : w.end] == w.text for w in whole)
    # every token of the text is committed with exactly one word, in order
    assert [i for w in whole for i in w.ids] == tokenizer.encode(TEXT, add_special_tokens=False).ids


def test_a_word_waits_for_what_closes_it(tokenizer):
    segmenter = Segmenter(tokenizer)
    assert segmenter.feed("New") == []  # "Newcastle" may follow
    assert segmenter.feed("castle") == []
    closed = segmenter.feed(" upon")
    assert [(w.text, w.start, w.end) for w in closed] == [("Newcastle", 0, 9)]
    assert [w.text for w in segmenter.feed("", final=True)] == ["upon"]
    assert segmenter.feed("", final=True) == []


class _CountingTokenizer:
    """The tokenizer, counting the token ids the segmenter makes Python build (``Encoding.ids`` is a fresh list)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.built = tokenizer, 0

    def encode(self, text, **kwargs):
        return _CountingEncoding(self, self.tokenizer.encode(text, **kwargs))

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


class _CountingEncoding:
    def __init__(self, owner, encoding):
        self.owner, self.encoding = owner, encoding

    @property
    def ids(self):
        ids = self.encoding.ids
        self.owner.built += len(ids)
        return ids

    def __getattr__(self, name):
        return getattr(self.encoding, name)


def test_a_word_that_never_closes_costs_linear_work_and_the_same_words(tokenizer):
    """Issue 27 case 9: a 20 KB word took 7.6 s, an 80 KB one 110 s (each piece re-read the whole open word, and
    every token rebuilt the ids list). Pieces of 1 KB: the work stays a few times the word's own tokens."""
    text = "Peter " + "ab,c" * 10_000 + " end here"  # 40 KB without a space; punctuation splits it into words
    counting = _CountingTokenizer(tokenizer)
    pieces = [text[i : i + 1000] for i in range(0, len(text), 1000)]
    chunked = _words(Segmenter(counting), pieces)
    whole = _words(Segmenter(tokenizer), [text])
    assert [(w.text, w.start, w.end, w.ids) for w in chunked] == [(w.text, w.start, w.end, w.ids) for w in whole]
    tokens = len(tokenizer.encode(text, add_special_tokens=False).ids)
    assert counting.built <= 4 * tokens, (counting.built, tokens)


def test_open_text_past_predicts_record_bound_is_one_line(tokenizer):
    from mtl_decoder.errors import UserError
    from mtl_decoder.inference.segmenter import MAX_OPEN_CHARS

    segmenter = Segmenter(tokenizer)
    assert [w.text for w in segmenter.feed("Peter lives ")] == ["Peter", "lives"]
    with pytest.raises(UserError, match=r"more than 1,048,576 characters without a space from character 11 on"):
        for _ in range(MAX_OPEN_CHARS // 65536 + 1):
            segmenter.feed("x" * 65536)
