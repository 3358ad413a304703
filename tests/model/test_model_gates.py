"""The gate-and-mix reference (model/gates.py) against formulas written out here, and every fast path of the expert
block (GateMix, the fork's single linear layer, ProgressiveMix, ProgressiveBlock) against the reference, in float64
(the gates themselves run in float32 by rule)."""

import pytest
import torch

from mtl_decoder.model import SHARED, ExpertBlock, RouteLayout
from mtl_decoder.model.gates import gate_weights, mix_experts, reference_forward
from mtl_decoder.model.kernels import GateMix

C, H, N_SHARED, N_TASK = 6, 4, 2, 3
TASKS = ["a", "b", "c"]


def test_gate_weights_are_the_float32_softmax_of_a_linear_layer():
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in ((5, C), (4, C), (4,)))
    logits = x @ weight.T + bias
    expected = logits.exp() / logits.exp().sum(-1, keepdim=True)
    got = gate_weights(x, weight, bias)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float32 under autocast too
        assert gate_weights(x.bfloat16(), weight.float(), bias.float()).dtype == torch.float32
    # several gates on the same tokens: each its own softmax
    weights, biases = torch.randn(3, 4, C, generator=gen), torch.randn(3, 4, generator=gen)
    stacked = gate_weights(x, weights, biases)
    assert stacked.shape == (5, 3, 4)
    for g in range(3):
        torch.testing.assert_close(stacked[:, g], gate_weights(x, weights[g], biases[g]), atol=1e-7, rtol=1e-6)


def test_mix_experts_is_the_weighted_sum_of_the_expert_outputs():
    gen = torch.Generator().manual_seed(1)
    weights = torch.rand(5, 4, generator=gen, dtype=torch.float64)
    outputs = torch.randn(4, 5, C, generator=gen, dtype=torch.float64)
    expected = torch.stack([sum(weights[m, e] * outputs[e, m] for e in range(4)) for m in range(5)])
    torch.testing.assert_close(mix_experts(weights, outputs), expected, atol=1e-12, rtol=1e-12)


def test_gate_mix_kernel_equals_the_reference_mix_and_its_gradients():
    gen = torch.Generator().manual_seed(2)
    weights = torch.rand(5, 5, generator=gen, dtype=torch.float64).requires_grad_()
    pieces = [torch.randn(n, 5, C, generator=gen, dtype=torch.float64).requires_grad_() for n in (3, 2)]
    g = torch.randn(5, C, generator=gen, dtype=torch.float64)
    fast = GateMix.apply(weights, *pieces)
    fast_grads = torch.autograd.grad((fast * g).sum(), [weights, *pieces])
    ref = mix_experts(weights, torch.cat(pieces))
    ref_grads = torch.autograd.grad((ref * g).sum(), [weights, *pieces])
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=1e-12)
    for got, expected in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


def build(variant: str, shared_gate: bool, fork: bool) -> tuple[ExpertBlock, torch.Tensor, RouteLayout]:
    """A float64 block with every weight random, and a layout of four examples (cgc/mmoe: routes that overlap, "b" on
    none); at a fork x holds the shared bottom's tokens."""
    torch.manual_seed(0)
    block = ExpertBlock(variant, TASKS, C, N_SHARED, N_TASK, H, 0.6, shared_gate).double()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    everyone = torch.arange(4)
    if block.variant.shared_route:
        routes = {**{t: everyone for t in TASKS}, SHARED: everyone}
    else:
        routes = {"a": torch.tensor([0, 2, 3]) if not fork else everyone, "c": torch.tensor([1, 2])}
    layout = RouteLayout.build(routes, mask, fork=fork)
    rows = layout.bottom.token_index if fork else layout.token_index
    return block, torch.randn(len(rows), C, dtype=torch.float64), layout


CASES = [
    ("ple", True, False, False),
    ("ple", False, False, False),
    ("ple", True, True, False),
    ("ple", True, False, True),  # a hooked group: the per-group path (ProgressiveMix)
    ("ple", False, True, True),
    ("cgc", True, False, False),
    ("cgc", True, True, False),  # the fork: every gate as one linear layer, the shared mix as one product
    ("mmoe", True, False, False),
    ("mmoe", True, True, False),
    ("cgc_stacked", True, True, False),
]


@pytest.mark.parametrize(("variant", "shared_gate", "fork", "hooked"), CASES)
def test_expert_block_equals_the_reference_forward_and_its_gradients(variant, shared_gate, fork, hooked):
    block, x, layout = build(variant, shared_gate, fork)
    if hooked:
        block.shared.register_forward_hook(lambda *_: None)
    g = torch.randn(len(layout.token_index), C, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    results = []
    for forward in (block, lambda *a: reference_forward(block, *a)):
        block.zero_grad(set_to_none=True)
        x_in = x.clone().requires_grad_()
        out, gates = forward(x_in, layout, fork)
        (out * g).sum().backward()
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in block.named_parameters()}
        results.append((out.detach(), {k: w.detach() for k, w in gates.items()}, x_in.grad, grads))
    (out, gates, dx, grads), (ref, ref_gates, ref_dx, ref_grads) = results
    assert out.dtype == torch.float64 and out.abs().max() > 1e-2
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert gates.keys() == ref_gates.keys()
    for name in gates:
        torch.testing.assert_close(gates[name], ref_gates[name], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dx, ref_dx, atol=1e-6, rtol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-6, rtol=1e-6, msg=name)


def test_route_plan_names_each_gate_its_rows_and_experts():
    block, _, layout = build("ple", False, False)
    plan = block.route_plan(layout)
    assert [r.name for r in plan] == [*TASKS, SHARED]
    assert plan[-1].gate is None and plan[-1].groups == []  # ple's last layer: nothing reads the shared route
    a = plan[0]
    assert a.gate is block.task_gates["a"] and [g for g, _ in a.groups] == [block.task_experts["a"], block.shared]
    assert a.rows.tolist() == list(range(*layout.token_bounds[0]))
    assert a.groups[1][1].tolist() == list(range(*layout.token_bounds[-1]))  # the shared route's tokens
    assert len(a.columns()) == N_TASK + N_SHARED
    block, _, layout = build("cgc", True, True)
    c = block.route_plan(layout, fork=True)[1]
    assert c.name == "c" and c.rows.tolist() == layout.bottom_token[1].tolist()
