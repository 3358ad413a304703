"""The native multi-task decoder: embedding -> L x (Pre-LN attention + expert block) -> final norm -> task heads.

ids -> embedding N(0, 0.02) [+ char-CNN, word-shape and hashed word features] -> rows per route
    -> L x DecoderLayer: h = h + Attention(Norm(h)); h = h + Block(Norm(h), routes)
    -> final norm -> each task's head reads its route (model/heads.py)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mtl_decoder.config import ModelConfig
from mtl_decoder.errors import UserError
from mtl_decoder.model.experts import ExpertBlock, ExpertGroup, Gate, RouteLayout
from mtl_decoder.model.features import WordFeatures
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.layers import (
    CacheStep,
    DecoderCache,
    Dropout,
    KVCache,
    RotaryEmbedding,
    SelfAttention,
    SwiGLU,
    make_norm,
)
from mtl_decoder.model.positions import PositionScaleShift


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tasks: list[str], index: int):
        super().__init__()
        self.attn_norm = make_norm(cfg.norm, cfg.d_model)
        self.attn = SelfAttention(cfg.d_model, cfg.n_heads, causal=cfg.attention == "causal")
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model)
        if not cfg.variant.has_experts(index, cfg.n_layers):  # hard sharing, or the shared bottom below the experts
            self.ffn = SwiGLU(cfg.d_model, cfg.mlp_width)
        else:
            self.ffn = ExpertBlock(
                cfg.variant,
                tasks,
                cfg.d_model,
                cfg.n_shared_experts,
                cfg.n_task_experts,
                cfg.expert_hidden,
                cfg.initial_shared_weight,
                shared_gate=index < cfg.n_layers - 1,
            )
        self.dropout = Dropout(cfg.dropout)

    def forward(
        self, h: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor, layout: RouteLayout, fork: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.feed_forward(self.attend(h, mask, rope), layout, fork)

    def attend(self, h: torch.Tensor, mask: torch.Tensor | None, rope: torch.Tensor | None) -> torch.Tensor:
        return h + self.dropout(self.attn(self.attn_norm(h), mask, rope))

    def attend_cached(self, h: torch.Tensor, cache: KVCache, step: CacheStep) -> torch.Tensor:
        """``attend`` for the next tokens of streams whose history is in ``cache`` (streaming)."""
        return h + self.dropout(self.attn.forward_cached(self.attn_norm(h), cache, step))

    def feed_forward(
        self, h: torch.Tensor, layout: RouteLayout, fork: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run the feed-forward part of a layer on the rows of ``layout``.

        h: the (N, T, C) rows of ``layout`` -> the same rows, updated. With ``fork`` (the first expert layer), h
        holds the rows of the shared bottom (``layout.bottom``) and the result every route's rows of ``layout``."""
        N, T, C = h.shape
        source = layout.bottom if fork else layout
        x = self.ffn_norm(h.view(N * T, C)[source.token_index])  # (M, C): real tokens only, grouped by route
        if isinstance(self.ffn, SwiGLU):
            out, gates = self.ffn(x), {}
        else:
            out, gates = self.ffn(x, layout, fork=fork)
        out = self.dropout(out).to(h.dtype)
        if fork:  # each route's rows start as a copy of their example's bottom row
            h = h[layout.bottom_row]
            N = h.shape[0]
            return h.view(N * T, C).index_add_(0, layout.token_index, out).view(N, T, C), gates
        return h.view(N * T, C).index_add(0, layout.token_index, out).view(N, T, C), gates


