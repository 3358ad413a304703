"""The teacher's per-word states as a second target of distillation (TinyBERT's intermediate-layer loss).

With ``distill.state_weight`` > 0 the teacher keeps, beside its tag distributions, the state each of its tagging
heads reads at each word (the (W, D) head input after its final norm, at the position the encoder reads the word
from), and a tagging task's loss gains

    state_weight * mean_texts mean_words mean_dims (h_student - z_teacher)^2

where h_student is the student's own head input at the word and z_teacher the teacher's state on a fixed
projection to the student's width: centred, onto the top principal directions of the teacher's states (as the
inherited lexicon's table, ``lexicon.principal_axes``), scaled (one factor) to a root mean square of 1, the scale
of the student's normed states. TinyBERT (Jiao et al. 2020) learns that projection; a fixed one keeps the student
the only thing trained and saved, so the saved student is exactly a plain one: what it learns from the teacher's
states is in its weights, and prediction costs nothing more.

With ``distill.sentence_state_weight`` > 0 the same holds per text for classification tasks: the teacher keeps the
pooled state its classification head reads, and the task's loss gains that weight times the mean squared difference
between the student's pooled state and the teacher's, on a projection of its own (sentence states are spread
unlike word states). A sentence's state is stored as a (1, D) word state, so the checks and projection are shared.

The states are kept like the targets (``targets.TargetStore``), in their own folders beside them (``STATES_SUFFIX``,
``SENTENCE_STATES_SUFFIX``), so a teacher's tag targets made without states are reused and only the states are
computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from mtl_decoder.distill.lexicon import principal_axes
from mtl_decoder.errors import UserError
from mtl_decoder.model.heads import word_level

STATE_PART = "@states"
"""A text's entry of a state store holds, per task T, the part ``T@states``: its (W, D) word states (tagging) or
its (1, D) pooled state (classification)."""
STATES_SUFFIX = "-states"
"""The word-state store's folder: the teacher fingerprint's target folder name with this suffix."""
SENTENCE_STATES_SUFFIX = "-sentence-states"
"""The sentence-state store's folder (distill.sentence_state_weight), likewise."""
FIT_WORDS = 200_000
"""At most this many word states (the first, in the run's text order) make the projection."""


def state_part(task: str) -> str:
    return f"{task}{STATE_PART}"


def task_of(part: str) -> str:
    """The task a state part (``state_part(task)``) belongs to."""
    return part.removesuffix(STATE_PART)


def check_states(tensors: dict[str, torch.Tensor]) -> str | None:
    """Why tensors read from a state shard are not word states, or None: each part a float16 (W, D) tensor of
    finite values, every part one width."""
    widths = set()
    for name, t in tensors.items():
        if not name.endswith(STATE_PART) or t.dtype != torch.float16 or t.dim() != 2:
            return f"'{name}' is a {tuple(t.shape)} {t.dtype} tensor, not (words, width) float16 '...{STATE_PART}'"
        if not bool(torch.isfinite(t).all()):
            return f"'{name}' holds NaN or infinite values"
        widths.add(t.shape[1])
    if len(widths) > 1:
        return f"the shard's states have several widths ({sorted(widths)})"
    return None


@dataclass(frozen=True)
class StateProjection:
    """Teacher states (.., D) to the student's width (.., d): (x - mean) @ directions.T * scale."""

    mean: torch.Tensor
    """(D,) the mean teacher state."""
    directions: torch.Tensor
    """(d, D) the top principal directions, each one's largest entry positive."""
    scale: float
    """The factor that gives the projected states a root mean square of 1."""
    explained: float
    """The share of the teacher states' variance the kept directions explain."""
    words: int
    """How many word states the projection was fitted on."""

    def __call__(self, states: torch.Tensor) -> torch.Tensor:
        return ((states.double() - self.mean) @ self.directions.T * self.scale).to(torch.float16)

    def record(self) -> dict[str, Any]:
        return {
            "teacher_width": int(self.mean.shape[0]),
            "width": int(self.directions.shape[0]),
            "explained_variance": self.explained,
            "scale": self.scale,
            "fitted_on_words": self.words,
        }


def fit_projection(states: Iterable[torch.Tensor], width: int, key: str = "distill.state_weight") -> StateProjection:
    """The projection of teacher word states (each (W, D)) onto their top ``width`` principal directions, fitted on
    the first FIT_WORDS of them in float64. Refused where the teacher's states are narrower than the student
    (``key``: the config key the errors name)."""
    rows, total = [], 0
    for s in states:
        if total >= FIT_WORDS:
            break
        rows.append(s[: FIT_WORDS - total].double())
        total += rows[-1].shape[0]
    if total == 0:
        raise UserError(f"{key}: the teacher gave no states (the student has no text of the task)")
    table = torch.cat(rows)  # (N, D)
    if table.shape[1] < width:
        raise UserError(
            f"{key}: the teacher's states are {table.shape[1]} wide, narrower than the student's "
            f"model.d_model {width}: a projection to the student's width needs a teacher at least as wide"
        )
    mean, directions, explained = principal_axes(table, width)
    projected = (table - mean) @ directions.T
    rms = float(projected.square().mean().sqrt())
    if not rms > 0:
        raise UserError(f"{key}: the teacher's states are all equal: there is nothing to learn")
    return StateProjection(mean, directions, 1.0 / rms, explained, total)


def state_loss(
    hidden: torch.Tensor, word_mask: torch.Tensor, teacher: torch.Tensor, teacher_mask: torch.Tensor
) -> torch.Tensor | None:
    """Mean over texts of the mean over their words of the mean squared difference over the state's dimensions.

    hidden (n, W, d) the student's state of each word, word_mask (n, W); teacher (n, W', d) the projected teacher
    states, teacher_mask (n, W') the words that have one. None where no word has both."""
    W = min(hidden.shape[1], teacher.shape[1])
    mask = word_mask[:, :W] & teacher_mask[:, :W]  # (n, W)
    keep = mask.any(1)
    if not keep.any():
        return None
    squared = (hidden[keep, :W].float() - teacher[keep, :W].float()).square().mean(-1)  # (n', W)
    per_word = squared * mask[keep]
    return (per_word.sum(1) / mask[keep].sum(1)).mean()


def head_state_loss(
    hidden: torch.Tensor, word_read: torch.Tensor | None, teacher: torch.Tensor, has: torch.Tensor
) -> torch.Tensor | None:
    """``state_loss`` of a task head's input against the teacher's projected states.

    Tagging: hidden (n, T, d) read at each word's position ``word_read`` (n, W), teacher (n, W', d), has (n, W').
    Classification (``word_read`` None): hidden (n, d) the pooled state, teacher (n, d), has (n,), a text's state
    taken as its one word."""
    if word_read is not None:
        states, _, words = word_level(hidden, word_read)  # (n, W, d)
        return state_loss(states, words, teacher, has)
    mask = has[:, None]  # (n, 1)
    return state_loss(hidden[:, None], mask, teacher[:, None], mask)
