"""The packed, grouped ExpertBlock against a plain loop over tokens and experts written from the DESIGN."""

import pytest
import torch
from model_testkit import perturb

from mtl_decoder.model import SHARED, ExpertBlock, ExpertGroup, RouteLayout

C, H, N_SHARED, N_TASK = 12, 8, 2, 3
TASKS = ["a", "b", "c"]


def expert(group: ExpertGroup, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert e of a group on one token (C,), from the weights' documented layout [expert][gate|up][hidden]."""
    w_in = group.w_in.double()[:, e * 2 * group.hidden : (e + 1) * 2 * group.hidden]  # (C, 2H)
    h = x @ w_in
    gate, up = h[: group.hidden], h[group.hidden :]
    return (gate * torch.sigmoid(gate) * up) @ group.w_out.double()[e]


def softmax_gate(gate, x: torch.Tensor) -> torch.Tensor:
    logits = gate.proj.weight.double() @ x + gate.proj.bias.double()
    e = torch.exp(logits - logits.max())
    return e / e.sum()


def reference(block: ExpertBlock, x: torch.Tensor, layout: RouteLayout) -> tuple[torch.Tensor, dict]:
    """Loop over every route, token and expert. ple: routes hold the same tokens in the same order, so the i-th
    token of route k and the i-th token of the shared route are the same (example, position)."""
    x = x.double()
    y = torch.zeros_like(x)
    gates = {}
    for r, name in enumerate(layout.names):
        start, end = layout.token_bounds[r]
        rows = []
        for m in range(start, end):
            i = m - start
            if block.variant.name == "ple":
                s0 = layout.token_bounds[layout.names.index(SHARED)][0]
                on_shared = x[s0 + i]
                if name == SHARED:
                    if block.shared_gate is None:
                        continue  # last layer: the shared route gets nothing
                    outs = [
                        expert(block.task_experts[t], e, x[layout.token_bounds[layout.names.index(t)][0] + i])
                        for t in layout.names
                        if t != SHARED
                        for e in range(N_TASK)
                    ]
                    gate = block.shared_gate
                else:
                    outs = [expert(block.task_experts[name], e, x[m]) for e in range(N_TASK)]
                    gate = block.task_gates[name]
                outs += [expert(block.shared, e, on_shared) for e in range(N_SHARED)]
            else:
                outs = [expert(block.task_experts[name], e, x[m]) for e in range(N_TASK)] if block.task_experts else []
                outs += [expert(block.shared, e, x[m]) for e in range(N_SHARED)]
                gate = block.task_gates[name]
            w = softmax_gate(gate, x[m])
            assert w.shape[0] == len(outs)
            y[m] = sum(w[e] * outs[e] for e in range(len(outs)))
            rows.append(w)
        if rows:
            gates[name] = torch.stack(rows)
    return y, gates


def build(
    variant: str, shared_gate: bool = True, n_task: int = N_TASK
) -> tuple[ExpertBlock, torch.Tensor, RouteLayout]:
    torch.manual_seed(0)
    block = perturb(ExpertBlock(variant, TASKS, C, N_SHARED, n_task, H, 0.6, shared_gate), seed=3, std=0.3)
    attention_mask = torch.tensor(
        [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool
    )
    B = attention_mask.shape[0]
    everyone = torch.arange(B)
    if variant == "ple":
        routes = {**{t: everyone for t in TASKS}, SHARED: everyone}
    else:  # each task on the examples it is labelled for; "b" on nobody in this batch
        routes = {"a": torch.tensor([0, 2, 3]), "c": torch.tensor([1, 2])}
    layout = RouteLayout.build(routes, attention_mask)
    x = torch.randn(layout.token_index.shape[0], C)
    return block, x, layout


@pytest.mark.parametrize(("variant", "shared_gate"), [("ple", True), ("ple", False), ("cgc", True), ("mmoe", True)])
def test_expert_block_equals_loop_reference(variant, shared_gate):
    block, x, layout = build(variant, shared_gate)
    assert all(p.abs().sum() > 0 for p in block.parameters())  # no zero-initialised weight left
    y, gates = block(x, layout)
    y_ref, gates_ref = reference(block, x, layout)
    assert y.shape == x.shape
    assert y.abs().max() > 1e-2  # not trivially zero
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=1e-5)
    assert gates.keys() == gates_ref.keys()
    for name in gates:
        torch.testing.assert_close(gates[name].double(), gates_ref[name], atol=1e-6, rtol=1e-6)
    if variant == "ple" and not shared_gate:
        assert torch.count_nonzero(y[layout.tokens(SHARED)]) == 0


def test_route_layout_packs_real_tokens_by_route():
    _, x, layout = build("cgc")
    assert layout.names == ["a", "c"]
    assert layout.row_example.tolist() == [0, 2, 3, 1, 2]
    assert layout.row_bounds == [(0, 3), (3, 5)]
    # route a: 4 + 5 + 3 real tokens; route c: 2 + 5
    assert layout.token_bounds == [(0, 12), (12, 19)]
    T = 5
    assert layout.token_index[:4].tolist() == [0, 1, 2, 3]
    assert layout.token_position.tolist() == (layout.token_index % T).tolist()
    assert layout.token_position[12:14].tolist() == [0, 1]
    assert x.shape[0] == 19


@pytest.mark.parametrize("variant", ["ple", "cgc", "mmoe"])
def test_expert_block_gradients_equal_loop_reference(variant):
    block, x, layout = build(variant)
    x = x.requires_grad_()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(4))
    (block(x, layout)[0] * g).sum().backward()
    got = {n: _grad(p) for n, p in block.named_parameters()}
    got_x = x.grad.clone()
    block.zero_grad(set_to_none=True)
    x.grad = None
    (reference(block, x, layout)[0] * g.double()).sum().backward()
    for n, p in block.named_parameters():
        torch.testing.assert_close(got[n], _grad(p), atol=1e-5, rtol=1e-5, msg=n)
    if variant != "ple":  # "b" has no route in this batch: nothing of it may move
        assert all(_grad(p).abs().max() == 0 for p in block.task_gates["b"].parameters())
    torch.testing.assert_close(got_x, x.grad, atol=1e-5, rtol=1e-5)


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return torch.zeros_like(p) if p.grad is None else p.grad.clone()


