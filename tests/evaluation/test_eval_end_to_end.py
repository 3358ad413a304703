"""``evaluate`` and ``mtl-decoder evaluate`` on the session's tiny trained run: agreement with training-time
validation and with a recomputation from predictions, the metrics.json schema, the report, the plots and
the CLI's exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtl_decoder.cli import main
from mtl_decoder.data.tasks import load_split
from mtl_decoder.evaluation.evaluate import EvalResult, evaluate
from mtl_decoder.evaluation.utilisation import NO_GATES_NOTE
from mtl_decoder.inference import Predictor
from mtl_decoder.model import build_model
from mtl_decoder.saved import load_model, save_model

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny forwards on a loaded 2-core machine run ~3x faster single-threaded (no intra-op contention)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def best(tiny_run: Path) -> Path:
    return tiny_run / "best"


@pytest.fixture(scope="module")
def test_eval(best: Path, tmp_path_factory) -> EvalResult:
    return evaluate(best, split="test", output_dir=tmp_path_factory.mktemp("eval") / "test")


def test_validation_split_reproduces_training_validation(best: Path, tmp_path: Path):
    info = json.loads((best / "info.json").read_text())
    result = evaluate(best, split="validation", output_dir=tmp_path / "out")
    assert result.tasks == info["validation"]  # every number, per type and per class, confusion matrix
    assert result.score == pytest.approx(info["score"], abs=1e-12)
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["tasks"] == info["validation"]


def test_metrics_recomputed_from_predictions(best: Path, test_eval: EvalResult):
    from seqeval.metrics import accuracy_score, f1_score
    from sklearn.metrics import accuracy_score as class_accuracy

    pre = load_model(best)
    for source in load_split(pre.config.tasks, "test"):
        (task,) = [t.name for t in source.tasks]
        items = [ex.words if ex.words is not None else ex.text for ex in source.examples]
        preds = list(Predictor.from_saved(pre).predict(items, [task]))
        gold = [ex.labels[task] for ex in source.examples]
        if task == "ner":
            tags = [p.tags["ner"] for p in preds]
            assert test_eval.tasks["ner"]["f1"] == pytest.approx(f1_score(gold, tags), abs=1e-12)
            assert test_eval.tasks["ner"]["token_accuracy"] == pytest.approx(accuracy_score(gold, tags), abs=1e-12)
        else:
            labels = [p.labels[task] for p in preds]
            assert test_eval.tasks[task]["accuracy"] == pytest.approx(class_accuracy(gold, labels), abs=1e-12)


def test_metrics_json_schema(test_eval: EvalResult):
    m = json.loads((test_eval.output_dir / "metrics.json").read_text())
    assert m == test_eval.metrics
    assert set(m) == {"model", "split", "data", "summary", "tasks", "experts", "settings", "notes"}
    assert m["split"] == "test" and m["notes"] == []
    assert set(m["summary"]) == {"selection_score", "primary"}
    assert m["summary"]["primary"]["ner"]["metric"] == "f1"
    assert set(m["tasks"]["ner"]) >= {"precision", "recall", "f1", "f1_strict", "token_accuracy", "support", "per_type"}
    assert set(m["tasks"]["sentiment"]) >= {"accuracy", "macro_f1", "per_class", "confusion_matrix"}
    assert m["data"]["ner"]["examples"] == 20 and m["data"]["ner"]["from_data_flag"] is False
    assert list(m["experts"]) == ["layer_0", "layer_1"]
    assert list(m["experts"]["layer_0"]) == ["ner", "sentiment", "shared"]
    assert list(m["experts"]["layer_1"]) == ["ner", "sentiment"]
    layer0 = m["experts"]["layer_0"]
    assert layer0["shared"]["tokens"] == layer0["ner"]["tokens"] + layer0["sentiment"]["tokens"]
    for gates in m["experts"].values():
        for s in gates.values():
            assert set(s) == {
                "experts",
                "tokens",
                "mean",
                "std",
                "shared_share",
                "normalised_entropy",
                "top1_share",
                "dead_threshold",
                "dead_experts",
                "positions",
            }
            assert sum(s["mean"].values()) == pytest.approx(1.0, abs=1e-6)
            assert sum(s["top1_share"].values()) == pytest.approx(1.0)
            assert 0.0 <= s["normalised_entropy"] <= 1.0 + 1e-9
            assert len(s["positions"]) == len(m["settings"]["position_buckets"]) + 1
            assert sum(b["tokens"] for b in s["positions"]) == s["tokens"]


def test_report_and_plots_are_written(test_eval: EvalResult):
    report = (test_eval.output_dir / "report.md").read_text()
    for heading in ("## Per-task metrics", "## ner: per entity type", "## sentiment: per class", "### layer_1"):
        assert heading in report
    plots = sorted(p.name for p in (test_eval.output_dir / "plots").iterdir())
    assert plots == ["experts_layer_0.png", "experts_layer_1.png", "shared_share_ner.png", "shared_share_sentiment.png"]
    for name in plots:
        data = (test_eval.output_dir / "plots" / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 2000
        assert f"(plots/{name})" in report


def test_data_flag_reads_a_file_with_the_tasks_columns(best: Path, tmp_path: Path, test_eval: EvalResult):
    model = tmp_path / "model"
    shutil.copytree(best, model)
    result = evaluate(model, data=[f"ner={FIXTURES / 'ner_test.jsonl'}"])
    assert result.output_dir == model / "eval-test"  # the default output, for --data too
    assert list(result.tasks) == ["ner"]  # --data without --tasks: only the tasks it names
    assert result.tasks["ner"] == test_eval.tasks["ner"]
    assert result.metrics["data"]["ner"]["from_data_flag"] is True
    assert list(result.experts["layer_0"]) == ["ner", "shared"]


def test_cli_prints_the_per_task_table(best: Path, tmp_path: Path, capsys, test_eval: EvalResult):
    code = main(["evaluate", "--model", str(best), "--split", "test", "--output", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[-5].split()[:3] == ["task", "examples", "precision"]
    assert lines[-3].startswith("ner ") and f"{test_eval.tasks['ner']['token_accuracy']:.4f}" in lines[-3]
    assert lines[-2].startswith("sentiment ") and "selection score" in lines[-1]
    assert (tmp_path / "o" / "metrics.json").is_file()


def test_bf16_evaluation_is_close_to_fp32_and_says_its_precision(best: Path, tmp_path: Path, test_eval: EvalResult):
    code = main(["evaluate", "--model", str(best), "--precision", "bf16", "--output", str(tmp_path / "o")])
    assert code == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["settings"]["precision"] == "bf16" and test_eval.metrics["settings"]["precision"] == "fp32"
    for name, fp32 in test_eval.tasks.items():
        primary = "f1" if "f1" in fp32 else "accuracy"
        assert abs(metrics["tasks"][name][primary] - fp32[primary]) <= 0.1, name


def test_cli_bad_data_file_is_a_one_line_error(best: Path, tmp_path: Path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": ["a"], "ner_tags": ["O"]}\n{"tokens": ["Paris"], "ner_tags": ["B-CITY"]}\n')
    code = main(["evaluate", "--model", str(best), "--data", f"ner={bad}", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"{bad}:2" in err and "B-CITY" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tasks", "nerr"], "did you mean 'ner'?"),
        (["--data", "sentimnt=x.jsonl"], "did you mean 'sentiment'?"),
        (["--data", "ner"], "expected TASK=PATH"),
        (["--split", "tset"], "did you mean 'test'?"),
        (["--tasks", "sentiment", "--data", "ner=x.jsonl"], "--tasks leaves out"),
        (["--data", "ner=missing.jsonl"], "missing.jsonl: file not found"),
    ],
)
def test_cli_refuses_bad_arguments_with_a_reason(best: Path, tmp_path: Path, capsys, argv, message):
    code = main(["evaluate", "--model", str(best), "--output", str(tmp_path / "o"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_mlp_model_reports_no_experts(best: Path, tmp_path: Path):
    pre = load_model(best)
    pre.config.model.ffn = "mlp"
    model = build_model(pre.config, pre.label_sets, pre.encoder)
    save_model(tmp_path / "mlp", model, pre.encoder, pre.config, pre.label_sets)
    result = evaluate(tmp_path / "mlp", tasks="ner", output_dir=tmp_path / "out")
    assert result.experts == {} and result.metrics["notes"] == [NO_GATES_NOTE]
    assert list((tmp_path / "out" / "plots").iterdir()) == []
    assert NO_GATES_NOTE in (tmp_path / "out" / "report.md").read_text()
