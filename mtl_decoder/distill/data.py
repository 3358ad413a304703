"""The student's side of the teacher targets.

The transfer set's texts, each example's targets on the student's
own words, and the collator that pads them beside the gold labels.

Targets are per word (tags) and per text (classes), never per token, so the student's tokenizer need not be the
teacher's. A word list is the same words for both; a raw text is cut into words by each model's tokenizer, and a
student word takes the distribution of the teacher word it starts in (``targets.align``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from mtl_decoder.config import TAGGING
from mtl_decoder.data.batching import Collator, EncodedExample
from mtl_decoder.data.formats import BadRecord
from mtl_decoder.data.inputs import InputReader
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.distill.states import state_part
from mtl_decoder.distill.targets import SPANS, Item, align
from mtl_decoder.errors import DataError, UserError
from mtl_decoder.paths import path_problem


@dataclass
class DistilledExample(EncodedExample):
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    """Task -> the teacher's (W, L) tag distribution of each of the student's kept words (a zero row: no target,
    past what the teacher read) or (L,) class probabilities; ``state_part(task)`` -> the teacher's (W, d) projected
    state of each word (distill.state_weight) or (1, d) of the text (distill.sentence_state_weight)."""


def source_items(sources) -> list[Item]:
    """The texts the teacher labels from the training sources (``data.sources.Source``), in order: each example's
    words where its file gives them, else its raw text."""
    return [ex.words if ex.words is not None else ex.text for source in sources for ex in source.examples]


def read_unlabelled(paths: list[str], limit: int | None) -> list[tuple[str, list[Item]]]:
    """Read the unlabelled files of the transfer set.

    (path, texts) of each unlabelled file, read whole through predict's readers (any format it reads); a bad
    record stops the run naming its file and line, so no text is dropped silently."""
    out = []
    for path in paths:
        items: list[Item] = []
        for record in _records(path):
            if limit is not None and len(items) >= limit:
                break
            items.append(record)
        if not items:
            raise UserError(f"{path}: no texts in the unlabelled file")
        out.append((path, items))
    return out


TEXT_COLUMN_HINT = "; use --text-column"
"""predict's advice for a .csv/.tsv file without a 'text' column; distill has no such flag."""


def _records(path: str) -> Iterator[Item]:
    problem = path_problem(path, "file")
    if problem is not None:
        raise UserError(f"unlabelled file {path}: {problem}")
    try:
        reader = InputReader(path)
        for record in reader:
            if isinstance(record, BadRecord):
                raise DataError(path, record.line, record.reason, record.field)
            yield record.item
    except DataError as err:
        if not err.reason.endswith(TEXT_COLUMN_HINT):
            raise
        reason = (
            err.reason.removesuffix(TEXT_COLUMN_HINT) + "; distill reads the texts of a .csv/.tsv file's 'text' column"
        )
        raise DataError(err.path, err.line, reason, err.field) from None


def attach_targets(
    examples: list[EncodedExample],
    items: list[Item],
    teacher: list[dict[str, torch.Tensor]],
    encoder: TextEncoder,
    kinds: dict[str, str],
    columns: dict[str, list[int]] | None = None,
) -> list[DistilledExample]:
    """Attach the teacher targets to each encoded student example.

    Each encoded student example (of ``items``, in order) with its teacher targets on its own words, and in
    its own label order: ``columns[task]`` lists the teacher's column of each student label (default: the same)."""
    raw = [i for i, item in enumerate(items) if isinstance(item, str)]
    spans = dict(zip(raw, (e.spans for e in encoder.encode_batch([items[i] for i in raw])), strict=True))
    reorder = {task: torch.tensor(c) for task, c in (columns or {}).items() if c != sorted(c)}
    out = []
    for i, (ex, found) in enumerate(zip(examples, teacher, strict=True)):
        found = {part: t[..., reorder[part]] if part in reorder else t for part, t in found.items()}
        kept = ex.alignment.kept if ex.alignment is not None else max(ex.word_index, default=-1) + 1
        # a raw text: each student word takes the teacher word it starts in; a word list: the same words
        index = align(found[SPANS], spans[i][:kept]) if i in spans and SPANS in found else list(range(kept))
        targets = {task: _on_words(found[task], index) if kinds[task] == TAGGING else found[task] for task in kinds}
        for task in kinds:  # the teacher's states: a tagging task's on the same words as its tags, a text's as is
            if state_part(task) in found:
                states = found[state_part(task)]
                targets[state_part(task)] = _on_words(states, index) if kinds[task] == TAGGING else states
        out.append(
            DistilledExample(ex.ids, ex.word_index, ex.words, ex.labels, ex.truncated_words, ex.alignment, targets)
        )
    return out