class MTLDecoder(MultiTaskModel):
    """The native trunk: token embedding (+ word features), ``cfg.n_layers`` decoder layers, final norm."""

    def __init__(self, cfg: ModelConfig, tasks: list[TaskHeadSpec], vocab_size: int, pad_id: int = 0):
        super().__init__(cfg, tasks, cfg.d_model)
        self.pad_id = pad_id
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.word_features = (
            WordFeatures(cfg) if cfg.char_embedding or cfg.word_features or cfg.word_hash_buckets else None
        )
        self.drop = Dropout(cfg.dropout)
        self.rope = (
            RotaryEmbedding(cfg.d_model // cfg.n_heads, cfg.rope_base)
            if cfg.position_embedding != "linear_only"
            else None
        )
        self.positions = (  # model.position_embedding linear: x * (1 + alpha_i) + beta_i before the first/every layer
            PositionScaleShift(
                cfg.n_layers if cfg.position_embedding_where == "every_layer" else 1,
                cfg.position_max_length,
                cfg.d_model,
                cfg.position_scale_bound,
            )
            if cfg.position_embedding != "rope"
            else None
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.task_names, i) for i in range(cfg.n_layers))
        self.fork_layer = cfg.variant.first_expert_layer(cfg.n_layers)
        """The first layer with an expert block: it and the layers below it attend on the shared bottom (one row per
        example); its expert block forks the stream into the routes (n_layers: never, hard sharing)."""
        self.final_norm = make_norm(cfg.norm, cfg.d_model)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():  # after the generic pass, which would overwrite a gate's own linear layer
            if isinstance(module, (ExpertGroup, Gate)):
                module.reset_parameters()
        for layer in self.layers:  # residual branches start at zero: every layer is the identity at init
            nn.init.zeros_(layer.attn.out.weight)
            if isinstance(layer.ffn, SwiGLU):
                nn.init.zeros_(layer.ffn.down.weight)

    def expert_blocks(self) -> list[ExpertBlock | None]:
        return [layer.ffn if isinstance(layer.ffn, ExpertBlock) else None for layer in self.layers]

    def embed_tokens(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, C) input vectors; subclasses may read them from elsewhere (a frozen trunk)."""
        return self.embed(input_ids)

    def embed_routes(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: RouteLayout
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]] | None:
        """The per-route inputs of a trunk whose routes start apart, if any.

        The (N, T, C) input of every row of ``layout`` and the gates of whatever computed them, for a trunk whose
        routes start apart (a per-route mix of pretrained layers, pretrained expert blocks below); None (here): one
        input per example (``embed_tokens``), shared by the routes up to the fork."""
        return None

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, layout: RouteLayout, features: dict[str, Any]
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        B, T = input_ids.shape
        routed = self.embed_routes(input_ids, attention_mask, layout)
        x = self.embed_tokens(input_ids, attention_mask) if routed is None else routed[0]  # (B or N, T, C)
        if self.word_features is not None:
            words = self.word_features(
                features.get("token_word"),
                features.get("char_ids"),
                features.get("shape_ids"),
                features.get("hash_ids"),
            )
            x = x + (words if routed is None else words[layout.row_example])
        rope = self.rope(T) if self.rope is not None else None
        positions = torch.arange(T, device=input_ids.device)
        # Every route of an example reads the same shared bottom: the layers below the first expert layer, and that
        # layer's attention, run once per example; its expert block forks the stream into one row per (example,
        # route), on which the layers above it run. Routes that start apart (``embed_routes``) never fork.
        bottom = (layout.bottom or layout) if routed is None else layout  # hard sharing: one stream, no fork
        fork_layer = self.fork_layer if routed is None else -1
        h = self.drop(x)  # (B, T, C)
        if routed is None and len(bottom.row_example) != B:  # examples that no route reads are not run
            h = h[bottom.row_example]
        masks = [self._attention_mask(attention_mask, rows) for rows in (bottom.row_example, layout.row_example)]
        gates = [] if routed is None else list(routed[1])
        for i, layer in enumerate(self.layers):
            forked, fork = i > fork_layer, i == fork_layer
            h, layer_gates = layer(
                self._place(h, i, positions), masks[forked], rope, layout if forked or fork else bottom, fork
            )
            gates.append(layer_gates)
        return h, gates  # (N, T, C)

    def _attention_mask(self, attention_mask: torch.Tensor, row_example: torch.Tensor) -> torch.Tensor | None:
        """The bidirectional attention mask of a batch.

        Bidirectional: a (N, 1, 1, T) key mask (padding hidden from every query). Causal: None, and attention
        runs with is_causal; rows are right-padded, so no real token ever sees a pad key anyway."""
        if self.cfg.attention == "causal":
            return None
        return attention_mask[row_example][:, None, None, :]

    def _place(self, h: torch.Tensor, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """The linear position sub-layer in front of ``layer`` (h unchanged where there is none)."""
        if self.positions is None or (layer and self.cfg.position_embedding_where == "input"):
            return h
        return self.positions(h, layer, positions)

    # ---------------------------------------------------------------------------------- streaming (causal only)

    def new_cache(self, batch_size: int, capacity: int, tasks: list[str] | None = None) -> DecoderCache:
        """Empty KV caches for ``batch_size`` causal streams of at most ``capacity`` tokens each, allocated once:
        the attention of the shared bottom's layers and of the first expert layer runs once per example
        (``encode``), so their caches have a row per stream; every later layer's has a row per (stream, route) of
        ``tasks``' route layout."""
        if self.cfg.attention != "causal":
            raise UserError(
                "streaming needs a causal model (model.attention=causal): in a bidirectional one every later token "
                "changes every earlier token's state, so nothing can be cached"
            )
        device = self.embed.weight.device
        layout = self.route_layout(
            torch.ones(batch_size, 1, dtype=torch.bool, device=device), list(tasks or self.task_names), None
        )
        L, bottom = len(self.layers), (layout.bottom or layout).row_example
        rows = [bottom] * min(self.fork_layer + 1, L) + [layout.row_example] * (L - min(self.fork_layer + 1, L))
        head_dim = self.cfg.d_model // self.cfg.n_heads
        return DecoderCache(rows, batch_size, self.cfg.n_heads, head_dim, capacity, self.embed.weight.dtype, device)

    def encode_step(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        layout: RouteLayout,
        features: dict[str, Any],
        cache: DecoderCache,
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Encode the next tokens of B streams against their cached history.

        ``encode`` for the next tokens of B streams whose earlier tokens are in ``cache`` (``new_cache``): the
        (B, t) new ids, right-padded, go through the layers alone, attending to the cached history; their keys and
        values are added to the cache. ``layout``: ``route_layout`` of the new tokens' mask for the cache's tasks."""
        bottom = layout.bottom or layout
        if not torch.equal(bottom.row_example, cache.layer_rows[0]) or (
            self.fork_layer < len(self.layers) - 1 and not torch.equal(layout.row_example, cache.layer_rows[-1])
        ):
            raise ValueError("the step's route layout is not the one the cache was built for")
        x = self.embed_tokens(input_ids, attention_mask)  # (B, t, C)
        if self.word_features is not None:
            x = x + self.word_features(
                features.get("token_word"),
                features.get("char_ids"),
                features.get("shape_ids"),
                features.get("hash_ids"),
            )
        plans = cache.step(attention_mask, self.rope)
        h = self.drop(x)  # (B, t, C): the bottom holds every stream (the cache's layout asks every task)
        gates = []
        for i, layer in enumerate(self.layers):  # as in encode: the bottom, the fork, then every route's rows
            forked, fork = i > self.fork_layer, i == self.fork_layer
            plan = plans[id(cache.layer_rows[i])]
            h = layer.attend_cached(self._place(h, i, plan.positions), cache.layers[i], plan)
            h, layer_gates = layer.feed_forward(h, layout if forked or fork else bottom, fork)
            gates.append(layer_gates)
        cache.advance(attention_mask)
        return h, gates
