"""W8A8 of a hybrid model's trained top blocks (inference/smoothquant_top.py) on a tiny trained hybrid run, each part
against an independent reference: folding against the unfolded model, calibration against each text run alone, the
scales against the paper's formula in a float64 loop, the quantised model against float32."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from trunk_runs import trained

from mtl_decoder.inference.options import InferenceOptions
from mtl_decoder.inference.predictor import Predictor
from mtl_decoder.inference.smoothquant import Int8Linear, SmoothQuantSettings
from mtl_decoder.inference.smoothquant_top import (
    TOP,
    calibrate_top,
    fold_top_scales,
    quantize_top,
    top_blocks,
    top_scales,
)
from mtl_decoder.saved import load_model

TEXTS = [["EU", "rejects", "German", "call", "to", "boycott", "lamb"], "Peter lives in Berlin .", ["great", "film"]]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("sq-top"), "hybrid")


def predict(saved, texts=TEXTS) -> list:
    options = InferenceOptions(precision="fp32", workers=1, refine=False)
    return list(Predictor.from_saved(saved, options).predict(texts))


def calibrated(saved, texts=TEXTS) -> dict[str, torch.Tensor]:
    return calibrate_top(saved.model, lambda: predict(saved, texts))


def random_scales(saved, seed: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = top_scales(saved.model, calibrated(saved), SmoothQuantSettings())  # only for the keys and widths
    return {k: torch.rand(v.shape, generator=g) * 4 + 0.1 for k, v in shapes.items()}


def test_the_top_blocks_are_every_expert_copy_of_the_trained_block(run):
    saved = load_model(run.best)
    tops = top_blocks(saved.model)
    assert len(tops) == saved.config.model.trunk.train_top == 1
    m = saved.config.model
    routes = len(saved.model.task_names)
    assert len(tops[0].experts) == routes * m.n_task_experts + m.n_shared_experts


def test_calibration_reads_only_real_tokens_of_every_route(run):
    saved = load_model(run.best)
    together = calibrated(saved)  # one padded batch
    alone = [calibrated(saved, [t]) for t in TEXTS]  # no padding
    tops = top_blocks(saved.model)
    want = {f"{TOP}0.{g}" for g in ("attn_in", "o_in", "mlp_in")} | {
        f"{TOP}0.down_in.{e}" for e in range(len(tops[0].experts))
    }
    assert set(together) == want
    for key, value in together.items():
        assert torch.allclose(value, torch.stack([a[key] for a in alone]).amax(0), rtol=1e-4, atol=1e-6), key


def test_scales_follow_the_formula_over_every_expert_reading_the_input(run):
    saved = load_model(run.best)
    settings = SmoothQuantSettings(alpha=0.7, down_alpha=0.4)
    amax = calibrated(saved)
    scales = top_scales(saved.model, amax, settings)
    t = top_blocks(saved.model)[0]
    x = amax[f"{TOP}0.mlp_in"].double()
    for j in range(x.numel()):  # the paper's formula per channel, every expert's gate and up columns
        w = max(abs(float(e.gate_proj.weight[r, j])) for e in t.experts for r in range(e.gate_proj.out_features))
        w = max(w, max(abs(float(e.up_proj.weight[r, j])) for e in t.experts for r in range(e.up_proj.out_features)))
        want = max(float(x[j]), 1e-5) ** 0.7 / max(w, 1e-5) ** 0.3
        assert abs(float(scales[f"{TOP}0.mlp_in"][j]) - want) <= 1e-5 * want
    for e, expert in enumerate(t.experts):
        down = amax[f"{TOP}0.down_in.{e}"].double().clamp(min=1e-5)
        w = expert.down_proj.weight.double().abs().amax(0).clamp(min=1e-5)
        assert torch.allclose(scales[f"{TOP}0.down_in.{e}"].double(), down**0.4 / w**0.6, rtol=1e-5)


def test_folding_any_positive_scales_keeps_the_model_function(run):
    reference, folded = load_model(run.best), load_model(run.best)
    fold_top_scales(folded.model, random_scales(folded))
    for want, got in zip(predict(reference), predict(folded), strict=True):
        assert got.tags == want.tags and got.labels == want.labels
        for task, probs in want.probs.items():
            assert max(abs(p - got.probs[task][k]) for k, p in probs.items()) < 1e-4


def test_quantised_top_blocks_are_int8_and_stay_close(run):
    reference, saved = load_model(run.best), load_model(run.best)
    settings = SmoothQuantSettings()
    scales = top_scales(saved.model, calibrated(saved), settings)
    names = quantize_top(saved.model, scales, settings)
    t = top_blocks(saved.model)[0]
    assert len(names) == 4 + 3 * len(t.experts)
    left = {n.rsplit(".", 1)[-1] for n, m in saved.model.top.named_modules() if isinstance(m, nn.Linear)}
    assert left == {"proj"}  # only the gates stay float32
    assert all(isinstance(getattr(e, n), Int8Linear) for e in t.experts for n in ("gate_proj", "up_proj", "down_proj"))
    want, got = predict(reference), predict(saved)
    diffs = [abs(p - g.probs[task][k]) for w, g in zip(want, got, strict=True) for task, probs in w.probs.items()
             for k, p in probs.items()]  # fmt: skip
    assert max(diffs) < 0.05
    with pytest.raises(Exception, match="do not cover the model's top blocks"):
        quantize_top(load_model(run.best).model, {k: v for k, v in scales.items() if "down_in" not in k}, settings)
