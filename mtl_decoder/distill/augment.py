"""More transfer text for distillation: altered copies of texts the teacher then labels.

A student learns the teacher's function only where the transfer set puts it; Tang et al. (2019, "Distilling
task-specific knowledge from BERT into simple neural networks") widened that set by rewriting each text several
times: masking words, swapping words for others of the same part of speech, and cutting the text to a random n-gram.
The teacher labels the copies like any unlabelled text (``mtl-decoder distill --unlabelled``), so no copy needs a
gold label and a swapped word that changes a sentence's meaning is labelled for what it now says.

Two rules differ from the paper, because both models here read raw text and no tagger is a dependency:

- a masked word is **dropped** (raw text has no mask token shared by a pretrained teacher and a student);
- a word is swapped for one of the same **word shape** (lower, capitalised, all caps, digits, ...:
  ``wordfeatures.shape_id``, the shape the student's features read) drawn by its frequency in the inputs, the
  shape standing in for the part-of-speech tag (a capitalised word for a capitalised word keeps a name a name).

    mtl-decoder augment --input reviews.txt --output reviews.aug.txt [--copies 1] [--seed 0]
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mtl_decoder.data.wordfeatures import shape_id
from mtl_decoder.distill.targets import Item
from mtl_decoder.errors import UserError


@dataclass(frozen=True)
class AugmentSpec:
    """How each copy of a text is altered (each field is the ``augment`` flag of the same name)."""

    copies: int = 1
    """Altered copies wanted per input text (the paper used 20 on SST-2); a copy equal to its text or to an
    earlier one is drawn again, up to ``tries`` times, then counted as a duplicate and left out."""
    drop: float = 0.1
    """The chance that a word is dropped (the paper's masking, p_mask 0.1)."""
    swap: float = 0.1
    """The chance that a word is swapped for a word of its shape, drawn by frequency (the paper's p_pos 0.1)."""
    ngram: float = 0.25
    """The chance that a copy is cut to a random run of 1 to ``max_ngram`` of its words (the paper's p_ng 0.25)."""
    max_ngram: int = 5
    """The longest n-gram a cut keeps."""
    tries: int = 10
    """Draws per wanted copy before it is counted as a duplicate."""
    seed: int = 0
    """The random seed: the same inputs, spec and seed give the same copies."""

    def __post_init__(self) -> None:
        for name in ("drop", "swap", "ngram"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise UserError(f"--{name}: must lie in [0, 1], got {value}")
        if self.drop + self.swap > 1.0:
            raise UserError(f"--drop + --swap: must be at most 1 (a word is dropped, swapped or kept), got "
                            f"{self.drop + self.swap}")  # fmt: skip
        for name in ("copies", "max_ngram", "tries"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(self, name)}")


def words_of(item: Item) -> list[str]:
    """A text's words as the copies alter them: a word list as given, a raw text cut at white space."""
    return list(item) if isinstance(item, list) else item.split()


class ShapeVocabulary:
    """The inputs' words by shape, each drawn by its count: what a swapped word is replaced with."""

    def __init__(self, texts: Iterable[list[str]]):
        counts = Counter(word for words in texts for word in words)
        by_shape: dict[int, tuple[list[str], list[int]]] = {}
        for word, count in sorted(counts.items()):  # sorted: the draw does not depend on the inputs' order
            words, cumulative = by_shape.setdefault(shape_id(word), ([], []))
            words.append(word)
            cumulative.append((cumulative[-1] if cumulative else 0) + count)
        self.by_shape = by_shape

    def draw(self, word: str, rng: random.Random) -> str:
        """A word of ``word``'s shape, drawn with probability proportional to its count in the inputs."""
        words, cumulative = self.by_shape[shape_id(word)]
        return rng.choices(words, cum_weights=cumulative)[0]


def altered(words: list[str], vocabulary: ShapeVocabulary, spec: AugmentSpec, rng: random.Random) -> list[str]:
    """One altered copy of ``words``: each word dropped, swapped or kept, then maybe cut to an n-gram."""
    out = []
    for word in words:
        r = rng.random()
        if r < spec.drop:
            continue
        out.append(vocabulary.draw(word, rng) if r < spec.drop + spec.swap else word)
    if out and rng.random() < spec.ngram:
        n = rng.randint(1, min(spec.max_ngram, len(out)))
        start = rng.randint(0, len(out) - n)
        out = out[start : start + n]
    return out


@dataclass
class AugmentCounts:
    texts: int = 0
    """Input texts read."""
    written: int = 0
    """Copies written."""
    duplicates: int = 0
    """Wanted copies left out: every draw equalled its text, an input or an earlier copy."""


def augment(texts: list[list[str]], spec: AugmentSpec, counts: AugmentCounts) -> Iterator[str]:
    """The altered copies of ``texts`` (each its words), joined by spaces, each new: unequal to every input and
    to every earlier copy. ``counts`` is filled in as the copies are drawn."""
    vocabulary = ShapeVocabulary(texts)
    rng = random.Random(spec.seed)
    seen = {" ".join(words) for words in texts}
    for words in texts:
        counts.texts += 1
        for _ in range(spec.copies):
            for _ in range(spec.tries):
                copy = " ".join(altered(words, vocabulary, spec, rng))
                if copy and copy not in seen:
                    seen.add(copy)
                    counts.written += 1
                    yield copy
                    break
            else:
                counts.duplicates += 1