def _on_words(probs: torch.Tensor, index: list[int]) -> torch.Tensor:
    """(len(index), L): row w the teacher's row index[w]; zeros where it is -1 or past the teacher's words.

    The teacher's rows themselves (no copy) where the student's words are the teacher's."""
    if index == list(range(probs.shape[0])):
        return probs
    rows = torch.tensor(index, dtype=torch.long)
    valid = (rows >= 0) & (rows < probs.shape[0])
    if probs.shape[0] == 0:
        return probs.new_zeros(len(index), probs.shape[1])
    picked = probs[rows.clamp(0, probs.shape[0] - 1)]
    return picked * valid.unsqueeze(1).to(picked.dtype)


def encode_items(items: list[Item], encoder: TextEncoder) -> list[EncodedExample]:
    """Unlabelled texts as encoded examples without gold labels."""
    return [EncodedExample.unlabelled(e) for e in encoder.encode_batch(items)]


class DistillCollator:
    """The trainer's collator plus the teacher targets.

    The trainer's collator, plus ``targets``: task -> (probabilities, mask): tagging (B, W, L), (B, W);
    classification (B, L), (B,); and where the examples carry the teacher's states, ``state_part(task)`` ->
    (states (B, W, d) with the task's mask for tagging, (B, d) with a (B,) mask of the texts that have one)."""

    def __init__(self, base: Collator, kinds: dict[str, str], label_counts: dict[str, int]):
        self.base, self.kinds, self.label_counts = base, kinds, label_counts

    def __call__(self, examples: list[DistilledExample]) -> dict[str, Any]:
        batch = self.base(examples)
        B = len(examples)
        targets = {}
        for task, kind in self.kinds.items():
            L = self.label_counts[task]
            rows = [ex.targets.get(task) for ex in examples]
            if kind == TAGGING:
                W = max((r.shape[0] for r in rows if r is not None), default=0)
                probs = torch.zeros(B, max(W, 1), L)
                for b, r in enumerate(rows):
                    if r is not None and r.shape[0]:
                        probs[b, : r.shape[0]] = r.float()
                mask = probs.sum(-1) > 0.5  # a real distribution sums to 1, a missing one to 0
            else:
                probs = torch.zeros(B, L)
                mask = torch.tensor([r is not None for r in rows])
                for b, r in enumerate(rows):
                    if r is not None:
                        probs[b] = r.float()
            targets[task] = (probs, mask)
            states = [ex.targets.get(state_part(task)) for ex in examples]
            if kind == TAGGING and any(r is not None for r in states):
                width = next(r.shape[1] for r in states if r is not None)
                padded = torch.zeros(B, probs.shape[1], width)
                for b, r in enumerate(states):
                    if r is not None and r.shape[0]:
                        padded[b, : r.shape[0]] = r.float()
                targets[state_part(task)] = (padded, mask)
            elif any(r is not None for r in states):
                width = next(r.shape[1] for r in states if r is not None)
                pooled, has = torch.zeros(B, width), torch.tensor([r is not None for r in states])
                for b, r in enumerate(states):
                    if r is not None:
                        pooled[b] = r[0].float()
                targets[state_part(task)] = (pooled, has & mask)
        batch["targets"] = targets
        return batch
