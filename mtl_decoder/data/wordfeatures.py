"""Per-word features that need no vocabulary file.

Character ids, a word-shape class and hashed sparse
features (the lower-cased word, its prefixes and suffixes) like those of a feature-based CRF tagger.

Sub-word ids alone overfit names seen in training; the characters, affixes and shape of a word (capitalised,
all caps, digits, ...) are the evidence that generalises to unseen names. Shared by data and model.
"""

from __future__ import annotations

import zlib

N_CHAR_IDS = 512
"""Character id space: 0 = padding, 1..127 = ASCII, 128..511 = other characters hashed."""
MAX_WORD_CHARS = 16
"""Characters kept per word (the first 8 and last 8 of a longer word)."""

SHAPES = (
    "none",
    "lower",
    "capitalised",
    "all_caps",
    "single_cap",
    "digits",
    "has_digit",
    "punct",
    "mixed_case",
    "other",
)
"""Shape classes; 'none' is for special tokens and padding."""


def char_id(ch: str) -> int:
    code = ord(ch)
    if code < 128:
        return code or 1
    return 128 + (code * 2654435761) % (N_CHAR_IDS - 128)


def char_ids(word: str) -> list[int]:
    if len(word) > MAX_WORD_CHARS:
        half = MAX_WORD_CHARS // 2
        word = word[:half] + word[-half:]
    if word.isascii() and "\0" not in word:  # the common case, without a Python call per character
        return list(word.encode("ascii"))
    return [char_id(c) for c in word]


def shape_id(word: str) -> int:
    if not word:
        return SHAPES.index("other")
    if word.isdigit():
        return SHAPES.index("digits")
    if any(c.isdigit() for c in word):
        return SHAPES.index("has_digit")
    if not any(c.isalnum() for c in word):
        return SHAPES.index("punct")
    letters = [c for c in word if c.isalpha()]
    if not letters:
        return SHAPES.index("other")
    if all(c.islower() for c in letters):
        return SHAPES.index("lower")
    if all(c.isupper() for c in letters):
        return SHAPES.index("single_cap" if len(letters) == 1 else "all_caps")
    if letters[0].isupper() and all(c.islower() for c in letters[1:]):
        return SHAPES.index("capitalised")
    return SHAPES.index("mixed_case")


N_HASHED = 8
"""Hashed features per word (see ``hashed_features``)."""


WORD_IDENTITY_FEATURES = 2
"""The first hashed features of a word name the word itself (as written, lower-cased); the rest its affixes."""


def hashed_features(word: str, buckets: int) -> list[int]:
    """Hashed feature ids of a word and its affixes.

    Ids in 1..buckets-1 (0 is padding) of the word as written, lower-cased, and its lower-cased prefixes and
    suffixes of 2-4 characters. crc32, not hash(): ids must not change between processes."""
    low = word.lower()
    names = (  # the word itself first: WORD_IDENTITY_FEATURES
        f"W{word}",
        f"w{low}",
        f"p{low[:2]}",
        f"P{low[:3]}",
        f"q{low[:4]}",
        f"s{low[-2:]}",
        f"S{low[-3:]}",
        f"t{low[-4:]}",
    )
    return [1 + zlib.crc32(name.encode("utf-8", "surrogatepass")) % (buckets - 1) for name in names]
