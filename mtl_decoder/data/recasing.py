"""All-caps lines (headlines) shown to the tokenizer in the case a word usually has (``model.all_caps``).

A headline such as ``JAPAN GET LUCKY WIN , CHINA IN SURPRISE DEFEAT .`` is cut by a pretrained tokenizer into
pieces its trunk rarely saw, and every word of it looks like a name: on CoNLL-2003 the frozen SmolLM2 model's F1 on
such lines fell from 0.84 (validation) to 0.69 (test), below the feature CRF's (benchmarks/results/novelty.json).
The standard remedy is truecasing (Lita et al., 2003): each word of the line is given its most frequent form in
mixed-case training text (``japan`` -> ``Japan``, ``win`` -> ``win``), a word never seen there its title case.

Only the ids the tokenizer makes change: every recased word keeps its length (a word whose recased form would not
is kept as it is), so word boundaries, character offsets and the words the model's word features and outputs
see are the line's own. The table is built from the training texts once, saved beside the tokenizer
(``truecase.json``: plain JSON) and read back with the model.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from mtl_decoder.config.model import ALL_CAPS_CHOICES as CHOICES
from mtl_decoder.errors import UserError

TABLE_FILE = "truecase.json"


def has_letters(word: str) -> bool:
    return any(c.isalpha() for c in word)


def is_all_caps(words: list[str]) -> bool:
    """A headline: at least two words with letters, every one of them upper case."""
    lettered = [w for w in words if has_letters(w)]
    return len(lettered) >= 2 and all(w.upper() == w for w in lettered)


def is_mixed_case(words: Iterable[str]) -> bool:
    """A line with both upper- and lower-case letters: the only lines whose casing says what a word's usual form is
    (an all-caps headline or an all-lower-case corpus such as SST-2 says nothing)."""
    text = "".join(words)
    return any(c.isupper() for c in text) and any(c.islower() for c in text)


def build_table(lines: Iterable[list[str]]) -> dict[str, str]:
    """Lower-cased word -> its most frequent form in the mixed-case ``lines``.

    A line's first word is capitalised by its place, so it counts only for a word seen nowhere else (ties: the
    form seen first)."""
    inner: dict[str, Counter[str]] = defaultdict(Counter)
    first: dict[str, Counter[str]] = defaultdict(Counter)
    for words in lines:
        if not is_mixed_case(words):
            continue
        for i, word in enumerate(words):
            if has_letters(word):
                (first if i == 0 else inner)[word.lower()][word] += 1
    table = {key: forms.most_common(1)[0][0] for key, forms in first.items()}
    table.update((key, forms.most_common(1)[0][0]) for key, forms in inner.items())
    return dict(sorted(table.items()))


class Recaser:
    """How the words of an all-caps line are shown to the tokenizer (``model.all_caps``)."""

    def __init__(self, mode: str, table: dict[str, str] | None = None):
        if mode not in CHOICES:
            raise ValueError(f"all_caps: {mode!r} is not one of {', '.join(CHOICES)}")
        if mode == "truecase" and table is None:
            raise ValueError("all_caps 'truecase' needs the table of each word's usual form")
        self.mode, self.table = mode, table or {}

    @property
    def active(self) -> bool:
        return self.mode != "keep"

    def word(self, word: str) -> str:
        """``word`` (upper case) in the case the mode gives it, or as it is where that would change its length."""
        if not has_letters(word):
            return word
        if self.mode == "lower":
            shown = word.lower()
        elif self.mode == "title" or word.lower() not in self.table:
            shown = word[:1] + word[1:].lower()
        else:
            shown = self.table[word.lower()]
        return shown if len(shown) == len(word) else word

    def words(self, words: list[str]) -> list[str]:
        """The words shown to the tokenizer: recased if the line is all caps, else ``words`` itself."""
        if not self.active or not is_all_caps(words):
            return words
        return [self.word(w) for w in words]

    def text(self, text: str) -> str:
        """A raw text shown to the tokenizer: its whitespace-separated words recased if it is all caps (same
        length, so every character offset into it is one into ``text``)."""
        if not self.active:
            return text
        words = text.split()
        shown = self.words(words)
        if shown is words:
            return text
        out, pos = [], 0
        for word, new in zip(words, shown, strict=True):
            start = text.index(word, pos)
            out += [text[pos:start], new]
            pos = start + len(word)
        out.append(text[pos:])
        return "".join(out)

    def save(self, directory: str | Path) -> None:
        """truecase.json (mode truecase only: the other modes need nothing beside the config)."""
        if self.mode == "truecase":
            from mtl_decoder.files import atomic_write_json

            atomic_write_json(Path(directory) / TABLE_FILE, self.table)

    @classmethod
    def load(cls, directory: str | Path, mode: str) -> Recaser:
        if mode != "truecase":
            return cls(mode)
        path = Path(directory) / TABLE_FILE
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(
                f"{directory}: no {TABLE_FILE} (model.all_caps is 'truecase': copy the whole model folder)"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"{path}: not a readable truecase table ({err}); re-save the model") from None
        if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            raise UserError(f"{path}: not a truecase table (an object of word -> form strings); re-save the model")
        return cls(mode, table)


KEEP = Recaser("keep")
