"""``export --format onnx``: the exported folder, its parity report, and the exports it refuses (a graph that
disagrees with the torch model, an output folder in the way, missing optional packages)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.export import MARKER
from mtl_decoder.export_onnx import MAX_PROB_DIFF, export_onnx
from mtl_decoder.inference import onnx_engine
from mtl_decoder.inference.onnx_engine import ONNX_FILE, ONNX_INFO
from mtl_decoder.saved import load_model


def test_export_writes_the_model_and_its_graph_with_the_parity(onnx_export):
    model_dir, exported, printed = onnx_export
    own = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    assert sorted(p.name for p in exported.iterdir()) == sorted([*own, ONNX_FILE, ONNX_INFO, MARKER])
    for name in own:  # the saved model's files, unchanged: the folder loads as the same model
        assert (exported / name).read_bytes() == (model_dir / name).read_bytes()
    info = json.loads((exported / ONNX_INFO).read_text())
    parity = {p["task"]: p for p in info["parity"]["tasks"]}
    fixtures = Path(__file__).parent / "fixtures"
    n_validation = sum(len((fixtures / f"{s}_validation.jsonl").read_text().splitlines()) for s in ("ner", "sentiment"))
    assert set(parity) == {"ner", "sentiment"}
    for task, p in parity.items():
        assert p["texts"] == n_validation and p["identical"] == 1.0
        assert 0 <= p["max_prob_diff"] < MAX_PROB_DIFF
        assert f"parity {task}: 100.00% of {n_validation} texts identical" in printed


def test_export_into_an_unrelated_folder_is_refused(onnx_export, tmp_path, capsys):
    model_dir, _, _ = onnx_export
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    code = main(["export", "--format", "onnx", "--model", str(model_dir), "--output", str(target)])
    assert code == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


def test_force_replaces_an_earlier_export(onnx_export, tmp_path, monkeypatch):
    model_dir, exported, _ = onnx_export
    monkeypatch.setattr(  # the graph exported once already: only the replacement is under test
        "mtl_decoder.export_onnx.write_graph", lambda saved, path: shutil.copy(exported / ONNX_FILE, path)
    )
    target = tmp_path / "again"
    args = ["export", "--format", "onnx", "--model", str(model_dir), "--output", str(target)]
    assert main(args) == 0
    (target / ONNX_INFO).write_text("{}")  # an edit the replacement must undo
    assert main(args) == 2  # not without --force
    assert main([*args, "--force"]) == 0
    assert json.loads((target / ONNX_INFO).read_text())["parity"]["tasks"]


def test_a_graph_that_disagrees_is_refused_with_the_numbers(onnx_export, tmp_path, monkeypatch):
    model_dir, exported, _ = onnx_export
    monkeypatch.setattr(  # the graph exported once already, so that only the parity check runs again
        "mtl_decoder.export_onnx.write_graph", lambda saved, path: shutil.copy(exported / ONNX_FILE, path)
    )
    clean = onnx_engine.OnnxForward.__call__

    def noisy(self, *args, **kwargs):
        out = clean(self, *args, **kwargs)
        out.logits = {t: v + 0.05 * (v.new_tensor(range(v.shape[-1])) - 1) for t, v in out.logits.items()}
        return out

    monkeypatch.setattr(onnx_engine.OnnxForward, "__call__", noisy)
    output = tmp_path / "refused"
    with pytest.raises(UserError) as err:
        export_onnx(model_dir, output)
    message = str(err.value)
    assert "disagrees with the torch model" in message and "nothing written" in message
    assert "sentiment:" in message and "max probability diff" in message and "needed: at least 99% identical" in message
    diffs = [float(part.split("max probability diff ")[1].split(";")[0].split(" ")[0]) for part in message.split("; ")
             if "max probability diff" in part]  # fmt: skip
    assert diffs and all(d > MAX_PROB_DIFF for d in diffs)
    assert not output.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_export_names_the_extra_when_onnx_is_missing(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import fails as if it were not installed
    with pytest.raises(UserError, match=r"export --format onnx needs the optional package onnxscript: .*\[onnx\]"):
        export_onnx(tiny_run / "best", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_pretrained_trunk_is_refused_before_it_is_loaded(tiny_run, tmp_path):
    model_dir = tmp_path / "pretrained"
    shutil.copytree(tiny_run / "best", model_dir)
    (model_dir / "trunk.json").write_text("not even read")
    with pytest.raises(UserError, match=r"supports native models .*this model has a pretrained trunk"):
        export_onnx(model_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_exported_folder_is_the_same_model(onnx_export):
    model_dir, exported, _ = onnx_export
    a, b = load_model(model_dir, device="cpu"), load_model(exported, device="cpu")
    assert a.label_sets == b.label_sets
    for (name, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert p.equal(q), name
