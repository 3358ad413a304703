"""The expert blocks' arithmetic with hand-written forward and backward passes.

The expert blocks' arithmetic with forward and backward written out by hand (torch.autograd.Function): what
autograd would do, without its temporaries. tests/model/test_model_expert_block.py checks their gradients against a
per-route plain-autograd reference, in fp32 and bf16, and tests/model/test_model_gates.py against gates.py's
gate-and-mix reference in float64; experts.py holds the modules that use them.

    SwiGLUExperts     E SwiGLU experts on the same tokens (ExpertGroup)
    GateMix           one gate's weighted sum of expert outputs (cgc, mmoe): gates.mix_experts, no concatenation
    ProgressiveMix    every gate of a ple layer and its mix, over any expert modules
    ProgressiveBlock  a whole ple layer of SwiGLU expert groups and its gates, matmuls grouped across routes
    progressive_block_inference  ProgressiveBlock's forward without autograd, products by exact_matmul (inference)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import mtl_decoder.model.exact_matmul as exact_matmul


def _compute_dtype(x: torch.Tensor, *weights: torch.Tensor) -> torch.dtype:
    """The dtype autocast would give a matmul of these (its dtype where it is on), else the promoted dtype."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.result_type(x, weights[0]) if weights else x.dtype


def _swiglu(h: torch.Tensor, a: torch.Tensor, s: torch.Tensor) -> None:
    """The SwiGLU activation written into given tensors.

    a = s * up with s = silu(gate), both written into the given tensors (any layout of h's shape without the
    gate/up axis; s is kept for the backward pass, which then computes no exponential twice); h (..., 2, H)."""
    torch.ops.aten.silu.out(h[..., 0, :], out=s)
    torch.mul(s, h[..., 1, :], out=a)


def _swiglu_backward(h: torch.Tensor, s: torch.Tensor, da: torch.Tensor, dh: torch.Tensor) -> None:
    """The gradient of ``_swiglu`` with respect to h.

    The gradient of ``_swiglu`` with respect to h, written into dh (h's shape): d up = da * silu(gate), d gate =
    da * up * silu'(gate); no zero-filled gradients of the gate/up halves added together, as autograd would do."""
    g, u = h[..., 0, :], h[..., 1, :]
    d_gate, d_up = dh[..., 0, :], dh[..., 1, :]
    torch.mul(da, s, out=d_up)
    torch.mul(da, u, out=d_gate)
    torch.ops.aten.silu_backward.grad_input(d_gate, g, grad_input=d_gate)


