"""Where each word of an encoded sequence lies among its sub-words: one object, made by the encoder, read by all.

``WordAlignment`` is the only place that decides

- which positions of an encoded sequence belong to which word (``word_index``, ``spans``),
- which position a word's tag is read from and trained at (``reads``: the first or last sub-word per
  ``model.word_token``, never a lone whitespace piece),
- which words reached the model whole (a word cut by truncation has no read position: it is counted truncated,
  never tagged from a part of it), and how many sub-words each word takes untruncated (``subwords``: what
  windows over long inputs are sized by).

The collator turns ``reads`` into the batch's ``word_read``; the heads gather logits there; the predictor sizes its
windows by ``subwords`` and checks each window's own alignment; the streaming segmenter asks ``read_position``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WORD_TOKENS = ("first", "last")
"""The resolved ``model.word_token`` positions ('auto' is resolved by ``ModelConfig.word_token_position``)."""

BLANK_CHARS = " \t\n\r\u00a0\u3000" + "\u0120\u010a\u0109\u010d" + "\u2581"
"""Characters a whitespace-only piece is made of: real whitespace; byte-level BPE's stand-ins for a space, newline,
tab and carriage return (Ġ, Ċ, ĉ, č); the Metaspace / SentencePiece word mark (▁)."""


def is_blank(piece: str) -> bool:
    """Whether a sub-word is only whitespace.

    A sub-word that is only whitespace: byte-level BPE's lone 'Ġ' before a number (Qwen2, Llama-3), a lone
    SentencePiece '▁'. Under causal attention such a piece has seen nothing of its word, so it is never read."""
    return not piece.strip(BLANK_CHARS)


def read_position(positions: Sequence[int], blank: Sequence[bool], word_token: str) -> int:
    """The position a word's tag is read from.

    The position a word's tag is read from, of its sub-words ``positions`` (in order): the first (or, ``word_token``
    'last', the last) that is not a whitespace-only piece (``blank``, indexed by position); the last sub-word when
    every one is blank."""
    if word_token not in WORD_TOKENS:
        raise ValueError(f"word_token must be one of {WORD_TOKENS} (resolve 'auto' first), got {word_token!r}")
    for p in positions if word_token == "first" else reversed(positions):
        if not blank[p]:
            return p
    return positions[-1]


@dataclass(frozen=True)
class WordAlignment:
    """The words of one encoded sequence (special tokens included in its positions)."""

    word_index: list[int]
    """Per position: its word's number; -1 for special tokens and whitespace that belongs to no word. A word cut
    part way by truncation keeps its number on the sub-words that remain (word features), but has no span."""
    spans: list[tuple[int, int]]
    """Per word that reached the model whole (a prefix of the words): its [start, end) positions."""
    reads: list[int]
    """Per such word: the position its tag is read from (and trained at)."""
    subwords: list[int]
    """Per word of the input: the sub-words it takes untruncated (special tokens excluded; for words joined as
    text, with the space pieces before it): what windows over a long input are sized by."""
    blank_led: int = 0
    """Kept words whose first sub-word is a lone whitespace piece (read past it; ``debug-data`` reports them)."""

    @classmethod
    def build(cls, word_index: list[int], blank: Sequence[bool], subwords: list[int], word_token: str) -> WordAlignment:
        """The alignment of one encoded text's sub-words to its words.

        From each position's word (monotone: a word's sub-words are consecutive), which positions are blank, and
        each word's untruncated sub-word count; a word is kept only if all of its sub-words are present."""
        n = len(subwords)
        first, count = [-1] * n, [0] * n
        for p, w in enumerate(word_index):
            if w >= 0:
                count[w] += 1
                if first[w] < 0:
                    first[w] = p
        spans, reads, blank_led = [], [], 0
        for w in range(n):
            if not count[w] or count[w] < subwords[w]:
                break  # truncation cut this word (and every word after it)
            own = range(first[w], first[w] + count[w])  # consecutive
            spans.append((own.start, own.stop))
            reads.append(read_position(own, blank, word_token))
            blank_led += bool(blank[own.start])
        return cls(list(word_index), spans, reads, list(subwords), blank_led)

    @classmethod
    def from_word_index(cls, word_index: list[int], word_token: str = "first") -> WordAlignment:
        """For a sequence built by hand (every word present whole, no whitespace pieces known)."""
        n_words = max(word_index, default=-1) + 1
        counts = [0] * n_words
        for w in word_index:
            if w >= 0:
                counts[w] += 1
        return cls.build(word_index, [False] * len(word_index), counts, word_token)

    @property
    def n_words(self) -> int:
        return len(self.subwords)

    @property
    def kept(self) -> int:
        """Words that reached the model whole: those that are tagged."""
        return len(self.reads)

    @property
    def truncated_words(self) -> int:
        """Words truncation cut (in part or whole): untagged, and trained without labels."""
        return self.n_words - self.kept

    def labels(self, word_tags: Sequence[int]) -> list[int]:
        """Per position: the word's tag id at its read position, -100 everywhere else (the loss's ignore index)."""
        out = [-100] * len(self.word_index)
        for w, p in enumerate(self.reads):
            out[p] = word_tags[w]
        return out
