"""The ONNX graph of a native model.

The same function as ``MTLDecoder.forward`` for every task, written so that it
exports with dynamic batch and length axes.

``MTLDecoder`` packs the real tokens of each route into one matrix (``RouteLayout``: sizes read from the data) and
runs the expert blocks through hand-written autograd kernels; neither has an ONNX form with dynamic shapes. This
graph computes every position densely instead (padding included) from the model's own parameters: the expert blocks
and gates are ``model/gates.py``'s reference rule (``gate_weights`` and ``mix_experts``) over every route's rows,
rotary positions in real arithmetic. A padding position's state differs from nothing a real token reads: attention
hides padding keys (bidirectional) or never looks ahead (causal, right-padded), feed-forward layers are per token,
and heads read real tokens only. ``export_onnx`` checks the graph against the torch model on the validation texts.

Outputs, in order: ``logits.TASK`` for each task of the model ((B, T, L) tagging, (B, L) classification; every
example runs every task), then ``gates.LAYER.ROUTE`` for each gate of each expert layer ((N_route, E) over every
position of the route's rows, row-major: the engine keeps the real tokens' rows).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.config import CLASSIFICATION, SHARED
from mtl_decoder.errors import UserError
from mtl_decoder.model.experts import ExpertBlock, ExpertGroup
from mtl_decoder.model.gates import gate_weights, mix_experts
from mtl_decoder.model.layers import SwiGLU

FEATURES = ("token_word", "char_ids", "shape_ids", "hash_ids")
"""The collator's per-word inputs, in the graph's input order after input_ids and attention_mask."""


def route_names(model: nn.Module) -> list[str]:
    """The routes every example takes when every task runs (``route_layout`` with no labels), in row order."""
    mask = torch.ones(1, 1, dtype=torch.bool)
    return list(model.route_layout(mask, model.task_names, None).names)


def gate_names(model: nn.Module) -> list[tuple[int, str]]:
    """(layer, route) of every gate the graph outputs, in output order: what ``ExpertBlock.forward`` returns."""
    routes, out = route_names(model), []
    for i, block in enumerate(model.expert_blocks()):
        if block is None:
            continue
        if block.variant.shared_route and block.shared_gate is None:
            out += [(i, r) for r in routes if r != SHARED]
        else:
            out += [(i, r) for r in routes]
    return out


def check_exportable(model: nn.Module | None, where: str) -> None:
    """Check that the ONNX graph computes every part of a model.

    A UserError unless ``model`` is a native decoder whose every part the graph computes (None: a model known to
    have a pretrained trunk)."""
    from mtl_decoder.model.decoder import MTLDecoder

    if type(model) is not MTLDecoder:
        raise UserError(
            f"{where}: export --format onnx supports native models (a trunk trained from scratch); this model has a "
            "pretrained trunk (model.trunk.pretrained): predict with --engine torch"
        )
    for block in model.expert_blocks():
        groups = [] if block is None else [block.shared, *block.task_experts.values()]
        if any(type(g) is not ExpertGroup for g in groups):
            raise UserError(f"{where}: an expert block of this model has experts the ONNX graph does not compute")


class DenseGraph(nn.Module):
    """The native model's forward over every position and every task, for ``torch.onnx.export``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.routes = route_names(model)
        self.features = [name for name, on in zip(FEATURES, self._uses(), strict=True) if on]

    def _uses(self) -> list[bool]:
        wf = self.model.word_features
        if wf is None:
            return [False] * 4
        return [True, wf.char_emb is not None, wf.shape_emb is not None, wf.hash_emb is not None]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_word: torch.Tensor | None = None,
        char_ids: torch.Tensor | None = None,
        shape_ids: torch.Tensor | None = None,
        hash_ids: torch.Tensor | None = None,
    ) -> tuple:
        m = self.model
        mask = attention_mask.bool()
        B, T = input_ids.shape
        x = m.embed(input_ids)
        if m.word_features is not None:
            x = x + m.word_features(token_word, char_ids, shape_ids, hash_ids)
        rotation = self._rotation(T)
        R, fork_layer = len(self.routes), m.fork_layer
        h, gates = x, []
        for i, layer in enumerate(m.layers):
            forked = i > fork_layer
            h = self._place(h, i, T)
            key_mask = None if m.cfg.attention == "causal" else (mask.repeat(R, 1) if forked else mask)[:, None, None]
            h = h + layer.attn.out(self._attend(layer.attn, layer.attn_norm(h), key_mask, rotation))
            N = h.shape[0]
            normed = layer.ffn_norm(h.reshape(N * T, -1))
            if isinstance(layer.ffn, SwiGLU):
                out = layer.ffn(normed)
            else:
                out, block_gates = self._block(layer.ffn, normed, R, fork=i == fork_layer)
                gates += block_gates
            if i == fork_layer:
                h = h.repeat(R, 1, 1)  # route-major rows: route r, example b at r * B + b
            h = h + out.to(h.dtype).view(h.shape)
        logits = []
        for task in m.task_names:
            r = self.routes.index(m.head_route(task))
            hidden = m.final_norm(h[r * B : (r + 1) * B] if R > 1 else h)
            if m.task(task).kind == CLASSIFICATION:
                hidden = m._pool(hidden, mask)
            logits.append(m.heads[task](hidden))
        return (*logits, *gates)

    def _rotation(self, T: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """RotaryEmbedding's rotations of positions 0..T-1 as (cos, sin), each (T, D/2)."""
        if self.model.rope is None:
            return None
        angles = torch.arange(T, dtype=torch.float32).unsqueeze(1) * self.model.rope.inv_freq
        return angles.cos(), angles.sin()

    def _place(self, h: torch.Tensor, layer: int, T: int) -> torch.Tensor:
        """``MTLDecoder._place`` with the position table read by slicing (no data-dependent bound check)."""
        m = self.model
        if m.positions is None or (layer and m.cfg.position_embedding_where == "input"):
            return h
        coef = m.positions.inference_table()[layer][:T].to(h.dtype)  # (T, 2C)
        C = h.shape[-1]
        alpha, beta = coef[:, :C], coef[:, C:]
        return torch.addcmul(h + beta, h, alpha)

    @staticmethod
    def _attend(attn: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, rotation) -> torch.Tensor:
        """``SelfAttention.forward`` before its output projection, rotary positions in real arithmetic."""
        N, T, C = x.shape
        qkv = attn.qkv(x).view(N, T, 3, attn.n_heads, C // attn.n_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if rotation is not None:
            q, k = _rotate(q, *rotation), _rotate(k, *rotation)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=attn.causal)
        return y.transpose(1, 2).reshape(N, T, C)

    def _block(
        self, block: ExpertBlock, x: torch.Tensor, R: int, fork: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """An expert block over every route's rows, in exportable form.

        An expert block over every route's rows (x: (R * M, C), or at the fork the bottom's (M, C), which every
        route reads): per gate, ``gate_weights`` over its route's tokens and ``mix_experts`` of the groups it mixes."""
        M = x.shape[0] // (1 if fork else R)  # slices, not chunk: the ONNX optimiser cannot fold a dynamic split
        routes = [x if fork else x[r * M : (r + 1) * M] for r in range(R)]
        by_route = dict(zip(self.routes, routes, strict=True))
        outs, gates = [], []
        if block.variant.shared_route:  # ple: task gates mix [own, shared]; the shared gate every group
            tasks = [r for r in self.routes if r != SHARED]
            y_shared = _experts(block.shared, by_route[SHARED])
            y_own = {t: _experts(block.task_experts[t], by_route[t]) for t in tasks}
            for t in tasks:
                w = _gate(block.task_gates[t], by_route[t])
                outs.append(mix_experts(w, torch.cat([y_own[t], y_shared])))
                gates.append(w)
            if block.shared_gate is None:
                outs.append(torch.zeros_like(by_route[SHARED]))
            else:
                w = _gate(block.shared_gate, by_route[SHARED])
                outs.append(mix_experts(w, torch.cat([*y_own.values(), y_shared])))
                gates.append(w)
            return torch.cat(outs), gates
        for name in self.routes:  # cgc / mmoe: each route's gate mixes [own experts, shared experts] on its tokens
            x_route = by_route[name]
            pieces = [_experts(block.shared, x_route)]
            if name in block.task_experts:
                pieces.insert(0, _experts(block.task_experts[name], x_route))
            w = _gate(block.task_gates[name], x_route)
            outs.append(mix_experts(w, torch.cat(pieces)))
            gates.append(w)
        return torch.cat(outs), gates


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rope``: dimension pairs (2i, 2i+1) rotated by the position's angle, in float32."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).to(x.dtype)


def _gate(gate: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return gate_weights(x, gate.proj.weight, gate.proj.bias)


def _experts(group: ExpertGroup, x: torch.Tensor) -> torch.Tensor:
    """``SwiGLUExperts``: (M, C) -> (E, M, C), every expert of the group on every token."""
    M, (E, H, _) = x.shape[0], group.w_out.shape
    h = (x @ group.w_in).view(M, E, 2, H)
    a = F.silu(h[:, :, 0]) * h[:, :, 1]  # (M, E, H)
    return torch.einsum("meh,ehc->emc", a, group.w_out)


def example_inputs(graph: DenseGraph, encoder: Any, collate: Any) -> dict[str, torch.Tensor]:
    """A small batch of two texts of different lengths, as the collator makes it: the export's example inputs."""
    from mtl_decoder.data.batching import EncodedExample

    encoded = encoder.encode_batch(["a short text", "a somewhat longer text with, more words in it"])
    batch = collate([EncodedExample.unlabelled(e) for e in encoded])
    return {name: batch[name] for name in ("input_ids", "attention_mask", *graph.features)}