class SwiGLUExperts(torch.autograd.Function):
    """E SwiGLU experts on the same tokens, forward and backward written out.

    E SwiGLU experts on the same tokens, forward and backward written out (``_swiglu``): hidden activations are
    kept expert-major, so each down matmul is one contiguous batched matmul."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
        M, (E, H, _) = x.shape[0], w_out.shape
        dtype = _compute_dtype(x, w_in)
        with torch.autocast(x.device.type, enabled=False):
            xc, wi, wo = x.to(dtype), w_in.to(dtype), w_out.to(dtype)
            h = (xc @ wi).view(M, E, 2, H)
            a, s = xc.new_empty(E, M, H), xc.new_empty(E, M, H)
            _swiglu(h, a.transpose(0, 1), s.transpose(0, 1))
            y = torch.bmm(a, wo)  # (E, M, C)
        ctx.save_for_backward(xc, wi, wo, h, a, s)
        ctx.dtypes = (x.dtype, w_in.dtype, w_out.dtype)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        xc, wi, wo, h, a, s = ctx.saved_tensors
        M, E, _, H = h.shape
        x_dtype, in_dtype, out_dtype = ctx.dtypes
        with torch.autocast(xc.device.type, enabled=False):
            dy = dy.to(wo.dtype)
            d_out = torch.bmm(a.transpose(1, 2), dy) if ctx.needs_input_grad[2] else None  # (E, H, C)
            da = torch.bmm(dy, wo.transpose(1, 2))  # (E, M, H)
            dh = torch.empty_like(h)  # (M, E, 2, H)
            _swiglu_backward(h, s.transpose(0, 1), da.transpose(0, 1), dh)
            dh = dh.view(M, E * 2 * H)
            d_in = xc.t() @ dh if ctx.needs_input_grad[1] else None
            dx = dh @ wi.t() if ctx.needs_input_grad[0] else None
        return (
            None if dx is None else dx.to(x_dtype),
            None if d_in is None else d_in.to(in_dtype),
            None if d_out is None else d_out.to(out_dtype),
        )


class GateMix(torch.autograd.Function):
    """A gate's weighted sum of expert outputs.

    One fused multiply-add per expert forward (no (E, M, C) temporary);
    backward, each weight's gradient as a batched dot product and each piece's gradient in one pass."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *pieces: torch.Tensor) -> torch.Tensor:
        w = weights.to(pieces[0].dtype)
        total, e = None, 0
        for y in pieces:
            for y_e in y:
                column = w[:, e : e + 1]  # (M, 1)
                total = torch.mul(y_e, column) if total is None else total.addcmul_(y_e, column)
                e += 1
        ctx.save_for_backward(w, *pieces)
        ctx.weights_dtype = weights.dtype
        return total

    @staticmethod
    def backward(ctx, d_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        w, *pieces = ctx.saved_tensors
        d_weights = None
        if ctx.needs_input_grad[0]:
            d_weights = torch.cat([torch.einsum("mc,emc->me", d_total, y) for y in pieces], 1).to(ctx.weights_dtype)
        d_pieces, e = [], 0
        for i, y in enumerate(pieces):
            n = y.shape[0]
            d_pieces.append(w[:, e : e + n].t().unsqueeze(-1) * d_total if ctx.needs_input_grad[1 + i] else None)
            e += n
        return d_weights, *d_pieces


@dataclass
class GatePlan:
    """Where each of a ple layer's gates reads in the layer's expert order [task 0's, ..., task K-1's, shared]."""

    sizes: list[int]
    """Experts per gate (task gates, then the shared gate if there is one)."""
    rows: torch.Tensor
    """(sum sizes,) each gate's experts as rows of a (gates x experts) table, gate by gate in its own order."""
    columns: list[torch.Tensor]
    """Per gate, its experts' columns in the table."""
    n_experts: int


def _gates_and_mix(
    x_gates: torch.Tensor, y: torch.Tensor, plan: GatePlan, weights, biases, n_routes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every gate of a ple layer and its mix of the expert outputs.

    Every gate of a ple layer and its weighted sum of the layer's expert outputs y (E, M, C), at once. Gate g (a
    task route's, then the shared route's) is a row of one (gates, M, E) logit table, -inf where it does not read
    an expert: one batched matmul gives every gate's logits, one softmax their weights, one batched product every
    route's mix. Gates run in float32, the mix in y's dtype. Returns the (n_routes * M, C) output (routes without a
    gate get zeros), the (G, M, E) weights, and the float32 inputs and table (for ``_gates_and_mix_backward``)."""
    G, M, C = x_gates.shape
    E = plan.n_experts
    with torch.autocast(x_gates.device.type, enabled=False):
        xg = x_gates.float()
        table = xg.new_zeros(G * E, C).index_copy_(0, plan.rows, torch.cat([w.float() for w in weights]))
        bias = xg.new_full((G * E,), float("-inf")).index_copy_(0, plan.rows, torch.cat([b.float() for b in biases]))
        probs = torch.baddbmm(bias.view(G, 1, E), xg, table.view(G, E, C).transpose(1, 2)).softmax(-1)
        mixed = torch.einsum("gme,emc->gmc", probs.to(y.dtype), y)
        if n_routes > G:  # ple's last layer: the shared route gets no update
            mixed = torch.cat([mixed, mixed.new_zeros(n_routes - G, M, C)])
    return mixed.reshape(n_routes * M, C), probs, xg, table


def _gates_and_mix_backward(
    d_out: torch.Tensor | None,
    d_probs: torch.Tensor | None,
    y: torch.Tensor,
    plan: GatePlan,
    probs: torch.Tensor,
    xg: torch.Tensor,
    table: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """d y (E, M, C), d x_gates (G, M, C) in float32, and the gates' weight and bias gradients in gate order."""
    G, M, E = probs.shape
    C = y.shape[-1]
    with torch.autocast(xg.device.type, enabled=False):
        d_mixed = y.new_zeros(G, M, C) if d_out is None else d_out.reshape(-1, M, C)[:G].to(y.dtype)
        d_y = torch.einsum("gme,gmc->emc", probs.to(y.dtype), d_mixed)
        d_p = torch.einsum("gmc,emc->gme", d_mixed, y).float()
        if d_probs is not None:
            d_p = d_p + d_probs
        d_logits = torch._softmax_backward_data(d_p, probs, -1, torch.float32)
        d_table = torch.bmm(d_logits.transpose(1, 2), xg).view(G * E, C).index_select(0, plan.rows)
        d_bias = d_logits.sum(1).view(G * E).index_select(0, plan.rows)
        d_x = torch.bmm(d_logits, table.view(G, E, C))
    return d_y, d_x, d_table, d_bias


class ProgressiveMix(torch.autograd.Function):
    """``_gates_and_mix`` over expert outputs computed elsewhere (any expert modules)."""

    @staticmethod
    def forward(ctx, x_gates: torch.Tensor, n_routes: int, plan: GatePlan, *tensors: torch.Tensor):
        G = x_gates.shape[0]
        n_pieces = len(tensors) - 2 * G
        pieces, weights, biases = tensors[:n_pieces], tensors[n_pieces : n_pieces + G], tensors[n_pieces + G :]
        y = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # (E, M, C)
        out, probs, xg, table = _gates_and_mix(x_gates, y, plan, weights, biases, n_routes)
        ctx.save_for_backward(xg, table, probs, y)
        ctx.plan, ctx.x_dtype = plan, x_gates.dtype
        ctx.set_materialize_grads(False)  # the gate weights' gradient is None unless something reads them
        ctx.piece_sizes = [p.shape[0] for p in pieces]
        ctx.param_dtypes = [w.dtype for w in weights], [b.dtype for b in biases]
        return out, probs

    @staticmethod
    def backward(ctx, d_out: torch.Tensor, d_probs: torch.Tensor | None):
        xg, table, probs, y = ctx.saved_tensors
        d_y, d_x, d_table, d_bias = _gates_and_mix_backward(d_out, d_probs, y, ctx.plan, probs, xg, table)
        w_dtypes, b_dtypes = ctx.param_dtypes
        d_weights = [d.to(t) for d, t in zip(d_table.split(ctx.plan.sizes), w_dtypes, strict=True)]
        d_biases = [d.to(t) for d, t in zip(d_bias.split(ctx.plan.sizes), b_dtypes, strict=True)]
        return d_x.to(ctx.x_dtype), None, None, *d_y.split(ctx.piece_sizes), *d_weights, *d_biases


class ProgressiveBlock(torch.autograd.Function):
    """A whole ple layer with its routes' matrix products grouped.

    A whole ple layer of SwiGLU expert groups (``ExpertGroup``) and its gates, forward and backward written out
    with the routes' matmuls grouped: the up matmuls of routes whose groups have one shape (the task groups; all
    routes when there are as many shared experts as experts per task) as one batched matmul, the SwiGLU of each
    such stack in place, every expert's down matmul as one batched matmul over all the layer's experts, then
    ``_gates_and_mix``. Inputs: x (R, M, C), the routes' tokens (task routes, then the shared route; an expanded view
    of the bottom's tokens at a fork), the number of gates G, the gate plan, then the task groups' w_in (K), their
    w_out (K), the shared group's w_in and w_out, the gates' weights (G) and biases (G)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n_gates: int, plan: GatePlan, *params: torch.Tensor):
        R, M, _ = x.shape
        K, G = R - 1, n_gates
        w_in = [*params[:K], params[2 * K]]  # per route: task groups, then the shared group
        w_out = [*params[K : 2 * K], params[2 * K + 1]]
        weights, biases = params[2 * K + 2 : 2 * K + 2 + G], params[2 * K + 2 + G :]
        sizes, H = [w.shape[0] for w in w_out], w_out[0].shape[1]
        stacks = [(0, R)] if sizes[0] == sizes[-1] else [(0, K), (K, R)]  # routes whose groups share a shape
        dtype = _compute_dtype(x, w_in[0])
        with torch.autocast(x.device.type, enabled=False):
            xc = x.to(dtype)
            wo = torch.cat([w.to(dtype) for w in w_out])  # (E, H, C), the layer's expert order
            a = xc.new_empty(sum(sizes), M, H)  # every expert's hidden activations, expert-major
            s = torch.empty_like(a)  # and silu(gate) of each
            w_stacks, h_stacks = [], []
            for r0, r1 in stacks:
                n, e0 = sizes[r0], sum(sizes[:r0])
                wi = xc.new_empty(r1 - r0, *w_in[r0].shape)  # (S, C, n * 2H); torch.stack took 100x longer
                for dst, w in zip(wi, w_in[r0:r1], strict=True):
                    dst.copy_(w)
                h = torch.bmm(xc[r0:r1], wi).view(r1 - r0, M, n, 2, H)
                rows = slice(e0, e0 + (r1 - r0) * n)
                _swiglu(h, *(t[rows].view(r1 - r0, n, M, H).permute(0, 2, 1, 3) for t in (a, s)))
                w_stacks.append(wi)
                h_stacks.append(h)
            y = torch.bmm(a, wo)  # (E, M, C): every expert's output, one batched matmul
        out, probs, xg, table = _gates_and_mix(x[:G], y, plan, weights, biases, R)
        ctx.save_for_backward(xc, wo, a, s, y, probs, xg, table, *w_stacks, *h_stacks)
        ctx.plan, ctx.stacks, ctx.sizes = plan, stacks, sizes
        ctx.set_materialize_grads(False)  # the gate weights' gradient is None unless something reads them
        ctx.dtypes = x.dtype, [p.dtype for p in params]
        return out, probs

    @staticmethod
    def backward(ctx, d_out: torch.Tensor, d_probs: torch.Tensor | None):
        xc, wo, a, s, y, probs, xg, table, *saved = ctx.saved_tensors
        plan, stacks, sizes = ctx.plan, ctx.stacks, ctx.sizes
        w_stacks, h_stacks = saved[: len(stacks)], saved[len(stacks) :]
        x_dtype, param_dtypes = ctx.dtypes
        R, M, C = xc.shape
        K, G, H = R - 1, probs.shape[0], a.shape[-1]
        d_y, d_xg, d_table, d_bias = _gates_and_mix_backward(d_out, d_probs, y, plan, probs, xg, table)
        with torch.autocast(xc.device.type, enabled=False):
            d_wo = torch.bmm(a.transpose(1, 2), d_y)  # (E, H, C)
            d_a = torch.bmm(d_y, wo.transpose(1, 2))  # (E, M, H)
            d_x = xc.new_empty(R, M, C)
            d_wi = []
            for (r0, r1), wi, h in zip(stacks, w_stacks, h_stacks, strict=True):
                n, e0, S = sizes[r0], sum(sizes[:r0]), r1 - r0
                d_h = torch.empty_like(h)
                s_rows, d_rows = (t[e0 : e0 + S * n].view(S, n, M, H).permute(0, 2, 1, 3) for t in (s, d_a))
                _swiglu_backward(h, s_rows, d_rows, d_h)
                d_h = d_h.view(S, M, -1)
                d_wi += torch.bmm(xc[r0:r1].transpose(1, 2), d_h).unbind()  # (C, n * 2H) per route
                if r1 <= G:  # every route of the stack has a gate: its input gradient joins in the same matmul
                    torch.baddbmm(d_xg[r0:r1].to(d_x.dtype), d_h, wi.transpose(1, 2), out=d_x[r0:r1])
                else:
                    torch.bmm(d_h, wi.transpose(1, 2), out=d_x[r0:r1])
                    d_x[r0:G] += d_xg[r0:G].to(d_x.dtype)
        d_wo = list(d_wo.split(sizes))
        grads = [
            *d_wi[:K],
            *d_wo[:K],
            d_wi[K],
            d_wo[K],
            *d_table.split(plan.sizes),
            *d_bias.split(plan.sizes),
        ]
        return d_x.to(x_dtype), None, None, *(g.to(t) for g, t in zip(grads, param_dtypes, strict=True))


def progressive_block_inference(
    x: torch.Tensor, n_gates: int, plan: GatePlan, *params: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``ProgressiveBlock``'s forward for inference, its matrix products by ``exact_matmul`` (the same bits).

    The same inputs and outputs as ``ProgressiveBlock.apply``, without autograd; each route's up product (at a fork,
    where every route reads the same tokens, one product for all of them) and each expert's down product through
    ``exact_matmul``, bit-identical to the batched products there. None where ``exact_matmul`` does not take every
    product of the block (the caller then runs ``ProgressiveBlock``)."""
    R, M, C = x.shape
    K, G = R - 1, n_gates
    w_in = [*params[:K], params[2 * K]]  # per route: task groups, then the shared group
    w_out = [*params[K : 2 * K], params[2 * K + 1]]
    weights, biases = params[2 * K + 2 : 2 * K + 2 + G], params[2 * K + 2 + G :]
    sizes, H = [w.shape[0] for w in w_out], w_out[0].shape[1]
    fork = x.stride(0) == 0  # an expanded view: every route reads the bottom's tokens
    widths = [sum(w.shape[1] for w in w_in)] if fork else [w.shape[1] for w in w_in]
    if not exact_matmul.active(x, *w_in, *w_out) or M < exact_matmul.MIN_ROWS:
        return None
    block = exact_matmul.block_of(H, C)
    if block is None or any(exact_matmul.block_of(C, n) is None for n in widths):
        return None
    if fork:
        h_all = exact_matmul.linear(x[0], torch.cat(w_in, 1).t().contiguous())  # (M, every route's n * 2H)
        h_routes = h_all.split([w.shape[1] for w in w_in], 1)
    else:
        h_routes = [exact_matmul.linear(x[r], w.t().contiguous()) for r, w in enumerate(w_in)]
    nb = H // block if H % block == 0 and block % 64 == 0 else 1  # the down products' inner cut, held apart
    a = x.new_empty(nb, sum(sizes), M, H // nb)  # every expert's hidden activations, cut-major then expert-major
    e0 = 0
    for h, n in zip(h_routes, sizes, strict=True):
        h = h.view(M, n, 2, nb, H // nb)
        rows = a[:, e0 : e0 + n].permute(2, 1, 0, 3)  # (M, n, nb, H / nb)
        torch.ops.aten.silu.out(h[:, :, 0], out=rows)  # _swiglu's arithmetic, silu(gate) kept in place
        rows.mul_(h[:, :, 1])
        e0 += n
    wo = torch.cat(w_out).transpose(1, 2)  # (E, C, H), the layer's expert order
    y = x.new_empty(a.shape[1], M, C)  # (E, M, C)
    for e in range(len(y)):
        held = nb > 1 or block >= H
        pieces = list(a[:, e]) if held else [a[0, e, :, k : k + block].contiguous() for k in range(0, H, block)]
        exact_matmul.linear_pieces(pieces, wo[e], out=y[e])
    out, probs, _, _ = _gates_and_mix(x[:G], y, plan, weights, biases, R)
    return out, probs