def build_fork(variant: str) -> tuple[ExpertBlock, torch.Tensor, RouteLayout]:
    """A block at the fork: x holds the shared bottom's tokens (one row per example); cgc/mmoe routes overlap."""
    block, _, _ = build(variant)
    attention_mask = torch.tensor(
        [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool
    )
    everyone = torch.arange(4)
    if variant == "ple":
        routes = {**{t: everyone for t in TASKS}, SHARED: everyone}
    else:  # "a" on every example, "c" on two of them, "b" on none; example 3 only on "a"
        routes = {"a": everyone, "c": torch.tensor([1, 2])}
    layout = RouteLayout.build(routes, attention_mask, fork=True)
    x = torch.randn(int(attention_mask.sum()), C, generator=torch.Generator().manual_seed(5))
    return block, x, layout


def routes_input(x_bottom: torch.Tensor, layout: RouteLayout) -> torch.Tensor:
    """What the routes would hold had each been given a copy of its examples' bottom tokens."""
    return torch.cat([x_bottom[layout.reads(r, fork=True)] for r in range(len(layout.names))])


@pytest.mark.parametrize("variant", ["ple", "cgc", "mmoe"])
def test_fork_equals_the_block_on_copies_of_the_bottom(variant):
    block, x, layout = build_fork(variant)
    assert layout.bottom.names == [SHARED] and layout.bottom.row_example.tolist() == [0, 1, 2, 3]
    if variant != "ple":
        assert layout.bottom_token[0] is None  # "a" holds every bottom token in order: no gather
        # "c": examples 1 and 2, whose tokens sit after example 0's 4 tokens in the bottom
        assert layout.bottom_token[1].tolist() == [4, 5, 6, 7, 8, 9, 10]
    x = x.requires_grad_()
    y, gates = block(x, layout, fork=True)
    y_ref, gates_ref = reference(block, routes_input(x.detach(), layout), layout)
    assert y.shape[0] == layout.token_index.shape[0] and y.abs().max() > 1e-2
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=1e-5)
    for name in gates_ref:
        torch.testing.assert_close(gates[name].double(), gates_ref[name], atol=1e-6, rtol=1e-6)
    # Gradients: the same as the block on copies, summed back onto the bottom's tokens.
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(6))
    (y * g).sum().backward()
    got = {n: _grad(p) for n, p in block.named_parameters()}
    block.zero_grad(set_to_none=True)
    copies = routes_input(x.detach(), layout).requires_grad_()
    (block(copies, layout)[0] * g).sum().backward()
    for n, p in block.named_parameters():
        torch.testing.assert_close(got[n], _grad(p), atol=1e-5, rtol=1e-5, msg=n)
    summed = torch.zeros_like(x).index_add_(0, _bottom_index(layout), copies.grad)
    torch.testing.assert_close(x.grad, summed, atol=1e-5, rtol=1e-5)


