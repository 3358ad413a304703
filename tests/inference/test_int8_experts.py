"""``--precision int8`` on a native model's SwiGLU expert groups (inference/quantize.py ``Int8ExpertGroup``): the
int8 product a float64 fake quantisation computes, every group of a model replaced, and predictions kept."""

from __future__ import annotations

import pytest
import torch

from mtl_decoder.inference.quantize import Int8ExpertGroup, quantize_int8
from mtl_decoder.inference.smoothquant import full_range_is_exact
from mtl_decoder.model.experts import ExpertGroup
from mtl_decoder.prediction import predict_texts
from mtl_decoder.saved import load_model

TEXTS = [["EU", "rejects", "German", "call"], "Peter lives in Berlin .", ["the", "film", "was", "great"]]


def fake_int8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float64: x (M, K) asymmetric unsigned over its range with 0 (8 bits, 7 where the CPU's kernel would saturate),
    w (K, N) symmetric int8 per output column; the integer sums rescaled."""
    x, w = x.double(), w.double()
    levels = 255 if full_range_is_exact() else 127
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / levels
    zero = min(max(round(-lo / scale), 0), levels)
    qx = torch.clamp(torch.round(x / scale) + zero, 0, levels) - zero
    sw = (w.abs().amax(0, keepdim=True) / 127).float().double()  # the weight scales are stored in float32
    return (qx @ torch.round(w / sw)) * scale * sw


def test_an_int8_group_computes_the_fake_quantised_swiglu_experts():
    torch.manual_seed(0)
    group = ExpertGroup(3, 16, 8)
    with torch.no_grad():
        group.w_out.normal_(0, 0.3)  # ExpertGroup starts its down weights at zero
    x = torch.randn(40, 16) * torch.linspace(0.2, 3, 16)
    got = Int8ExpertGroup(group)(x).double()  # (E, M, C)
    h = fake_int8(x, group.w_in.detach()).view(40, 3, 2, 8)
    a = torch.nn.functional.silu(h[:, :, 0]) * h[:, :, 1]  # (M, E, H): float64, from the int8 up product
    want = torch.stack([fake_int8(a[:, e].float(), group.w_out[e].detach()) for e in range(3)])
    exact = group(x).detach().double()
    assert got.shape == exact.shape == (3, 40, 16)
    scale = want.abs().max()
    assert (exact - want).abs().max() / scale > 8e-3  # the float product is far from int8's: the bound has teeth
    assert (got - want).abs().max() / scale < 2e-3  # the kernel's own rounding of the activation scale


def test_no_token_gives_an_empty_output():
    group = Int8ExpertGroup(ExpertGroup(2, 8, 4))
    assert group(torch.zeros(0, 8)).shape == (2, 0, 8)


def test_int8_replaces_every_expert_group_and_keeps_the_predictions(best):
    saved = load_model(best)
    before = [n for n, m in saved.model.named_modules() if type(m) is ExpertGroup]
    assert before  # the tiny run is a ple model: its layers hold SwiGLU expert groups
    names = quantize_int8(saved.model)
    after = dict(saved.model.named_modules())
    assert all(type(after[n]) is Int8ExpertGroup for n in before) and set(before) <= set(names)
    assert not any(type(m) is ExpertGroup for m in saved.model.modules())

    fp32 = list(predict_texts(best, TEXTS))
    int8 = list(predict_texts(best, TEXTS, precision="int8"))
    for a, b in zip(fp32, int8, strict=True):
        assert a.keys() == b.keys()
        for task in a:
            if "probs" in a[task]:
                for label, p in a[task]["probs"].items():
                    assert b[task]["probs"][label] == pytest.approx(p, abs=0.05)
            else:
                assert len(b[task]["tags"]) == len(a[task]["tags"])
