"""exact_matmul's oneDNN products and the ple block's inference path: bit-identical to torch's own products (and
the autograd block), close to a float64 product, and only where inference on CPU float32 allows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_testkit import perturb

from mtl_decoder.model import SHARED, ExpertBlock, RouteLayout, exact_matmul
from mtl_decoder.model import experts as experts_module
from mtl_decoder.model.gates import reference_forward

needs_onednn = pytest.mark.skipif(exact_matmul._OP is None, reason="this torch has no oneDNN linear operator")


@needs_onednn
@pytest.mark.parametrize(("K", "N"), [(8, 24), (32, 96), (128, 64), (200, 32), (256, 40)])
@pytest.mark.parametrize("rows", [1, 3, 16, 45, 300])
def test_linear_equals_torch_bit_for_bit_and_float64_closely(K, N, rows):
    g = torch.Generator().manual_seed(K + N + rows)
    x, w = torch.randn(rows, K, generator=g), torch.randn(N, K, generator=g)
    with torch.inference_mode():
        got = exact_matmul.linear(x, w)
        assert torch.equal(got, F.linear(x, w))
        assert torch.equal(exact_matmul.linear(x.view(1, rows, K), w)[0], got)  # a 3-d input: the same rows
    torch.testing.assert_close(got.double(), x.double() @ w.double().t(), atol=1e-4 * K**0.5, rtol=1e-5)


@needs_onednn
def test_a_long_inner_dimension_is_cut_where_torch_cuts_it():
    """MKL adds 128-wide blocks' products: one oneDNN chain over all 256 differs from it, the cut one does not."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(500, 256, generator=g), torch.randn(128, 256, generator=g)
    block = exact_matmul.block_of(256, 128)
    if block is None:  # machines differ: where no cut reproduces MKL the fast path is off, and nothing is to check
        pytest.skip("on this CPU no cut of oneDNN's product reproduces torch's: the fast path runs torch's")
    assert 256 % block == 0
    with torch.inference_mode():
        assert torch.equal(exact_matmul._onednn(x, w, block), F.linear(x, w))


@needs_onednn
def test_fast_path_only_for_cpu_float32_inference(monkeypatch):
    x = torch.randn(20, 8)
    assert not exact_matmul.active(x)  # grad mode: training runs torch's products
    with torch.inference_mode():
        assert exact_matmul.active(x)
        assert not exact_matmul.active(x.double())
        with exact_matmul.disabled():
            assert not exact_matmul.active(x)
        assert exact_matmul.active(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not exact_matmul.active(x)
    monkeypatch.setattr(exact_matmul, "_OP", None)
    with torch.inference_mode():
        assert not exact_matmul.active(x)
        w = torch.randn(4, 8)
        assert torch.equal(exact_matmul.linear(x, w), F.linear(x, w))


def test_module_linear_calls_a_biased_or_hooked_module_itself():
    module = torch.nn.Linear(8, 4, bias=True)
    x = torch.randn(20, 8)
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    with torch.inference_mode():
        assert torch.equal(exact_matmul.module_linear(module, x), module(x))
    assert len(calls) == 2


TASKS = ["a", "b"]


def ple_block(shared_gate: bool, hidden: int) -> tuple[ExpertBlock, torch.Tensor, RouteLayout]:
    """A ple block (d_model 32; 2 tasks of 1 expert, 2 shared) and its routes over 7 examples (30 tokens)."""
    torch.manual_seed(0)
    block = perturb(ExpertBlock("ple", TASKS, 32, 2, 1, hidden, 0.6, shared_gate), seed=3, std=0.3)
    lengths = torch.tensor([5, 2, 6, 3, 6, 4, 4])
    attention_mask = torch.arange(6) < lengths[:, None]
    everyone = torch.arange(len(lengths))
    layout = RouteLayout.build({**{t: everyone for t in TASKS}, SHARED: everyone}, attention_mask, fork=True)
    return block, attention_mask, layout


@pytest.mark.parametrize("fork", [True, False])
@pytest.mark.parametrize("shared_gate", [True, False])
@pytest.mark.parametrize("hidden", [16, 200, 256])  # 200, 256: MKL cuts the down product's inner width
def test_ple_block_inference_equals_the_autograd_block_bit_for_bit(monkeypatch, fork, shared_gate, hidden):
    block, attention_mask, layout = ple_block(shared_gate, hidden)
    n = int(attention_mask.sum())
    x = torch.randn(n if fork else n * len(layout.names), 32, generator=torch.Generator().manual_seed(1))
    ran = []
    real = experts_module.progressive_block_inference
    monkeypatch.setattr(experts_module, "progressive_block_inference", lambda *a: ran.append(out := real(*a)) or out)
    with torch.inference_mode():
        y, gates = block(x, layout, fork=fork)
        with exact_matmul.disabled():
            y_ref, gates_ref = block(x, layout, fork=fork)
    assert len(ran) == 2 and ran[1] is None  # the second call: disabled, the autograd block ran
    products = [(32, 2 * hidden), (32, 4 * hidden), (hidden, 32)] + ([(32, 8 * hidden)] if fork else [])
    if exact_matmul._OP is not None and all(exact_matmul.block_of(k, n) for k, n in products):
        assert ran[0] is not None  # the fast path ran
    assert torch.equal(y, y_ref)
    assert gates.keys() == gates_ref.keys() and all(torch.equal(gates[k], gates_ref[k]) for k in gates)
    y64, _ = reference_forward(block.double(), x.double(), layout, fork=fork)
    torch.testing.assert_close(y.double(), y64, atol=1e-5, rtol=1e-5)
    assert y.abs().max() > 1e-2
