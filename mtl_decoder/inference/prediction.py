"""What a model says of one text: ``Prediction``, the value every inference path gives back (``Predictor``,
the int8 refiner, the ONNX engine) and every writer and scorer reads."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Prediction:
    words: list[str]
    """The words predicted on (given, or the tokenizer's words of a raw text)."""
    spans: list[tuple[int, int]] | None
    """Character offsets of each word in the raw text (None for pre-tokenised input)."""
    tags: dict[str, list[str]] = field(default_factory=dict)
    """Tagging task -> one tag per word."""
    labels: dict[str, str] = field(default_factory=dict)
    """Classification task -> predicted label."""
    probs: dict[str, dict[str, float]] = field(default_factory=dict)
    """Classification task -> label -> probability."""
    truncated: bool = False
    """The input was longer than max_length: classification saw only its first window."""
    windows: int = 1
    """Windows the input was tagged in."""
    untagged: int = 0
    """Words longer than the maximum length on their own: they reached no window whole, and keep the tag 'O'."""
