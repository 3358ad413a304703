"""SmoothQuant W8A8 (inference/smoothquant.py), each part against an independent reference: the scales against
the paper's formula in a float64 loop, folding against the unfolded trunk in float64, calibration against each
text run alone, the int8 Linear against fake quantisation in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_testkit import tiny_checkpoint
from torch import nn
from transformers import AutoModel

from mtl_decoder.errors import UserError
from mtl_decoder.inference.smoothquant import (
    GROUPS,
    Int8Linear,
    SmoothQuantSettings,
    calibrate,
    fold_scales,
    integer_products,
    load_scales,
    quantize_blocks,
    save_scales,
    smoothing_scales,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("sq") / "llama")  # 4 query heads over 2 key-value heads


def base(checkpoint, dtype=torch.float32) -> nn.Module:
    return AutoModel.from_pretrained(str(checkpoint), torch_dtype=dtype).eval()


def batch(lengths: list[int], vocab: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return ids, mask


def random_scales(model: nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = model.config
    widths = {"attn_in": c.hidden_size, "mlp_in": c.hidden_size, "down_in": c.intermediate_size,
              "o_in": c.num_key_value_heads * c.hidden_size // c.num_attention_heads}  # fmt: skip
    return {f"{i}.{grp}": torch.rand(widths[grp], generator=g, dtype=torch.float64) * 4 + 0.1
            for i in range(c.num_hidden_layers) for grp in GROUPS}  # fmt: skip


def test_folding_any_positive_scales_keeps_the_float_function(checkpoint):
    ref, smoothed = base(checkpoint, torch.float64), base(checkpoint, torch.float64)
    fold_scales(smoothed, random_scales(smoothed))
    ids, mask = batch([7, 4, 9])
    want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    got = smoothed(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.equal(ref.layers[0].mlp.down_proj.weight, smoothed.layers[0].mlp.down_proj.weight)
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-10, atol=1e-10)


def test_scales_follow_the_formula_with_query_heads_sharing_a_kv_scale(checkpoint):
    model = base(checkpoint)
    c = model.config
    g = torch.Generator().manual_seed(3)
    amax = {k: v.float() for k, v in random_scales(model, seed=4).items()}
    d = c.hidden_size // c.num_attention_heads
    for i in range(c.num_hidden_layers):
        amax[f"{i}.o_in"] = torch.rand(c.hidden_size, generator=g) * 3 + 0.01  # per query channel
    settings = SmoothQuantSettings(alpha=0.7, down_alpha=0.3)
    scales = smoothing_scales(model, amax, settings)
    block = model.layers[1]
    attn = block.self_attn

    def expected(x, weights, a):
        w = np.concatenate([w.detach().double().numpy() for w in weights], axis=0)
        return np.array([x[j] ** a / np.abs(w[:, j]).max() ** (1 - a) for j in range(w.shape[1])])

    x = amax["1.attn_in"].double().numpy()
    want = expected(x, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], 0.7)
    np.testing.assert_allclose(scales["1.attn_in"].double().numpy(), want, rtol=1e-5)
    x = amax["1.down_in"].double().numpy()
    np.testing.assert_allclose(scales["1.down_in"].numpy(), expected(x, [block.mlp.down_proj.weight], 0.3), rtol=1e-5)
    per_query = expected(amax["1.o_in"].double().numpy(), [attn.o_proj.weight], 0.7)  # (heads * d,)
    group = c.num_attention_heads // c.num_key_value_heads
    for kv in range(c.num_key_value_heads):
        for j in range(d):
            heads = [kv * group + h for h in range(group)]
            assert scales["1.o_in"][kv * d + j].item() == pytest.approx(max(per_query[h * d + j] for h in heads), 1e-5)


def test_calibration_reads_only_real_tokens(checkpoint):
    model = base(checkpoint)
    lengths = [3, 8, 5]
    ids, mask = batch(lengths)
    padded = calibrate(model, [(ids, mask)])
    alone = calibrate(model, [(ids[i : i + 1, :n], mask[i : i + 1, :n]) for i, n in enumerate(lengths)])
    assert padded.keys() == alone.keys() == {f"{i}.{g}" for i in range(2) for g in GROUPS}
    for key in padded:
        torch.testing.assert_close(padded[key], alone[key], rtol=1e-5, atol=1e-6)


def fake_quant_per_token(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """float64: symmetric int8 per row of x and per output channel of the weight, then the exact integer sums."""
    x, w = x.double(), linear.weight.detach().double()
    sx = x.abs().amax(1, keepdim=True) / 127
    sw = w.abs().amax(1, keepdim=True) / 127
    qx, qw = torch.round(x / sx), torch.round(w / sw)
    return (qx @ qw.T) * sx * sw.T + linear.bias.detach().double()


def fake_quant_per_tensor(x: torch.Tensor, linear: nn.Linear, levels: int = 255) -> torch.Tensor:
    """float64: asymmetric uint8 over x's range (0 included; ``levels`` 127: 7 bits), symmetric int8 per output
    channel of the weight."""
    x, w = x.double(), linear.weight.detach().double()
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / levels
    zero = min(max(round(-lo / scale), 0), levels)
    qx = torch.clamp(torch.round(x / scale) + zero, 0, levels) - zero
    sw = (w.abs().amax(1, keepdim=True) / 127).float().double()
    qw = torch.round(w / sw)
    return (qx @ qw.T) * scale * sw.T + linear.bias.detach().double()


def eight_bit_kernel_saturates() -> bool:
    """Whether torch's fused dynamic int8 product, asked for 8-bit activations, saturates on this CPU (without VNNI
    it adds pairs of uint8 x int8 products into int16): 2.0 x 0.5 over 32 channels is 32 exactly in any int8."""
    weight = torch.full((1, 32), 0.5)
    zero = torch.zeros(1, dtype=torch.long)
    qw = torch.quantize_per_channel(weight, torch.full((1,), 0.5 / 127, dtype=torch.double), zero, 0, torch.qint8)
    got = torch.ops.quantized.linear_dynamic(
        torch.full((1, 32), 2.0), torch.ops.quantized.linear_prepack(qw, None), False
    )
    return abs(float(got) - 32.0) > 0.1


@pytest.mark.parametrize("per_token", [True, False])
def test_int8_linear_computes_the_fake_quantised_product(per_token):
    torch.manual_seed(0)
    linear = nn.Linear(48, 40)
    x = torch.randn(2, 9, 48) * torch.linspace(0.1, 6, 48)  # channels of different ranges
    got = Int8Linear(linear, per_token)(x).double().reshape(18, 40)
    if per_token:
        want = fake_quant_per_token(x.reshape(18, 48), linear)
    else:  # 7-bit activations where this CPU's 8-bit kernel saturates, as torch's own dynamic Linear always uses
        want = fake_quant_per_tensor(x.reshape(18, 48), linear, 127 if eight_bit_kernel_saturates() else 255)
    exact = linear(x).double().reshape(18, 40)
    assert (want - exact).abs().max() > 1e-3  # int8 is not the float product: the comparison below has teeth
    err = (got - want).abs().max() / want.abs().max()
    assert err < (1e-6 if per_token else 2e-3), err  # per tensor: the kernel's own rounding of the scale


@pytest.mark.parametrize("per_token", [True, False])
def test_int8_linear_never_saturates(per_token):
    """Activations and weights at the top of their int8 ranges: every product is exact in int8, and the sum is the
    row's length on every CPU (without VNNI, 8-bit activations through torch's fused kernel gave about half)."""
    linear = nn.Linear(256, 3, bias=False)
    with torch.no_grad():
        linear.weight.fill_(1.0)
    got = Int8Linear(linear, per_token)(torch.ones(4, 256))
    torch.testing.assert_close(got, torch.full((4, 3), 256.0), rtol=1e-4, atol=0.0)


@pytest.mark.parametrize("all_per_token", [False, True])
def test_quantised_blocks_stay_close_and_every_linear_is_int8(checkpoint, all_per_token):
    ref, model = base(checkpoint), base(checkpoint)
    ids, mask = batch([6, 9, 4, 8], seed=5)
    settings = SmoothQuantSettings(all_per_token=all_per_token)
    scales = smoothing_scales(model, calibrate(model, [(ids, mask)]), settings)
    names = quantize_blocks(model, scales, settings)
    assert len(names) == 7 * 2
    assert sum(isinstance(m, nn.Linear) for m in model.layers.modules()) == 0
    per_token = {n.rsplit(".", 1)[-1] for n, m in model.layers.named_modules() if getattr(m, "per_token", False)}
    assert per_token == ({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
                         if all_per_token else {"down_proj"})  # fmt: skip
    want = ref(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    got = model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    rel = ((got - want).norm(dim=-1) / want.norm(dim=-1)).median()
    assert 0 < rel < 0.1


def test_stored_scales_round_trip_and_bad_ones_are_refused(checkpoint, tmp_path):
    model = base(checkpoint)
    scales = {k: v.float() for k, v in random_scales(model).items()}
    settings = SmoothQuantSettings(alpha=0.6)
    path = tmp_path / "s.safetensors"
    save_scales(path, scales, settings, {"agreement": {"ner": 1.0}})
    got, got_settings, record = load_scales(path)
    assert got_settings == settings and record == {"agreement": {"ner": 1.0}}
    assert all(torch.equal(got[k], scales[k]) for k in scales)
    scales["0.down_in"][3] = 0.0
    save_scales(path, scales, settings, {})
    with pytest.raises(UserError, match=r"0\.down_in"):
        load_scales(path)
    path.write_bytes(b"not safetensors")
    with pytest.raises(UserError, match=r"s\.safetensors"):
        load_scales(path)
    with pytest.raises(UserError, match="alpha"):
        SmoothQuantSettings(alpha=1.5)


def test_a_block_without_llama_projections_is_refused(checkpoint):
    model = base(checkpoint)
    model.layers[1].mlp.down_proj = nn.Identity()
    with pytest.raises(UserError, match=r"block 1.*down_proj"):
        quantize_blocks(model, random_scales(model), SmoothQuantSettings())


def test_integer_products_are_the_same_by_either_way():
    """The float32 way (CPUs where torch's int8 product is slow) gives torch._int_mm's integer sums exactly."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (24, 576), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (576, 40), generator=g, dtype=torch.int8)
    want = torch._int_mm(q, w)  # int32: the reference
    for fast in (True, False):
        got = integer_products(q, w, fast=fast)
        assert got.dtype == torch.float32 and torch.equal(got, want.float())
    extreme = torch.full((24, 576), 127, dtype=torch.int8)  # every sum 576 x 127 x 127, under 2**24: still exact
    weight = torch.full((576, 40), 127, dtype=torch.int8)
    assert torch.equal(integer_products(extreme, weight, fast=False), torch.full((24, 40), 576.0 * 127 * 127))
