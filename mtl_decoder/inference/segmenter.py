"""Cutting a growing text into closed words with their tokens, as the tokenizer cuts the whole text.

Used by the streaming tagger (``streaming.py``): a word is *closed* once the text after it holds a space or the
start of another word, and a closed word's tokens never change, whatever arrives after it.

The open end of the text is bounded as ``predict`` bounds a record (``MAX_OPEN_CHARS``, 1 Mi characters), and
past ``EAGER_CHARS`` it is tokenized again only when a piece brings a space: re-reading a word that keeps growing
at every piece would cost the square of its length. The words that come out are the same either way (closed words
do not change); only words split by punctuation inside a long run without spaces come out later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from mtl_decoder.data.alignment import is_blank, read_position
from mtl_decoder.data.formats import MAX_LINE_BYTES
from mtl_decoder.data.tokenization import text_word_spans
from mtl_decoder.errors import UserError

MAX_OPEN_CHARS = MAX_LINE_BYTES
"""The most text the stream may hold without a space: predict's bound on one record."""
EAGER_CHARS = 4096
"""Up to this much open text, every piece is tokenized at once (words split by punctuation come out at once)."""
_SPACE = re.compile(r"\s")


@dataclass
class Word:
    """A closed word on its way through the model."""

    text: str
    start: int
    end: int
    ids: list[int]
    """Its tokens (byte-level tokenizers: with the space-only tokens just before it)."""
    read: int
    """Index in ``ids`` of the sub-word its tags are read at (``alignment.read_position``: ``model.word_token``)."""
    number: int = -1
    emissions: dict[str, torch.Tensor] = field(default_factory=dict)


class Segmenter:
    """Cuts a growing text into closed words with their tokens, as the tokenizer cuts the whole text."""

    def __init__(self, tokenizer, word_token: str = "first"):
        """``word_token``: 'first' or 'last', the sub-word each word is read at (``model.word_token``, resolved)."""
        self.tokenizer, self.word_token = tokenizer, word_token
        self.pending = ""
        self.base = 0
        """Offset of ``pending`` in the stream."""

    def feed(self, chunk: str, final: bool = False) -> list[Word]:
        self.pending += chunk
        if len(self.pending) > MAX_OPEN_CHARS:
            raise UserError(
                f"--stream: more than {MAX_OPEN_CHARS:,} characters without a space from character {self.base:,} "
                "on (predict's bound on one record); is the input text?"
            )
        if not final and len(self.pending) > EAGER_CHARS and not _SPACE.search(chunk):
            return []  # nothing but punctuation-split pieces could close: wait for a space (see the module doc)
        text = self.pending
        if not text:
            return []
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        words, _, token_word = text_word_spans(text, enc)
        # closed: every word but the last, and the last once something (a space) follows it
        closed = len(words) if final or (words and words[-1][1] < len(text)) else max(0, len(words) - 1)
        owner = owners(token_word, len(words))
        blank = [is_blank(t) for t in enc.tokens]
        all_ids = enc.ids  # a property that builds a new list: read once, not per token (quadratic in a long word)
        out: list[Word] = []
        token = 0
        for w in range(closed):
            start, end = words[w]
            begin = token
            while token < len(all_ids) and owner[token] == w:
                token += 1
            own = [t for t in range(begin, token) if token_word[t] == w] or list(range(begin, token))
            read = read_position(own, blank, self.word_token) - begin
            out.append(Word(text[start:end], self.base + start, self.base + end, all_ids[begin:token], read))
        cut = len(text) if final else (words[closed - 1][1] if closed else 0)
        self.pending = text[cut:]
        self.base += cut
        return out


def owners(token_word: list[int], n_words: int) -> list[int]:
    """The word each token is committed with.

    Its own, or for a space-only token the word after it (byte-level
    BPE cuts the spaces before a word differently while the text still ends in them); ``n_words`` for spaces after
    the last word."""
    owner, following = [0] * len(token_word), n_words
    for t in range(len(token_word) - 1, -1, -1):
        if token_word[t] >= 0:
            following = token_word[t]
        owner[t] = following
    return owner
