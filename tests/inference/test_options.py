"""InferenceOptions: one set of inference settings, checked before any model loads, taken by every inference path
(predict_texts, predict_file and its shards, --stream, evaluate, Predictor.from_saved) as options or as the
keywords they always took, with each default and each list of choices stated once."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

import mtl_decoder.inference.loading as loading_module
import mtl_decoder.inference.options as options_module
from mtl_decoder.cli import build_parser, main
from mtl_decoder.errors import UserError
from mtl_decoder.evaluation.evaluate import evaluate
from mtl_decoder.inference import PRECISIONS, InferenceOptions, Predictor
from mtl_decoder.inference.options import BATCH_SIZE, PRECISION
from mtl_decoder.prediction import predict_file, predict_texts
from mtl_decoder.prediction.stream import stream_file
from mtl_decoder.saved import load_model

TEXTS = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "a good film"]


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(loading_module, "load_model", refuse)


def test_fp16_on_a_cpu_is_refused_before_any_model_loads(best, source, tmp_path, no_loading, capsys):
    cpu = {"precision": "fp16", "device": "cpu"}
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        predict_texts(best, TEXTS, **cpu)
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        predict_file(best, source, tmp_path / "out.jsonl", **cpu)
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        predict_file(best, source, tmp_path / "part.jsonl", shard="0/2", **cpu)
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        evaluate(best, output_dir=tmp_path / "eval", **cpu)
    with pytest.raises(UserError, match="fp16 is for GPUs"):
        stream_file(best, source, tmp_path / "stream.jsonl", options=InferenceOptions(**cpu))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"precision": "fp8"}, "precision must be one of fp32, bf16, fp16, int8, got 'fp8'"),
        ({"workers": 0}, "workers must be at least 1, got 0"),
        ({"max_tokens": -1}, "max_tokens must be 0 \\(no token bound\\)"),
    ],
)
def test_each_setting_is_checked_before_any_model_loads(best, no_loading, settings, message):
    with pytest.raises(UserError, match=message):
        predict_texts(best, TEXTS, **settings)
    with pytest.raises(UserError, match=message):
        InferenceOptions(**settings).checked()
    flagged = message.replace("batch_size", "--batch-size").replace("max_tokens", "--max-tokens")
    with pytest.raises(UserError, match=flagged.replace("workers", "--workers")):
        InferenceOptions(**settings).checked(flags=True)


def test_options_and_keywords_predict_alike_and_not_both(best, source, tmp_path):
    saved = load_model(best)
    options = InferenceOptions(batch_size=2, workers=1, max_tokens=16)
    by_keywords = list(predict_texts(saved, TEXTS, batch_size=2, workers=1, max_tokens=16))
    assert list(predict_texts(saved, TEXTS, options=options)) == by_keywords
    predict_file(saved, source, tmp_path / "a.jsonl", batch_size=2, workers=1, max_tokens=16, progress=False)
    predict_file(saved, source, tmp_path / "b.jsonl", options=options, progress=False)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert [json.loads(line)["predictions"] for line in (tmp_path / "a.jsonl").open()] == by_keywords
    with pytest.raises(UserError, match=r"as options or as keywords, not both \(batch_size\)"):
        list(predict_texts(saved, TEXTS, batch_size=3, options=options))
    predictor = Predictor.from_saved(saved, options)
    assert (predictor.batch_size, predictor.workers, predictor.max_tokens) == (2, 1, 16)
    run_default = Predictor.from_saved(saved)  # keywords: the batch size defaults to the run's evaluation size
    assert run_default.batch_size == saved.config.data.eval_batch_size
    assert Predictor.from_saved(saved, batch_size=5).batch_size == 5


def test_each_default_and_choice_is_stated_once():
    defaults = {f.name: f.default for f in dataclasses.fields(InferenceOptions)}
    assert defaults["batch_size"] == BATCH_SIZE and defaults["precision"] == PRECISION == "fp32"
    for function in (predict_texts, predict_file):
        parameters = inspect.signature(function).parameters
        for name, default in defaults.items():
            assert parameters[name].default == default, (function.__name__, name)
    assert inspect.signature(Predictor.__init__).parameters["batch_size"].default == BATCH_SIZE
    predict = build_parser()._subparsers._group_actions[0].choices["predict"]
    actions = {a.dest: a for a in predict._actions}
    assert actions["batch_size"].default == BATCH_SIZE and actions["precision"].default == PRECISION
    assert actions["precision"].choices == list(PRECISIONS)
    args = predict.parse_args(["--model", "m", "--input", "i", "--output", "o"])
    assert InferenceOptions.from_args(args) == InferenceOptions()


def test_the_cli_refuses_fp16_on_a_cpu_before_loading(best, source, tmp_path, no_loading, capsys, monkeypatch):
    monkeypatch.setattr(options_module, "default_device", lambda: __import__("torch").device("cpu"))
    argv = ["predict", "--model", str(best), "--input", str(source), "--output", str(tmp_path / "o.jsonl")]
    assert main([*argv, "--precision", "fp16"]) == 2
    assert "fp16 is for GPUs" in capsys.readouterr().err
    assert main(["evaluate", "--model", str(best), "--precision", "fp16", "--output", str(tmp_path / "e")]) == 2
    assert "fp16 is for GPUs" in capsys.readouterr().err
