"""Repeats inside a split and between train and the held-out splits, and entity strings the model never saw.

Two inputs are *exact* repeats when their text is identical (a word list compares as its words joined by single
spaces), and *normalised* repeats when they are identical after ``normalise``: lower-cased, punctuation removed,
runs of whitespace collapsed. A held-out example that repeats a train example with other labels is *mislabelled*
(one of the two copies is wrong, and the model is scored against the other).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Any

from mtl_decoder.config import SPLITS, TaskConfig
from mtl_decoder.data import iob
from mtl_decoder.data.tasks import Example, source_key
from mtl_decoder.diagnostics.reading import display_path, example_text

MAX_CASES = 5
CASE_CHARS = 90


def normalise(text: str) -> str:
    """Lower-cased, punctuation (Unicode category P*) removed, whitespace runs collapsed to one space."""
    kept = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text.lower())
    return " ".join(kept.split())


def label_key(example: Example, task: str) -> Any:
    """The example's labels for ``task`` as something hashable."""
    value = example.labels[task]
    return tuple(value) if isinstance(value, list) else value


def case(path: str, example: Example, note: str = "") -> str:
    """'path:line: text' (text cut to CASE_CHARS), for the examples a finding shows."""
    text = example_text(example)
    text = text if len(text) <= CASE_CHARS else text[: CASE_CHARS - 3] + "..."
    return f"{path}:{example.line}: {text!r}" + (f" ({note})" if note else "")


@dataclass
class Repeats:
    """Examples of one split that repeat an earlier example of the same split."""

    duplicates: int = 0
    """Examples whose text repeats an earlier one."""
    conflicting: int = 0
    """Of those, the ones whose labels differ from an earlier copy's (label noise)."""
    cases: list[str] = field(default_factory=list)

    def to_dict(self, total: int) -> dict[str, Any]:
        return {
            "duplicates": self.duplicates,
            "share": self.duplicates / total if total else 0.0,
            "conflicting_labels": self.conflicting,
            "cases": self.cases,
        }


def repeats_within(examples: list[Example], task: str, path: str) -> Repeats:
    seen: dict[str, set] = {}
    out = Repeats()
    for ex in examples:
        text, labels = example_text(ex), label_key(ex, task)
        if text in seen:
            out.duplicates += 1
            conflict = labels not in seen[text]
            out.conflicting += conflict
            if len(out.cases) < MAX_CASES and (conflict or len(out.cases) < 2):
                out.cases.append(case(path, ex, "other labels than an earlier copy" if conflict else "repeat"))
        seen.setdefault(text, set()).add(labels)
    return out


@dataclass
class Overlap:
    """How much of a held-out split repeats train."""

    total: int = 0
    exact: int = 0
    """Held-out examples whose text is a train example's."""
    mislabelled: int = 0
    """Of the exact repeats, those whose labels differ from every train copy."""
    normalised: int = 0
    """Examples that repeat a train example only after normalisation (not counted in ``exact``)."""
    exact_cases: list[str] = field(default_factory=list)
    mislabelled_cases: list[str] = field(default_factory=list)
    normalised_cases: list[str] = field(default_factory=list)

    @property
    def exact_share(self) -> float:
        return self.exact / self.total if self.total else 0.0

    @property
    def normalised_share(self) -> float:
        return self.normalised / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "examples": self.total,
            "exact": self.exact,
            "exact_share": self.exact_share,
            "exact_other_labels": self.mislabelled,
            "normalised_only": self.normalised,
            "normalised_share": self.normalised_share,
            "exact_cases": self.exact_cases,
            "other_label_cases": self.mislabelled_cases,
            "normalised_cases": self.normalised_cases,
        }


def overlap_with_train(train: list[Example], held_out: list[Example], task: str, train_path: str, path: str) -> Overlap:
    exact: dict[str, tuple[set, Example]] = {}
    loose: dict[str, Example] = {}
    for ex in train:
        text = example_text(ex)
        exact.setdefault(text, (set(), ex))[0].add(label_key(ex, task))
        loose.setdefault(normalise(text), ex)
    out = Overlap(total=len(held_out))
    for ex in held_out:
        text = example_text(ex)
        if text in exact:
            labels, first = exact[text]
            out.exact += 1
            if label_key(ex, task) not in labels:
                out.mislabelled += 1
                if len(out.mislabelled_cases) < MAX_CASES:
                    note = f"train {train_path}:{first.line} has {_show(first, task)}, here {_show(ex, task)}"
                    out.mislabelled_cases.append(case(path, ex, note))
            elif len(out.exact_cases) < MAX_CASES:
                out.exact_cases.append(case(path, ex, f"= {train_path}:{first.line}"))
            continue
        key = normalise(text)
        if key and key in loose:
            out.normalised += 1
            if len(out.normalised_cases) < MAX_CASES:
                first = loose[key]
                out.normalised_cases.append(case(path, ex, f"~ {train_path}:{first.line} {example_text(first)!r}"))
    return out


def _show(example: Example, task: str) -> str:
    value = example.labels[task]
    if isinstance(value, list):
        words = example.words or []
        spans = [f"{kind} {' '.join(words[s:e])!r}" for kind, s, e in iob.entities(value)]
        return "[" + ", ".join(spans) + "]" if spans else "no entity"
    return repr(value)


def entity_strings(examples: list[Example], task: str) -> list[tuple[str, str]]:
    """(type, text) of every entity mention of a tagging task's examples."""
    out = []
    for ex in examples:
        words = ex.words or []
        out += [(kind, " ".join(words[s:e])) for kind, s, e in iob.entities(ex.labels[task])]
    return out


def unseen_entities(train: list[Example], held_out: list[Example], task: str) -> dict[str, Any]:
    """Share of the held-out entity mentions whose text never occurs as an entity in train (any type)."""
    seen = {text for _, text in entity_strings(train, task)}
    mentions = entity_strings(held_out, task)
    unseen = [(kind, text) for kind, text in mentions if text not in seen]
    by_type: dict[str, list[int]] = {}
    for kind, text in mentions:
        counts = by_type.setdefault(kind, [0, 0])
        counts[0] += 1
        counts[1] += text not in seen
    return {
        "mentions": len(mentions),
        "unseen": len(unseen),
        "unseen_share": len(unseen) / len(mentions) if mentions else 0.0,
        "per_type": {k: {"mentions": n, "unseen_share": u / n} for k, (n, u) in sorted(by_type.items())},
        "cases": [f"{kind} {text!r}" for kind, text in unseen[:MAX_CASES]],
    }


def shared_files(tasks: dict[str, TaskConfig]) -> list[dict[str, Any]]:
    """Files that more than one task and split read.

    Files (or hub splits) that more than one (task, split) reads, with who reads them; ``leak`` is set where
    one task's train file is another's (or its own) validation or test file."""
    readers: dict[str, list[tuple[str, str]]] = {}
    for name, task in tasks.items():
        for split in SPLITS:
            key = source_key(task, split)
            if key is not None:
                readers.setdefault(key, []).append((name, split))
    out = []
    for key, who in readers.items():
        if len(who) < 2:
            continue
        splits = {split for _, split in who}
        out.append(
            {
                "file": display_path(key),
                "read_by": [f"{name}/{split}" for name, split in who],
                "leak": "train" in splits and len(splits) > 1,
            }
        )
    return out
