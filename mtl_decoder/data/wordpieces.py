"""Word lists encoded from each distinct word's cached sub-words.

Pre-tokenised word lists encoded from each distinct word's cached sub-words: what ``TextEncoder`` does for a
native model's word lists, without a tokenizer call and an alignment pass per sentence.

A tokenizer given pre-tokenised words (``is_pretokenized``) normalises, pre-tokenises and splits each word on its
own, so a word list's sub-words are its words' sub-words in turn. ``WordPieces`` keeps, per distinct word, its
sub-word ids, the offset among them its tag is read from and whether its first piece is a lone whitespace piece
(``alignment.read_position``), and assembles a list's ``Encoded`` -- ids, truncation, special tokens and
``WordAlignment`` -- exactly as the tokenizer's encoding followed by ``TextEncoder._finish`` gives it
(tests/data/test_wordpieces.py compares the two). It applies where the post-processor only puts special tokens
around the text (``usable``).
"""

from __future__ import annotations

from tokenizers import Tokenizer

from mtl_decoder.data.alignment import WordAlignment, read_position

CAPACITY = 1 << 18
"""Distinct words kept; the cache starts afresh when it is full."""

WRAPPING_PROCESSORS = ("TemplateProcessing", "BertProcessing")
"""Post-processors that only add special tokens before and after a single sequence's ids."""


def usable(tokenizer: Tokenizer) -> bool:
    """Whether a word list's encoding can be assembled from its words': the post-processor only wraps the ids."""
    processor = tokenizer.post_processor
    return processor is None or type(processor).__name__ in WRAPPING_PROCESSORS


class WordPieces:
    """Each distinct word's sub-words, read offset and blank lead, and the encodings assembled from them."""

    def __init__(self, tokenizer: Tokenizer, unk_id: int, blank_ids: frozenset[int], word_token: str):
        self.tokenizer, self.unk, self.blank_ids, self.word_token = (
            tokenizer,
            tokenizer.id_to_token(unk_id),
            blank_ids,
            word_token,
        )
        probe = tokenizer.post_process(tokenizer.encode("a", add_special_tokens=False))
        special = probe.special_tokens_mask
        lead = next(i for i, s in enumerate(special) if not s)
        tail = len(special) - next(i for i, s in enumerate(reversed(special)) if not s)
        self.lead, self.trail = list(probe.ids[:lead]), list(probe.ids[tail:])
        self.entries: dict[str, tuple[tuple[int, ...], int, bool]] = {}

    def lookup(self, words: list[str]) -> list[tuple[tuple[int, ...], int, bool]]:
        """(sub-word ids, read offset, first piece blank) of each word, encoding the words not seen yet at once."""
        entries = self.entries
        missing = list(dict.fromkeys(w for w in words if w not in entries))
        if missing and len(entries) + len(missing) > CAPACITY:  # a new dict: another thread keeps reading its own
            entries = self.entries = {}
            missing = list(dict.fromkeys(words))
        if missing:
            encodings = self.tokenizer.encode_batch(
                [[w] for w in missing], is_pretokenized=True, add_special_tokens=False
            )
            for word, enc in zip(missing, encodings, strict=True):
                entries[word] = self._entry(enc.ids)
        return [entries[w] for w in words]

    def _entry(self, ids: list[int]) -> tuple[tuple[int, ...], int, bool]:
        if not ids:  # the normalizer erased the word (e.g. U+200B): it is read as the unknown token
            ids = self.tokenizer.encode([self.unk], is_pretokenized=True, add_special_tokens=False).ids
        blank = [i in self.blank_ids for i in ids]
        return tuple(ids), read_position(range(len(ids)), blank, self.word_token), blank[0]

    def encode(self, words: list[str], budget: int) -> tuple[list[int], WordAlignment]:
        """The ids of ``words`` (at most ``budget`` sub-words of text, then the special tokens) and their alignment:
        a word all of whose sub-words fit is kept; the first that does not keeps the sub-words that fit (its number on
        them, no span), and the words after it none."""
        ids, lead = list(self.lead), len(self.lead)
        word_index = [-1] * lead
        spans: list[tuple[int, int]] = []
        reads: list[int] = []
        subwords: list[int] = []
        blank_led, pos, end, cut = 0, lead, lead + budget, False
        for w, (pieces, read, blank_first) in enumerate(self.lookup(words)):
            n = len(pieces)
            subwords.append(n)
            if cut:
                continue
            if pos + n <= end:
                ids += pieces
                word_index += [w] * n
                spans.append((pos, pos + n))
                reads.append(pos + read)
                blank_led += blank_first
                pos += n
            else:
                room = end - pos
                ids += pieces[:room]
                word_index += [w] * room
                cut = True
        ids += self.trail
        word_index += [-1] * len(self.trail)
        return ids, WordAlignment(word_index, spans, reads, subwords, blank_led)
