"""The position-aware linear embedding.

The position-aware linear embedding (``model.position_embedding: linear``): a residual sub-layer

    x_i' = x_i * (1 + alpha_i) + beta_i,        (alpha_i, beta_i) = P[i] @ W_l

where P is a learned (max_positions, d_model) position table shared by the sub-layers and W_l (d_model, 2 d_model)
is sub-layer l's linear map. W starts at zero, so every sub-layer is exactly the identity at initialisation
(alpha = beta = 0; a map whose scale rows start at 1 would double x instead). With ``scale_bound`` b the scale is
bounded, alpha = b * tanh(raw / b) (slope 1 at 0, so the identity start is unchanged). The sub-layers sit before
the first decoder layer (``input``) or before every layer (``every_layer``).

Positions past the table are an error, never interpolated: a learned table says nothing about rows it never
trained, and prediction and streaming never ask for them (long inputs are tagged in windows of data.max_length).

At inference (eval mode, no gradients) the whole (alpha, beta) table of every sub-layer is computed once and read
by position; it is computed again only after the parameters change (an optimizer step, loading weights).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from mtl_decoder.errors import UserError

_TABLE_LOCK = threading.Lock()
"""The Predictor's worker threads may ask for a table at the same time (module-level: a model stays copyable)."""


class PositionScaleShift(nn.Module):
    """``n_sublayers`` position-aware scale-and-shift sub-layers over one position table."""

    def __init__(self, n_sublayers: int, max_positions: int, d_model: int, scale_bound: float | None = None):
        super().__init__()
        self.max_positions, self.scale_bound = max_positions, scale_bound
        # raw Parameters (not nn.Embedding / nn.Linear): the trunk's generic initialisation leaves them alone
        self.table = nn.Parameter(torch.randn(max_positions, d_model))
        self.weight = nn.Parameter(torch.zeros(n_sublayers, d_model, 2 * d_model))
        self._cached: torch.Tensor | None = None
        self._cached_key: tuple | None = None
        self.table_builds = 0
        """How often the inference table was computed (tests: once per loaded model)."""

    def reset_parameters(self) -> None:
        """The identity: W = 0 (the table keeps a random code per position for W to learn from)."""
        with torch.no_grad():
            self.table.normal_()
            self.weight.zero_()

    def forward(self, x: torch.Tensor, sublayer: int, positions: torch.Tensor) -> torch.Tensor:
        """x (..., T, C) with ``positions`` broadcastable to x's (..., T): x * (1 + alpha) + beta, in x's dtype."""
        coef = self.coefficients(sublayer, positions).to(x.dtype)  # (..., T, 2C)
        alpha, beta = coef.chunk(2, dim=-1)
        return torch.addcmul(x + beta, x, alpha)  # x + x * alpha + beta: exactly x when alpha = beta = 0

    def coefficients(self, sublayer: int, positions: torch.Tensor) -> torch.Tensor:
        """A sub-layer's [alpha | beta] coefficients at the given positions.

        (..., 2C) [alpha | beta] of sub-layer ``sublayer`` at ``positions`` (read from the precomputed table at
        inference)."""
        top = int(positions.max()) if positions.numel() else 0
        if top >= self.max_positions:
            raise UserError(
                f"position {top} is past the position table's {self.max_positions} rows "
                "(model.position_max_length): cut the input into windows (predict does) or train with a larger table"
            )
        if not self.training and not torch.is_grad_enabled():
            return self.inference_table()[sublayer][positions]
        return self._coefficients(sublayer, self.table[positions])

    def _coefficients(self, sublayer: int, rows: torch.Tensor) -> torch.Tensor:
        coef = rows @ self.weight[sublayer]  # (..., 2C)
        if self.scale_bound is None:
            return coef
        alpha, beta = coef.chunk(2, dim=-1)
        return torch.cat([self.scale_bound * torch.tanh(alpha / self.scale_bound), beta], dim=-1)

    def inference_table(self) -> torch.Tensor:
        """Every sub-layer's coefficients at every position, computed once.

        (n_sublayers, max_positions, 2C): every sub-layer's [alpha | beta] at every position, computed once and
        kept while the parameters stay as they are (their version counters say when they changed)."""
        key = (self.table._version, self.weight._version, self.table.data_ptr(), self.weight.data_ptr())
        with _TABLE_LOCK:
            if self._cached is None or self._cached_key != key:
                with torch.no_grad():
                    self._cached = torch.stack([self._coefficients(i, self.table) for i in range(len(self.weight))])
                self._cached_key = key
                self.table_builds += 1
            return self._cached
