"""Entity F1 split by whether a mention's words were seen as an entity in training, and by hard slices of the data.

A test set's entities split into those whose surface form (the mention's words joined by one space, case kept)
is annotated as an entity anywhere in the training file, of any type, and those never seen there (the split of
Augenstein et al., 2017, "Generalisation in named entity recognition"). A predicted entity falls on the side its
own surface form puts it, so precision and recall of each side are those of a scorer that sees only that side.
Entities come from seqeval's default (conlleval-compatible) reading of the tags, as the task's own ``f1`` does.

Slices are sentences of a kind known to be hard: all-caps lines (headlines), number-heavy lines (sports result
tables) and one-word lines; each is scored with the task's ordinary metrics over its sentences alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mtl_decoder.config import TAGGING, TaskConfig
from mtl_decoder.data.recasing import is_all_caps  # the one headline rule: model.all_caps recases these lines
from mtl_decoder.data.tasks import load_split
from mtl_decoder.errors import UserError
from mtl_decoder.evaluation.metrics import tagging_metrics

Mention = tuple[str, int, int]
"""(type, first word, last word inclusive), as seqeval's get_entities gives it."""


def mentions(tags: list[str]) -> list[Mention]:
    from seqeval.metrics.sequence_labeling import get_entities

    return [(kind, start, end) for kind, start, end in get_entities(list(tags))]


def surface(words: list[str], mention: Mention) -> str:
    return " ".join(words[mention[1] : mention[2] + 1])


def seen_surfaces(sentences: Iterable[tuple[list[str], list[str]]]) -> set[str]:
    """The surface form of every gold entity of the (words, tags) training sentences."""
    return {surface(words, m) for words, tags in sentences for m in mentions(tags)}


def _prf(correct: int, predicted: int, gold: int) -> dict[str, Any]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": gold, "predicted": predicted}


def seen_unseen_metrics(
    words: list[list[str]], gold: list[list[str]], pred: list[list[str]], seen: set[str]
) -> dict[str, Any]:
    """Scores of the mentions seen in training and of those not.

    Precision, recall, F1 of the mentions seen in training and of those not, overall and per entity type,
    with the share of gold mentions unseen."""
    counts: dict[tuple[str, str], list[int]] = {}  # (side, type) -> [correct, predicted, gold]

    def add(side: str, kind: str, slot: int) -> None:
        for key in ((side, kind), (side, "")):
            counts.setdefault(key, [0, 0, 0])[slot] += 1

    for sentence, g_tags, p_tags in zip(words, gold, pred, strict=True):
        g_set = set(mentions(g_tags))
        for m in g_set:
            add(_side(sentence, m, seen), m[0], 2)
        for m in set(mentions(p_tags)):
            side = _side(sentence, m, seen)
            add(side, m[0], 1)
            if m in g_set:
                add(side, m[0], 0)
    sides = {side: _prf(*counts.get((side, ""), [0, 0, 0])) for side in ("seen", "unseen")}
    kinds = sorted({kind for _, kind in counts if kind})
    per_type = {k: {side: _prf(*counts.get((side, k), [0, 0, 0])) for side in ("seen", "unseen")} for k in kinds}
    total = sides["seen"]["support"] + sides["unseen"]["support"]
    return {
        **sides,
        "unseen_share": sides["unseen"]["support"] / total if total else 0.0,
        "per_type": per_type,
    }


def _side(words: list[str], mention: Mention, seen: set[str]) -> str:
    return "seen" if surface(words, mention) in seen else "unseen"


def is_number_heavy(words: list[str]) -> bool:
    """A results line: at least a third of the words hold a digit."""
    return len(words) >= 3 and 3 * sum(any(c.isdigit() for c in w) for w in words) >= len(words)


def is_one_word(words: list[str]) -> bool:
    return len(words) == 1


SLICES: dict[str, Callable[[list[str]], bool]] = {
    "all_caps": is_all_caps,
    "number_heavy": is_number_heavy,
    "one_word": is_one_word,
}
"""Name -> the test a sentence's words pass to belong to the slice."""


def slice_metrics(words: list[list[str]], gold: list[list[str]], pred: list[list[str]]) -> dict[str, Any]:
    """The task's tagging metrics over each slice's sentences (a slice no sentence falls in is left out)."""
    out = {}
    for name, belongs in SLICES.items():
        rows = [i for i, w in enumerate(words) if belongs(w)]
        if rows:
            metrics = tagging_metrics([gold[i] for i in rows], [pred[i] for i in rows])
            out[name] = {k: metrics[k] for k in ("precision", "recall", "f1", "support", "sentences")}
    return out


def training_surfaces(
    tasks: dict[str, TaskConfig], names: list[str], given: dict[str, str], repair_iob: bool
) -> tuple[dict[str, set[str]], list[str]]:
    """The entity surfaces of each task's training file.

    Task -> the entity surfaces of its training file (``given[task]``, else the run's train split when it is a
    local file that is still there), and a note for each tagging task that has none."""
    for name in given:
        if name not in names or tasks[name].kind != TAGGING:
            raise UserError(f"--train-data names task '{name}', which is not a tagging task being evaluated")
    found: dict[str, set[str]] = {}
    notes = []
    for name in names:
        task = tasks[name]
        if task.kind != TAGGING:
            continue
        if name in given:
            task = replace_split(task, "train", given[name])
        elif task.data.train is None or task.data.hub_id or not Path(task.data.train).is_file():
            notes.append(f"{name}: no training file here, so no seen/unseen F1 (pass --train-data {name}=PATH)")
            continue
        (source,) = load_split({name: task}, "train", [name], repair_iob=repair_iob)
        found[name] = seen_surfaces((ex.words or [], ex.labels[name]) for ex in source.examples)
    return found, notes


def replace_split(task: TaskConfig, split: str, path: str | Path) -> TaskConfig:
    """A copy of ``task`` reading ``split`` from the local file ``path`` (its columns, labels and kind kept)."""
    return dataclasses.replace(
        task, data=dataclasses.replace(task.data, hub_id=None, hub_config=None, **{split: str(path)})
    )


class Analyser:
    """The ``analyse`` hook of score_sources: hard slices and seen/unseen F1.

    The ``analyse`` hook of score_sources: per tagging task, the hard slices and, where a training file is
    known, seen/unseen F1; ``results`` holds them by task."""

    def __init__(self, seen: dict[str, set[str]]):
        self.seen = seen
        self.results: dict[str, dict[str, Any]] = {}

    def __call__(self, task: TaskConfig, examples: list, gold: list, pred: list) -> None:
        if task.kind != TAGGING:
            return
        words = [ex.words or [] for ex in examples]
        out: dict[str, Any] = {"slices": slice_metrics(words, gold, pred)}
        if task.name in self.seen:
            out["novelty"] = seen_unseen_metrics(words, gold, pred, self.seen[task.name])
        self.results[task.name] = out
