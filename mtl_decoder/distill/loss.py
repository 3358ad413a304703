"""The distillation loss of one task: the divergence from the teacher at a temperature, mixed with the gold loss.

    loss_k = alpha * T^2 * mean_i KL(p_teacher^T || p_student^T)  +  (1 - alpha) * gold_k

(Hinton et al. 2015: the T^2 keeps the soft term's gradients on the scale of the hard term's as T changes.) The
divergence is per word for tagging (a word's tag distribution; the mean over a text's words, then over texts, as
the gold loss counts a sentence once whatever its length) and per text for classification. The teacher's
probabilities are tempered as p^(1/T), renormalised: exactly softmax(z/T) for a softmax teacher, the same
sharpening or smoothing of a CRF teacher's marginals. The student's distribution is the softmax of its tag scores
(with a CRF, its emissions: the transitions learn from the gold tags). ``soft=False`` trains on the teacher's
hard labels instead (its most probable tag or class, at T=1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DistillLossSpec:
    temperature: float
    alpha: float
    soft: bool


def tempered(probs: torch.Tensor, temperature: float, soft: bool) -> torch.Tensor:
    """Teacher probabilities (..., L) as the student's targets: tempered and renormalised, or one-hot."""
    probs = probs.float()
    if not soft:
        return F.one_hot(probs.argmax(-1), probs.shape[-1]).float()
    if temperature != 1.0:
        probs = probs.clamp(min=0) ** (1.0 / temperature)
    return probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)


def divergence(logits: torch.Tensor, teacher: torch.Tensor, spec: DistillLossSpec) -> torch.Tensor:
    """(...) KL(target || student) of each row, times T^2 (soft) ; logits and teacher (..., L)."""
    t = spec.temperature if spec.soft else 1.0
    target = tempered(teacher, t, spec.soft)
    log_q = F.log_softmax(logits.float() / t, dim=-1)
    kl = (torch.xlogy(target, target) - target * log_q).sum(-1)
    return kl * (t * t)


def tagging_divergence(
    emissions: torch.Tensor,
    word_mask: torch.Tensor,
    teacher: torch.Tensor,
    teacher_mask: torch.Tensor,
    spec: DistillLossSpec,
) -> torch.Tensor | None:
    """The divergence of the student's tags from the teacher's.

    Mean over texts of the mean over their words: emissions (n, W, L), word_mask (n, W) the student's words;
    teacher (n, W', L), teacher_mask (n, W') the words with a teacher target. None where no word has both."""
    W = max(emissions.shape[1], teacher.shape[1])
    emissions, teacher = _pad_words(emissions, W), _pad_words(teacher, W)
    mask = _pad_words(word_mask, W) & _pad_words(teacher_mask, W)  # (n, W)
    keep = mask.any(1)
    if not keep.any():
        return None
    per_word = divergence(emissions[keep], teacher[keep], spec) * mask[keep]  # (n', W)
    return (per_word.sum(1) / mask[keep].sum(1)).mean()


def classification_divergence(
    logits: torch.Tensor, teacher: torch.Tensor, teacher_mask: torch.Tensor, spec: DistillLossSpec
) -> torch.Tensor | None:
    """Mean over the texts with a teacher target: logits, teacher (n, L), teacher_mask (n,)."""
    if not teacher_mask.any():
        return None
    return divergence(logits[teacher_mask], teacher[teacher_mask], spec).mean()


def mix(kd: torch.Tensor | None, gold: torch.Tensor | None, alpha: float) -> torch.Tensor | None:
    """alpha * kd + (1 - alpha) * gold, with the absent term (and a zero-weight one) left out."""
    parts = []
    if kd is not None and alpha > 0:
        parts.append(alpha * kd)
    if gold is not None and alpha < 1:
        parts.append((1 - alpha) * gold)
    return torch.stack(parts).sum() if parts else None


def _pad_words(x: torch.Tensor, W: int) -> torch.Tensor:
    """Pad dim 1 (words) with zeros (False) up to W."""
    if x.shape[1] == W:
        return x
    pad = x.new_zeros((x.shape[0], W - x.shape[1], *x.shape[2:]))
    return torch.cat([x, pad], dim=1)