def _bottom_index(layout: RouteLayout) -> torch.Tensor:
    n = layout.bottom.token_index.shape[0]
    return torch.cat([torch.arange(n) if i is None else i for i in layout.bottom_token])


@pytest.mark.parametrize("variant", ["ple", "cgc", "mmoe"])
def test_fork_runs_shared_experts_once_per_bottom_token(variant):
    """Counted in calls and tokens: the shared experts see each bottom token once, however many routes read it."""
    block, x, layout = build_fork(variant)
    seen = []
    hook = block.shared.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
    with torch.no_grad():
        block(x, layout, fork=True)
    hook.remove()
    assert seen == [x.shape[0]]


@pytest.mark.parametrize(
    ("shared_gate", "fork", "n_task"),
    [(True, False, N_TASK), (False, False, N_TASK), (True, True, N_TASK), (True, False, N_SHARED)],
)
def test_ple_fused_layer_equals_the_per_group_path(monkeypatch, shared_gate, fork, n_task):
    """A ple layer of plain ExpertGroups runs as one fused function (no group module is called); a hook on a group
    (what diagnostics do) gives the per-group path. Both compute the same outputs and gradients, whether the shared
    group's shape differs from the task groups' (two stacks of up matmuls) or not (one)."""
    if fork:
        block, x, layout = build_fork("ple")
    else:
        block, x, layout = build("ple", shared_gate, n_task)
    calls = []
    original = ExpertGroup.forward
    monkeypatch.setattr(ExpertGroup, "forward", lambda self, x: calls.append(1) or original(self, x))
    g = torch.randn(layout.token_index.shape[0], C, generator=torch.Generator().manual_seed(7))

    def run():
        block.zero_grad(set_to_none=True)
        x_in = x.clone().requires_grad_()
        y, gates = block(x_in, layout, fork=fork)
        (y * g).sum().backward()
        return (
            y.detach(),
            {k: w.detach() for k, w in gates.items()},
            x_in.grad,
            {n: _grad(p) for n, p in block.named_parameters()},
        )

    fused = run()
    assert calls == []  # no group module ran: the fused layer did
    hook = block.shared.register_forward_hook(lambda *_: None)
    per_group = run()
    hook.remove()
    assert len(calls) == len(TASKS) + 1
    torch.testing.assert_close(fused[0], per_group[0], atol=1e-6, rtol=1e-5)
    assert fused[1].keys() == per_group[1].keys() == set(TASKS) | ({SHARED} if shared_gate else set())
    for name in fused[1]:
        torch.testing.assert_close(fused[1][name], per_group[1][name], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fused[2], per_group[2], atol=1e-6, rtol=1e-5)
    for name in fused[3]:
        torch.testing.assert_close(fused[3][name], per_group[3][name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("variant", ["ple", "cgc", "mmoe"])
def test_bf16_autocast_gradients_follow_fp32(variant):
    """Under bf16 autocast the written-out backward passes give float32 parameter gradients close to fp32's."""
    block, x, layout = build(variant)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(8))
    grads = []
    for precision in ("fp32", "bf16"):
        block.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            y, _ = block(x, layout)
        (y.float() * g).sum().backward()
        grads.append({n: _grad(p) for n, p in block.named_parameters()})
    # Measured over 8 seeds of g (ple, cgc, mmoe): the worst element is 0.022-0.043 of its parameter's largest
    # gradient, and all gradients as one vector are 0.0066-0.0069 of its norm off; the bounds are ~1.2x and ~3x those.
    for name, ref in grads[0].items():
        got = grads[1][name]
        assert got.dtype == torch.float32
        assert (got - ref).abs().max() <= 0.05 * ref.abs().max(), name
    ref_all = torch.cat([v.flatten() for v in grads[0].values()])
    got_all = torch.cat([v.flatten() for v in grads[1].values()])
    assert (got_all - ref_all).norm() <= 0.02 * ref_all.norm()
