"""``mtl-decoder quantize`` end to end on tiny pretrained-trunk runs: the scales stored and listed in the manifest,
``--precision int8`` then W8A8 over every Linear of the cached blocks, a native model and a failed check refused."""

from __future__ import annotations

import json

import pytest
import torch
from trunk_runs import trained

from mtl_decoder.cli import main
from mtl_decoder.hashing import sha256_file
from mtl_decoder.inference.predictor import Predictor
from mtl_decoder.inference.smoothquant import SCALES_FILE, Int8Linear, load_scales
from mtl_decoder.inference.smoothquant_top import TOP, top_blocks
from mtl_decoder.prediction import predict_texts
from mtl_decoder.quantize import _below
from mtl_decoder.saved import MANIFEST_FILE, load_model

TEXTS = [["EU", "rejects", "German", "call"], "Peter lives in Berlin .", ["the", "film", "was", "great"]]


@pytest.fixture(scope="module", params=["frozen", "hybrid"])
def run(request, tmp_path_factory):
    return trained(tmp_path_factory.mktemp(f"quantize-{request.param}"), request.param)


def test_quantize_stores_checked_scales_that_int8_then_uses(run, capsys):
    best = run.best
    fp32 = list(predict_texts(best, TEXTS))
    code = main(["quantize", "--model", str(best), "--calibration-texts", "8", "--min-tags", "0", "--min-labels", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert f"wrote {best / SCALES_FILE}" in out and "identical to float32 on" in out
    manifest = json.loads((best / MANIFEST_FILE).read_text())
    assert manifest[SCALES_FILE]["sha256"] == sha256_file(best / SCALES_FILE)
    scales, settings, record = load_scales(best / SCALES_FILE)
    assert set(record["agreement"]) == set(run.model.task_names) and record["calibration_texts"] == 8
    assert settings.all_per_token and settings.alpha == 0.8  # the defaults, per token everywhere (docs/pretrained.md)
    saved = load_model(best)  # the manifest still checks out
    blocks = len(saved.model.trunk_kind.cached_states().base.layers)
    cached = {f"{i}.{g}" for i in range(blocks) for g in ("attn_in", "o_in", "mlp_in", "down_in")}
    assert {k for k in scales if not k.startswith(TOP)} == cached
    tops = top_blocks(saved.model)  # a hybrid's trained block: its attention and every expert's down_proj input
    assert len(tops) == (run.model.cfg.trunk.train_top if run.model.cfg.trunk.mode == "hybrid" else 0)
    assert record["trained_top_blocks"] == len(tops)
    assert {k for k in scales if k.startswith(TOP)} == {
        *(f"{TOP}{i}.{g}" for i in range(len(tops)) for g in ("attn_in", "o_in", "mlp_in")),
        *(f"{TOP}{i}.down_in.{e}" for i, t in enumerate(tops) for e in range(len(t.experts))),
    }

    again = ["quantize", "--model", str(best), "--calibration-texts", "6", "--alpha", "0.6", "--min-tags", "0",
             "--min-labels", "0"]  # fmt: skip
    assert main(again) == 0  # made again: the file replaced and its manifest entry with it
    assert json.loads((best / MANIFEST_FILE).read_text())[SCALES_FILE]["sha256"] == sha256_file(best / SCALES_FILE)
    assert load_scales(best / SCALES_FILE)[1].alpha == 0.6 and load_model(best) is not None
    assert main([*again, "--per-token", "down_proj"]) == 0  # the per-tensor activations, asked for
    assert not load_scales(best / SCALES_FILE)[1].all_per_token

    int8 = list(predict_texts(best, TEXTS, precision="int8"))
    assert [sorted(p) for p in int8] == [sorted(p) for p in fp32]  # same tasks, same keys
    from mtl_decoder.inference.loading import load_for_inference
    from mtl_decoder.inference.options import InferenceOptions

    saved = load_for_inference(best, InferenceOptions(precision="int8"))
    predictor = Predictor.from_saved(saved, InferenceOptions(precision="int8"))
    states = saved.model.trunk_kind.cached_states()
    kinds = {type(m) for b in states.base.layers for m in b.modules() if isinstance(m, torch.nn.Linear | Int8Linear)}
    assert kinds == {Int8Linear}
    top = getattr(saved.model, "top", None)  # a hybrid's trained block too; only its gates stay float32
    assert top is None or {n.rsplit(".", 1)[-1] for n, m in top.named_modules() if isinstance(m, torch.nn.Linear)} == {
        "proj"
    }
    caches = getattr(states.cache, "caches", {0: states.cache}).values()  # a hybrid's cache is one per block read
    assert all("-w8a8-" in c.directory.name for c in caches) and predictor.precision == "int8"


def test_the_check_names_each_task_under_its_bar(run):
    saved = load_model(run.best)
    tagging = next(t.name for t in saved.model.tasks if t.kind != "sentence_classification")
    agreement = {t: 0.5 for t in saved.model.task_names}
    below = _below(saved, agreement, 0.98, 0.99)
    assert len(below) == len(agreement) and any(f"{tagging}: 50.00% of tag sequences identical, under 98%" == b
                                                for b in below)  # fmt: skip
    assert _below(saved, {t: 1.0 for t in saved.model.task_names}, 0.98, 0.99) == []


def test_a_refused_check_writes_nothing(run, capsys, tmp_path):
    import shutil

    folder = tmp_path / "best"
    shutil.copytree(run.best, folder)
    scales = folder / SCALES_FILE
    kept = scales.read_bytes() if scales.exists() else None  # scales an earlier quantize stored stay as they were
    before = (folder / MANIFEST_FILE).read_text()
    code = main(["quantize", "--model", str(folder), "--calibration-texts", "4", "--min-tags", "1.5",
                 "--min-labels", "1.5"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "nothing written" in err and "under 150%" in err
    assert (scales.read_bytes() if scales.exists() else None) == kept
    assert (folder / MANIFEST_FILE).read_text() == before


def test_a_native_model_is_refused_in_one_line(best, capsys):
    assert main(["quantize", "--model", str(best)]) == 2
    assert "has none" in capsys.readouterr().err


@pytest.mark.parametrize("fast", [True, False])
def test_the_report_says_when_per_token_int8_is_slow_on_this_cpu(fast, tmp_path):
    from mtl_decoder.quantize import QuantizeResult

    record = {"all_per_token": True, "int8_products_fast": fast}
    report = QuantizeResult(tmp_path, {"ner": 0.99}, 10, record).report()
    assert ("no fast int8 x int8 products" in report) is not fast
    quiet = QuantizeResult(tmp_path, {"ner": 0.99}, 10, {"all_per_token": False, "int8_products_fast": False})
    assert "no fast int8" not in quiet.report()  # per tensor: torch's fused kernel, fast on every CPU
