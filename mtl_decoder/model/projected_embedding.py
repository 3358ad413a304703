"""A token table read through a learned projection: a student's lexicon with ``model.lexicon.projection: learned``.

A distilled student may keep its teacher's token table whole (``rows``: vocabulary x teacher width, centred, frozen)
and learn only how to project it to its own width (``projection``: teacher width x d_model). Training looks a
batch's rows up and projects those alone (the table is never multiplied out per step); saving folds the two into
one vocabulary x d_model table (``folded_state``), so a saved student is a plain native model whose embedding is a
lookup, and loading it needs nothing of this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ProjectedEmbedding(nn.Module):
    """Row i of the table is ``rows[i] @ projection``: the rows fixed, the projection trained."""

    def __init__(self, rows: torch.Tensor, projection: torch.Tensor):
        super().__init__()
        if rows.dim() != 2 or projection.dim() != 2 or rows.shape[1] != projection.shape[0]:
            raise ValueError(f"rows {tuple(rows.shape)} and projection {tuple(projection.shape)} do not chain")
        # not in the state dict: a checkpoint holds the projection alone, the run folder the rows (lexicon.py)
        self.register_buffer("rows", rows.detach().clone(), persistent=False)
        self.projection = nn.Parameter(projection.detach().clone())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        picked = F.embedding(input_ids, self.rows)  # (B, T, W): only the batch's rows
        return picked @ self.projection.to(picked.dtype)  # (B, T, C)

    @property
    def weight(self) -> torch.Tensor:
        """The folded table (vocabulary, C), as an nn.Embedding's weight would be (device, dtype, saving)."""
        return self.rows @ self.projection.to(self.rows.dtype)

    @property
    def embedding_dim(self) -> int:
        return self.projection.shape[1]


def folded_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with each ProjectedEmbedding's projection replaced by its folded table (``weight``).

    The state a saved model holds: its loader builds a plain nn.Embedding there."""
    state = model.state_dict()
    for name, module in model.named_modules():
        if isinstance(module, ProjectedEmbedding):
            prefix = f"{name}." if name else ""
            del state[prefix + "projection"]
            state[prefix + "weight"] = module.weight.detach()
    return state
