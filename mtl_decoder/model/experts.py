"""The expert/gate block of the gated variants (see config/variants.py for the table).

A batch row is one (example, route) pair. Rows are laid out route-major, and the real (non-pad) tokens of
all rows are packed into one (M, C) matrix, grouped by route, so that every expert runs exactly once, on
exactly the tokens that read it, as two grouped matmuls. Attention runs once over all rows.

    variant          routes                   what a route's gate mixes
    ple              every task + 'shared'    task k: [task-k experts(route k), shared experts(shared route)]
                                              shared: [all task experts(their routes), shared experts]
    cgc(_stacked)    each task asked for      task k: [task-k experts, shared experts], both on route k
    mmoe(_stacked)   each task asked for      task k: [shared experts on route k]

The first expert layer *forks* the shared bottom (one row per example): it reads the bottom's packed tokens,
runs the shared experts once per bottom token (whatever the number of routes reading it), and writes the packed
tokens of every route (``ExpertBlock.forward(..., fork=True)``; ``RouteLayout.bottom`` says where each route's
tokens sit among the bottom's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from mtl_decoder.config import SHARED, VARIANTS, Variant
from mtl_decoder.model.gates import GateRoute, gate_weights, mix_experts
from mtl_decoder.model.kernels import (
    GateMix,
    GatePlan,
    ProgressiveBlock,
    ProgressiveMix,
    SwiGLUExperts,
    progressive_block_inference,
)


@dataclass
class RouteLayout:
    """Where each route's rows and real tokens sit in the (N, T, C) residual streams."""

    names: list[str]
    """Route names in row order (task names, and SHARED where there is a shared route)."""
    row_example: torch.Tensor
    """(N,) the batch example each row belongs to."""
    row_bounds: list[tuple[int, int]]
    """Route r owns rows [start, end)."""
    token_index: torch.Tensor
    """(M,) flat index into N*T of every real token, grouped by route."""
    token_bounds: list[tuple[int, int]]
    """Route r owns packed tokens [start, end)."""
    token_position: torch.Tensor
    """(M,) the position of each packed token in its sequence."""
    bottom: RouteLayout | None = None
    """The shared bottom these routes fork from: one SHARED row per example of any route; None when the layout
    is itself the only stream (hard sharing)."""
    bottom_row: torch.Tensor | None = None
    """(N,) the bottom row each row is forked from."""
    bottom_token: list[torch.Tensor | None] | None = None
    """Per route: (M_route,) where each of its packed tokens sits among the bottom's packed tokens, or None when
    the route holds every bottom token in the bottom's order."""

    @classmethod
    def build(cls, routes: dict[str, torch.Tensor], attention_mask: torch.Tensor, fork: bool = False) -> RouteLayout:
        """Build the packed layout of a batch's routes.

        ``routes`` maps a route name to the (sorted) batch examples that take it; with ``fork`` the layout
        also says how its routes fork from a shared bottom of one row per example of any route."""
        names = list(routes)
        empty = torch.zeros(0, dtype=torch.long, device=attention_mask.device)
        row_example = torch.cat([routes[n] for n in names]) if names else empty  # (N,)
        T = attention_mask.shape[1]
        row_mask = attention_mask[row_example]  # (N, T)
        row_counts = [len(routes[n]) for n in names]
        token_counts = torch.stack([m.sum() for m in row_mask.split(row_counts)]).tolist() if names else []
        token_index = row_mask.flatten().nonzero().squeeze(1)  # (M,)
        layout = cls(names, row_example, _bounds(row_counts), token_index, _bounds(token_counts), token_index % T)
        if fork:
            layout._fork_from_bottom(routes, attention_mask)
        return layout

    def _fork_from_bottom(self, routes: dict[str, torch.Tensor], attention_mask: torch.Tensor) -> None:
        B, T = attention_mask.shape
        device = attention_mask.device
        present = torch.zeros(B, dtype=torch.bool, device=device)
        for examples in routes.values():
            present[examples] = True
        n_bottom = int(present.sum())
        everyone = torch.arange(B, device=device)
        bottom = RouteLayout.build(
            {SHARED: everyone if n_bottom == B else present.nonzero().squeeze(1)}, attention_mask
        )
        bottom_of_example = torch.full((B,), -1, dtype=torch.long, device=device)
        bottom_of_example[bottom.row_example] = torch.arange(n_bottom, device=device)
        self.bottom, self.bottom_row = bottom, bottom_of_example[self.row_example]
        # Routes holding every bottom example hold its tokens in its order; the others gather theirs.
        partial = [r for r, name in enumerate(self.names) if len(routes[name]) != n_bottom]
        self.bottom_token = [None] * len(self.names)
        if partial:
            packed_of_flat = torch.full((n_bottom * T,), -1, dtype=torch.long, device=device)
            packed_of_flat[bottom.token_index] = torch.arange(len(bottom.token_index), device=device)
            for r in partial:
                flat = self.token_index[slice(*self.token_bounds[r])]
                self.bottom_token[r] = packed_of_flat[self.bottom_row[flat // T] * T + flat % T]

    def rows(self, name: str) -> slice:
        return slice(*self.row_bounds[self.names.index(name)])

    def tokens(self, name: str) -> slice:
        return slice(*self.token_bounds[self.names.index(name)])

    def reads(self, r: int, fork: bool) -> slice | torch.Tensor:
        """Which of the block input's packed tokens route r reads: its own span, or at a fork its bottom tokens."""
        if not fork:
            return slice(*self.token_bounds[r])
        index = self.bottom_token[r]
        return slice(None) if index is None else index


def _bounds(counts: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


class ExpertGroup(nn.Module):
    """E SwiGLU experts that read the same tokens: one matmul up for all of them, one batched matmul down."""

    def __init__(self, n_experts: int, d_model: int, hidden: int):
        super().__init__()
        self.n_experts, self.hidden = n_experts, hidden
        self.w_in = nn.Parameter(torch.empty(d_model, n_experts * 2 * hidden))  # columns: [expert][gate|up][hidden]
        self.w_out = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.w_in, std=0.02)
        nn.init.zeros_(self.w_out)  # residual-branch output starts at zero: the layer is the identity at init

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(M, C) -> (E, M, C): every expert on every token."""
        return SwiGLUExperts.apply(x, self.w_in, self.w_out)


def shared_logit_bias(initial_shared_weight: float, n_own: int, n_shared: int) -> float:
    """The shared experts' logit bias that gives them a set initial gate weight.

    The bias on each shared expert's logit (own experts' logits at 0) that puts initial_shared_weight of a
    zero-weight gate's softmax mass on the shared experts: n_shared * e^b / (n_shared * e^b + n_own) = p."""
    p = initial_shared_weight
    return math.log(p * n_own / ((1 - p) * n_shared))


class Gate(nn.Module):
    """One linear layer + softmax (in float32) over [own experts..., shared experts...]."""

    def __init__(self, d_model: int, n_own: int, n_shared: int, initial_shared_weight: float):
        super().__init__()
        self.n_own, self.n_shared, self.initial_shared_weight = n_own, n_shared, initial_shared_weight
        self.proj = nn.Linear(d_model, n_own + n_shared)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero weights; shared logits biased so the shared experts hold initial_shared_weight of the mass."""
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        if self.n_own:
            with torch.no_grad():
                self.proj.bias[self.n_own :] = shared_logit_bias(self.initial_shared_weight, self.n_own, self.n_shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(M, C) -> (M, E) float32 weights (``gates.gate_weights``)."""
        return gate_weights(x, self.proj.weight, self.proj.bias)


def _cat(outs: list[torch.Tensor]) -> torch.Tensor:
    return outs[0] if len(outs) == 1 else torch.cat(outs)


class ExpertBlock(nn.Module):
    """The expert block of one layer for a gated variant.

    The expert block of one layer for a gated variant (ple, cgc, mmoe); ``shared_gate`` is False in ple's last
    layer, where nothing reads the shared route after it."""

    def __init__(
        self,
        variant: Variant | str,
        tasks: list[str],
        d_model: int,
        n_shared: int,
        n_task: int,
        hidden: int,
        initial_shared_weight: float,
        shared_gate: bool,
        make_group: Callable[[int], nn.Module] | None = None,
    ):
        """Build the block's expert groups and gates.

        ``make_group(n)``: a module of n experts mapping (M, C) -> (n, M, C) with an ``n_experts`` attribute
        (default: n SwiGLU experts of width ``hidden``; a pretrained trunk passes copies of its own MLP)."""
        super().__init__()
        self.variant = variant = VARIANTS[variant] if isinstance(variant, str) else variant
        make_group = make_group or (lambda n: ExpertGroup(n, d_model, hidden))
        self.shared = make_group(n_shared)
        n_own = n_task if variant.task_experts else 0
        self.task_experts = nn.ModuleDict({t: make_group(n_task) for t in tasks} if n_own else {})
        self.task_gates = nn.ModuleDict({t: Gate(d_model, n_own, n_shared, initial_shared_weight) for t in tasks})
        self.shared_gate = (
            Gate(d_model, n_own * len(tasks), n_shared, initial_shared_weight)
            if variant.shared_route and shared_gate
            else None
        )
        self._plans: dict[tuple, GatePlan] = {}

    def forward(
        self, x: torch.Tensor, layout: RouteLayout, fork: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Apply the expert block to packed tokens.

        x: (M_in, C) packed normed tokens -> (M, C) block output for ``layout``'s packed tokens, and each gate's
        (M_route, E) weights. M_in = M, except with ``fork``: x holds the shared bottom's tokens
        (``layout.bottom``), which every route reads (``layout.bottom_token``)."""
        if self.variant.shared_route:
            return self._progressive(x, layout, fork)
        return self._per_route(x, layout, fork)

    def _per_route(
        self, x: torch.Tensor, layout: RouteLayout, fork: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # Shared experts once per input token: each route's own tokens, or at a fork each bottom token once,
        # however many routes read it.
        y_shared = self.shared(x)  # (Es, M_in, C)
        if fork:
            return self._fork_routes(x, y_shared, layout)
        # split (views): their gradients are put back together in one pass, not one zero-fill per route
        counts = [end - start for start, end in layout.token_bounds]
        x_routes, y_routes = x.split(counts), y_shared.split(counts, dim=1)
        outs, gates = [], {}
        for name, x_route, y_route in zip(layout.names, x_routes, y_routes, strict=True):
            weights = self.task_gates[name](x_route)  # (M_route, E)
            pieces = [y_route]
            if name in self.task_experts:
                pieces.insert(0, self.task_experts[name](x_route))
            outs.append(GateMix.apply(weights, *pieces))  # mix_experts, without the (E, M, C) concatenation
            gates[name] = weights
        return _cat(outs), gates

    def _fork_routes(
        self, x: torch.Tensor, y_shared: torch.Tensor, layout: RouteLayout
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The routes of a cgc/mmoe layer at the fork, computed in batched form.

        cgc/mmoe at the fork: every gate reads the bottom's tokens, so all of them run as one linear layer on
        every bottom token (a few flops wasted on tokens a route does not hold), and the shared experts' mix of every
        gate as one batched product, from which each route's tokens are gathered at once; each task's experts run on
        their route's tokens only. A handful of operations whatever the number of tasks."""
        Mb, names = x.shape[0], layout.names
        gates = [self.task_gates[n] for n in names]
        n_own = gates[0].n_own
        everyone = torch.arange(Mb, device=x.device)
        reads = [everyone if i is None else i for i in layout.bottom_token]
        weight, bias = torch.stack([g.proj.weight for g in gates]), torch.stack([g.proj.bias for g in gates])
        probs = gate_weights(x, weight, bias)  # (Mb, G, E)
        flat = torch.cat([r * Mb + i for r, i in enumerate(reads)])  # each route's tokens among (gate, bottom token)
        mixed = torch.einsum("mge,emc->gmc", probs[..., n_own:].to(y_shared.dtype), y_shared)  # (G, Mb, C)
        out = mixed.reshape(len(names) * Mb, -1).index_select(0, flat)  # (M, C), route by route
        if n_own:  # each task's experts on its own route's tokens
            y_own = torch.cat(
                [
                    self.task_experts[n](x if i is None else x[i])
                    for n, i in zip(names, layout.bottom_token, strict=True)
                ],
                1,
            )
            w_own = probs.transpose(0, 1).reshape(len(names) * Mb, -1).index_select(0, flat)[:, :n_own]
            out = out + mix_experts(w_own, y_own)
        return out, {n: probs[:, r].index_select(0, i) for r, (n, i) in enumerate(zip(names, reads, strict=True))}

    def _progressive(
        self, x: torch.Tensor, layout: RouteLayout, fork: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # Every route holds the same tokens in the same order, so the routes' packed spans align row by row; at a
        # fork every route reads the bottom's tokens themselves.
        tasks = [n for n in layout.names if n != SHARED]
        if layout.names != [*tasks, SHARED] or set(tasks) != set(self.task_experts):
            raise ValueError(f"a ple layout holds every task's route, then '{SHARED}'; got {layout.names}")
        R, M, C = len(layout.names), layout.token_bounds[0][1], x.shape[-1]
        groups = [self.task_experts[t] for t in tasks] + [self.shared]
        gates = [self.task_gates[t] for t in tasks] + ([self.shared_gate] if self.shared_gate is not None else [])
        G = len(gates)
        x_routes = x.view(R, M, C) if not fork else x.expand(R, M, C)  # each gate reads its route's tokens
        gate_params = [g.proj.weight for g in gates] + [g.proj.bias for g in gates]
        if self._groupable(groups, gates):
            plan = self._gate_plan(tasks, [g.n_experts for g in groups], x.device)
            group_params = [g.w_in for g in groups[:-1]] + [g.w_out for g in groups[:-1]] + [groups[-1].w_in]
            params = (*group_params, groups[-1].w_out, *gate_params)
            fast = progressive_block_inference(x_routes, G, plan, *params)
            out, probs = fast if fast is not None else ProgressiveBlock.apply(x_routes, G, plan, *params)
        else:  # each group module on its route (any expert modules; hooked ones see their own calls)
            inputs = dict.fromkeys(layout.names, x) if fork else dict(zip(layout.names, x.split(M), strict=True))
            pieces = [group(inputs[name]) for group, name in zip(groups, layout.names, strict=True)]
            plan = self._gate_plan(tasks, [p.shape[0] for p in pieces], x.device)
            x_gates = x_routes if G == R else x_routes[:G]
            out, probs = ProgressiveMix.apply(x_gates, R, plan, *pieces, *gate_params)
        names = [*tasks, SHARED][:G]
        return out, {name: probs[g].index_select(1, plan.columns[g]) for g, name in enumerate(names)}

    @staticmethod
    def _groupable(groups: list[nn.Module], gates: list[nn.Module]) -> bool:
        """Whether the fused ple layer applies to this block.

        The fused ple layer applies: plain SwiGLU groups (task groups of one shape) and no hook on any group or
        gate (diagnostics hook them to watch each call: they get the per-group path, equal up to float rounding)."""
        if not all(type(g) is ExpertGroup for g in groups) or len({g.w_in.shape for g in groups[:-1]}) > 1:
            return False
        watched = (m for m in (*groups, *gates) if m._forward_hooks or m._forward_pre_hooks)
        global_hooks = nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
        return not global_hooks and next(watched, None) is None

    def _gate_plan(self, tasks: list[str], group_sizes: list[int], device: torch.device) -> GatePlan:
        key = (tuple(tasks), tuple(group_sizes), self.shared_gate is not None, str(device))
        plan = self._plans.get(key)
        if plan is None:
            E = sum(group_sizes)
            starts = [sum(group_sizes[:i]) for i in range(len(group_sizes))]
            shared = list(range(starts[-1], E))
            columns = [list(range(starts[k], starts[k] + group_sizes[k])) + shared for k in range(len(tasks))]
            if self.shared_gate is not None:
                columns.append(list(range(E)))
            rows = [g * E + c for g, cols in enumerate(columns) for c in cols]
            plan = GatePlan(
                [len(c) for c in columns],
                torch.tensor(rows, device=device),
                [torch.tensor(c, device=device) for c in columns],
                E,
            )
            self._plans[key] = plan
        return plan

    def route_plan(self, layout: RouteLayout, fork: bool = False) -> list[GateRoute]:
        """The routing plan of ``forward``, route by route.

        What ``forward(x, layout, fork)`` computes, route by route in its output order: each gate, the rows of x
        it reads and the expert groups it mixes (ple: the routes' packed spans align row by row, and the shared gate
        mixes every task's experts on their own routes; at a fork every route reads the bottom's tokens, x's rows)."""
        n_in = len(layout.bottom.token_index) if fork else len(layout.token_index)
        everyone = torch.arange(n_in, device=layout.token_index.device)
        if not self.variant.shared_route:
            plan = []
            for r, name in enumerate(layout.names):
                rows = everyone[layout.reads(r, fork)]
                own = [(self.task_experts[name], rows)] if name in self.task_experts else []
                plan.append(GateRoute(name, rows, self.task_gates[name], [*own, (self.shared, rows)]))
            return plan
        rows = {name: everyone if fork else everyone[layout.tokens(name)] for name in layout.names}
        tasks = [name for name in layout.names if name != SHARED]
        own = {t: (self.task_experts[t], rows[t]) for t in tasks}
        shared = (self.shared, rows[SHARED])
        plan = [GateRoute(t, rows[t], self.task_gates[t], [own[t], shared]) for t in tasks]
        mixed = [*own.values(), shared] if self.shared_gate is not None else []
        return [*plan, GateRoute(SHARED, rows[SHARED], self.shared_gate, mixed)]

    def expert_names(self, gate: str, tasks: list[str]) -> list[str]:
        """The experts a gate mixes, in its weight order."""
        shared = [f"{SHARED}/{i}" for i in range(self.shared.n_experts)]
        if gate == SHARED:
            return [f"{t}/{i}" for t in tasks for i in range(self.task_experts[t].n_experts)] + shared
        own = [f"{gate}/{i}" for i in range(self.task_experts[gate].n_experts)] if gate in self.task_experts else []
        return own + shared
