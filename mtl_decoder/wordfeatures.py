"""Per-word features that need no vocabulary file: character ids and a word-shape class.

Sub-word ids alone overfit names seen in training; the characters and the shape of a word (capitalised,
all caps, digits, ...) are the evidence that generalises to unseen names. Shared by data and model.
"""

from __future__ import annotations

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
