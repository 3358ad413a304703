"""``predict`` and ``evaluate --engine onnx`` against ``--engine torch`` on the same exported folder: the same files
with the same keys, tags and labels, probabilities within 1e-4, the same task metrics; and the runs it refuses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.inference.onnx_engine import ONNX_INFO
from mtl_decoder.prediction import predict_texts

FIXTURES = Path(__file__).parent.parent / "fixtures"
TOLERANCE = 1e-4


def _same(a, b, path: str = "") -> None:
    """Equal structure, keys and strings; numbers within TOLERANCE."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), path
        for key in a:
            _same(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for x, y in zip(a, b, strict=True):
            _same(x, y, path)
    elif isinstance(a, float):
        assert b == pytest.approx(a, abs=TOLERANCE), path
    else:
        assert a == b, path


def _inputs(tmp_path: Path) -> dict[str, Path]:
    records = [json.loads(line) for line in (FIXTURES / "ner_test.jsonl").read_text().splitlines()]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"tokens": r["tokens"]}) + "\n" for r in records))
    text = tmp_path / "in.txt"  # one line far past max_length 48: tagged in windows, classification truncated
    lines = [" ".join(r["tokens"]) for r in records] + [" ".join(w for r in records for w in r["tokens"])]
    text.write_text("".join(line + "\n" for line in lines))
    return {"jsonl": jsonl, "txt": text}


@pytest.mark.parametrize("kind", ["jsonl", "txt"])
def test_predict_with_onnx_writes_what_torch_writes(onnx_export, tmp_path, kind):
    _, exported, _ = onnx_export
    source = _inputs(tmp_path)[kind]
    outputs = {}
    for engine in ("torch", "onnx"):
        outputs[engine] = tmp_path / f"{engine}.jsonl"
        args = ["predict", "--model", str(exported), "--input", str(source), "--output", str(outputs[engine])]
        assert main([*args, "--engine", engine, "--batch-size", "4"]) == 0
    torch_lines, onnx_lines = (p.read_text().splitlines() for p in outputs.values())
    assert len(torch_lines) == len(onnx_lines) == len(source.read_text().splitlines())
    for a, b in zip(torch_lines, onnx_lines, strict=True):
        _same(json.loads(a), json.loads(b))
    if kind == "txt":
        assert json.loads(onnx_lines[-1])["predictions"]["ner"]["windows"] > 1


def test_evaluate_with_onnx_gives_the_torch_metrics(onnx_export, tmp_path):
    _, exported, _ = onnx_export
    metrics = {}
    for engine in ("torch", "onnx"):
        out = tmp_path / engine
        assert main(["evaluate", "--model", str(exported), "--engine", engine, "--output", str(out)]) == 0
        metrics[engine] = json.loads((out / "metrics.json").read_text())
    _same(metrics["torch"]["tasks"], metrics["onnx"]["tasks"])
    assert metrics["onnx"]["experts"]  # the gates come out of the graph too
    _same(metrics["torch"]["experts"], metrics["onnx"]["experts"])


def test_predict_texts_takes_the_engine(onnx_export):
    _, exported, _ = onnx_export
    items = ["Peter Blackburn lives in London", ["EU", "rejects", "German", "call"]]
    torch_preds = list(predict_texts(exported, items, device="cpu"))
    onnx_preds = list(predict_texts(exported, items, device="cpu", engine="onnx"))
    _same(torch_preds, onnx_preds)


def test_onnx_engine_refuses_a_folder_without_a_graph(onnx_export):
    model_dir, _, _ = onnx_export
    with pytest.raises(UserError, match=r"no model.onnx and onnx.json \(--engine onnx\): write them with"):
        list(predict_texts(model_dir, ["a text"], device="cpu", engine="onnx"))


def test_onnx_engine_refuses_a_graph_of_other_weights(onnx_export, tmp_path):
    _, exported, _ = onnx_export
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in exported.iterdir():
        copy.joinpath(p.name).write_bytes(p.read_bytes())
    info = json.loads((copy / ONNX_INFO).read_text())
    info["weights_sha256"] = "0" * 64
    (copy / ONNX_INFO).write_text(json.dumps(info))
    with pytest.raises(UserError, match=r"made from other weights.*export the model again"):
        list(predict_texts(copy, ["a text"], device="cpu", engine="onnx"))


def test_onnx_engine_refuses_other_precisions_and_engines(onnx_export):
    _, exported, _ = onnx_export
    with pytest.raises(UserError, match="--engine onnx runs the exported fp32 graph"):
        list(predict_texts(exported, ["a text"], device="cpu", engine="onnx", precision="bf16"))
    with pytest.raises(UserError, match="engine must be one of torch, onnx"):
        list(predict_texts(exported, ["a text"], device="cpu", engine="tensorrt"))


def test_onnx_engine_names_the_extra_when_onnxruntime_is_missing(onnx_export, monkeypatch):
    _, exported, _ = onnx_export
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(UserError, match=r"--engine onnx needs the optional package onnxruntime: pip install"):
        list(predict_texts(exported, ["a text"], device="cpu", engine="onnx"))


def test_stream_has_no_onnx_engine(onnx_export, tmp_path, capsys):
    _, exported, _ = onnx_export
    source = _inputs(tmp_path)["txt"]
    args = ["predict", "--model", str(exported), "--input", str(source), "--output", str(tmp_path / "o.jsonl")]
    code = main([*args, "--stream", "--engine", "onnx"])
    assert code == 2 and "--engine" in capsys.readouterr().err
