"""``evaluate`` and ``mtl-decoder evaluate`` on the session's tiny trained run: agreement with training-time
validation and with a recomputation from predictions, the metrics.json schema, the report, the plots and
the CLI's exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtl_decoder.cli import main
from mtl_decoder.evaluation.evaluate import EvalResult, evaluate
from mtl_decoder.evaluation.utilisation import NO_GATES_NOTE
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
def test_eval(best: Path, tmp_path_factory) -> EvalResult:
    return evaluate(best, split="test", output_dir=tmp_path_factory.mktemp("eval") / "test")


def test_validation_split_reproduces_training_validation(best: Path, tmp_path: Path):
    """evaluate --split validation gives training-time validation's numbers, and both are what the predictions
    ``mtl-decoder predict`` writes score against the fixtures' gold labels, counted outside the project."""
    info = json.loads((best / "info.json").read_text())
    result = evaluate(best, split="validation", output_dir=tmp_path / "out")
    assert result.tasks == info["validation"]  # every number, per type and per class, confusion matrix
    assert result.score == pytest.approx(info["score"], abs=1e-12)
    saved = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert saved["tasks"] == info["validation"]
    _assert_metrics_match(info["validation"], _reference_metrics(best, "validation", tmp_path))


@pytest.fixture(scope="module")
def noisy(best: Path, tmp_path_factory) -> Path:
    """The tiny run's model with N(0, 0.15) noise on its heads: the trained one tags every word O and calls every
    sentence one class (a degenerate check); this one predicts 30 test entities, 1 of them right, and both classes."""
    import torch

    pre = load_model(best)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pre.model.named_parameters():
            if name.startswith("heads."):
                p.add_(torch.randn(p.shape, generator=gen) * 0.15)
    return save_model(tmp_path_factory.mktemp("noisy") / "model", pre.model, pre.encoder, pre.config, pre.label_sets)


def test_metrics_recomputed_from_predictions(noisy: Path, tmp_path: Path):
    """evaluate's test metrics equal those counted here from the gold labels in the fixture files and the tags and
    labels ``mtl-decoder predict`` wrote to its output file."""
    reference = _reference_metrics(noisy, "test", tmp_path)
    ner, sentiment = reference["ner"], reference["sentiment"]
    assert ner["predicted"] > 5 and ner["correct"] >= 1 and ner["f1"] != ner["f1_strict"]  # not a vacuous check
    assert 0.1 < ner["token_accuracy"] < 0.9
    assert all(sum(row) < sentiment["support"] for row in zip(*sentiment["confusion_matrix"]["matrix"], strict=True))
    _assert_metrics_match(evaluate(noisy, split="test", output_dir=tmp_path / "out").tasks, reference)


def test_the_reference_entity_counter_on_a_hand_made_case():
    """_entities (the reference above), checked on tags whose entities are counted by hand."""
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-ORG", "I-LOC", "B-ORG", "B-ORG"]
    # conlleval: PER 0-2, LOC 3-5 (an I- after O starts one), ORG 5-6, LOC 6-7, ORG 7-8, ORG 8-9
    assert _entities(tags, strict=False) == {
        (0, 2, "PER"), (3, 5, "LOC"), (5, 6, "ORG"), (6, 7, "LOC"), (7, 8, "ORG"), (8, 9, "ORG")
    }  # fmt: skip
    # strict IOB2: an entity starts only at a B-: LOC 3-5 and LOC 6-7 are not entities
    assert _entities(tags, strict=True) == {(0, 2, "PER"), (5, 6, "ORG"), (7, 8, "ORG"), (8, 9, "ORG")}
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "O", "B-LOC"]]  # PER right; ORG cut short; LOC missed; LOC extra
    counts = _entity_scores(gold, pred, strict=True)  # 1 right of 3 predicted, of 3 in gold
    assert counts == {"precision": 1 / 3, "recall": 1 / 3, "f1": 1 / 3, "support": 3, "predicted": 3, "correct": 1}


def _entities(tags: list[str], strict: bool) -> set[tuple[int, int, str]]:
    """(start, end, type) of each entity: a B-X (or, conlleval's reading, an I-X not continuing an X) and the I-X
    tags after it. Written here from the definition, not with seqeval, which the code under test uses."""
    out, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, name = tag.partition("-")
        if start is not None and not (prefix == "I" and name == kind):
            out.add((start, i, kind))
            start = None
        if prefix == "B" or (prefix == "I" and start is None and not strict):
            start, kind = i, name
    return out


def _entity_scores(gold: list[list[str]], pred: list[list[str]], strict: bool) -> dict[str, float]:
    g = {(s, *e) for s, tags in enumerate(gold) for e in _entities(tags, strict)}
    p = {(s, *e) for s, tags in enumerate(pred) for e in _entities(tags, strict)}
    correct = len(g & p)
    precision, recall = (correct / len(p) if p else 0.0), (correct / len(g) if g else 0.0)
    f1 = 2 * precision * recall / (precision + recall) if correct else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": len(g), "predicted": len(p),
            "correct": correct}  # fmt: skip


def _predicted_file(model: Path, task: str, split: str, tmp_path: Path) -> list[tuple[dict, dict]]:
    """(gold record from the fixture file, the output record ``mtl-decoder predict`` wrote for it), in order."""
    source, out = FIXTURES / f"{task}_{split}.jsonl", tmp_path / f"{task}-{split}.jsonl"
    assert main(["predict", "--model", str(model), "--input", str(source), "--output", str(out), "--tasks", task]) == 0
    gold = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(written) == len(gold)
    return list(zip(gold, written, strict=True))


def _reference_metrics(model: Path, split: str, tmp_path: Path) -> dict[str, dict]:
    """Each task's metrics from the predict CLI's output file: entities counted by _entities, token accuracy by
    hand, the sentiment task's by scikit-learn."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    rows = _predicted_file(model, "ner", split, tmp_path)
    assert all(g["tokens"] == w["tokens"] for g, w in rows)
    gold = [g["ner_tags"] for g, _ in rows]
    tags = [w["predictions"]["ner"]["tags"] for _, w in rows]
    assert [len(t) for t in tags] == [len(t) for t in gold]
    ner = _entity_scores(gold, tags, strict=False)
    ner["f1_strict"] = _entity_scores(gold, tags, strict=True)["f1"]
    pairs = [(a, b) for g, t in zip(gold, tags, strict=True) for a, b in zip(g, t, strict=True)]
    ner["token_accuracy"] = sum(a == b for a, b in pairs) / len(pairs)
    ner["sentences"] = len(gold)

    rows = _predicted_file(model, "sentiment", split, tmp_path)
    gold = [g["label"] for g, _ in rows]
    labels = [w["predictions"]["sentiment"]["label"] for _, w in rows]
    classes = ["negative", "positive"]
    sentiment = {
        "accuracy": accuracy_score(gold, labels),
        "macro_f1": f1_score(gold, labels, labels=classes, average="macro", zero_division=0),
        "support": len(gold),
        "confusion_matrix": {"labels": classes, "matrix": confusion_matrix(gold, labels, labels=classes).tolist()},
    }
    return {"ner": ner, "sentiment": sentiment}


def _assert_metrics_match(got: dict[str, dict], reference: dict[str, dict]) -> None:
    for key in ("precision", "recall", "f1", "f1_strict", "token_accuracy"):
        assert got["ner"][key] == pytest.approx(reference["ner"][key], abs=1e-12), key
    for key in ("support", "sentences"):
        assert got["ner"][key] == reference["ner"][key], key
    for key in ("accuracy", "macro_f1"):
        assert got["sentiment"][key] == pytest.approx(reference["sentiment"][key], abs=1e-12), key
    assert got["sentiment"]["support"] == reference["sentiment"]["support"]
    assert got["sentiment"]["confusion_matrix"] == reference["sentiment"]["confusion_matrix"]


def test_metrics_json_schema(test_eval: EvalResult):
    m = json.loads((test_eval.output_dir / "metrics.json").read_text())
    assert m == test_eval.metrics
    assert set(m) == {"model", "split", "data", "summary", "tasks", "analysis", "experts", "settings", "notes"}
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


def test_a_killed_evaluations_temporaries_are_removed_by_the_next(best: Path, tmp_path: Path):
    """A SIGKILLed evaluate leaves its staging folder beside the output (and a half-renamed one inside): the next
    evaluate to the same output removes them, as predict does; a live process's temporary stays."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    out = tmp_path / "ev"
    out.mkdir()
    stale = [tmp_path / f".ev.mtl-tmp-{proc.pid}-00aa11bb", out / f".plots.mtl-tmp-{proc.pid}-22cc33dd"]
    live = tmp_path / f".ev.mtl-tmp-{os.getppid()}-44ee55ff"
    for folder in (*stale, live):
        folder.mkdir()
        (folder / "metrics.json").write_text("{}", encoding="utf-8")
    evaluate(best, split="test", output_dir=out)
    assert not any(p.exists() for p in stale) and live.is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "plots", "report.md"]


def test_tasks_whose_names_reduce_alike_get_plots_of_their_own(test_eval: EvalResult, tmp_path: Path):
    """'实体' and '情感' both reduce to '_': each gets its own plot, and the same file name every time."""
    from mtl_decoder.evaluation.plots import write_plots

    rename = {"ner": "实体", "sentiment": "情感"}
    metrics = json.loads(json.dumps(test_eval.metrics))
    metrics["tasks"] = {rename[k]: v for k, v in metrics["tasks"].items()}
    metrics["experts"] = {
        layer: {rename.get(k, k): v for k, v in gates.items()} for layer, gates in metrics["experts"].items()
    }
    first = [p.name for p in write_plots(metrics, tmp_path / "a")]
    again = [p.name for p in write_plots(metrics, tmp_path / "b")]
    shares = [name for name in first if name.startswith("shared_share_")]
    assert len(shares) == 2 and len(set(shares)) == 2 and first == again
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(first)
    assert "shared_share_ner.png" in [p.name for p in write_plots(test_eval.metrics, tmp_path / "c")]


def test_data_flag_reads_a_file_with_the_tasks_columns(best: Path, tmp_path: Path, test_eval: EvalResult):
    model = tmp_path / "model"
    shutil.copytree(best, model)
    result = evaluate(model, data=[f"ner={FIXTURES / 'ner_test.jsonl'}"])
    assert result.output_dir == model / "eval-test"  # the default output, for --data too
    assert list(result.tasks) == ["ner"]  # --data without --tasks: only the tasks it names
    assert result.tasks["ner"] == test_eval.tasks["ner"]
    assert result.metrics["data"]["ner"]["from_data_flag"] is True
    assert list(result.experts["layer_0"]) == ["ner", "shared"]


def test_an_evaluation_on_given_files_names_them_not_a_split(best: Path, tmp_path: Path):
    """--data alone: metrics.json's split is null and report.md says the file; with a task from its split too, both."""
    given = str(FIXTURES / "ner_test.jsonl")
    only = evaluate(best, data=[f"ner={given}"], output_dir=tmp_path / "only")
    assert only.metrics["split"] is None
    assert json.loads((tmp_path / "only" / "metrics.json").read_text())["split"] is None
    title = (tmp_path / "only" / "report.md").read_text().splitlines()[0]
    assert title == f"# Evaluation of `{best}` on `{given}`" and "split" not in title
    both = evaluate(best, data=[f"ner={given}"], tasks="ner,sentiment", output_dir=tmp_path / "both")
    assert both.metrics["split"] == "test"
    title = (tmp_path / "both" / "report.md").read_text().splitlines()[0]
    assert title == f"# Evaluation of `{best}` on the test split and `{given}`"
    plain = tmp_path / "plain"
    evaluate(best, tasks="sentiment", output_dir=plain)
    assert (plain / "report.md").read_text().splitlines()[0] == f"# Evaluation of `{best}` on the test split"


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


def test_max_tokens_changes_the_batches_not_the_metrics(noisy: Path, tmp_path: Path, monkeypatch):
    """evaluate --max-tokens 16 cuts the model's batches to 16 padded sub-words (a longer row alone) and gives the
    metrics of the default batches, on the noisy model (which predicts entities and both classes)."""
    from mtl_decoder.inference import Predictor

    shapes, form = [], Predictor._batches

    def spy(self, pieces):
        batches = form(self, pieces)
        shapes.extend((self.max_tokens, len(b), max(len(p.encoded.ids) for p in b)) for b in batches)
        return batches

    monkeypatch.setattr(Predictor, "_batches", spy)
    assert main(["evaluate", "--model", str(noisy), "--output", str(tmp_path / "default")]) == 0
    default, shapes[:] = shapes[:], []
    assert main(["evaluate", "--model", str(noisy), "--max-tokens", "16", "--output", str(tmp_path / "small")]) == 0
    small = shapes
    assert {bound for bound, _, _ in default} == {2048} and {bound for bound, _, _ in small} == {16}
    assert all(rows * longest <= 16 or rows == 1 for _, rows, longest in small)
    assert len(small) > 2 * len(default)  # the fixtures' sentences, 8 sub-words or more: mostly one row apiece

    want = json.loads((tmp_path / "default" / "metrics.json").read_text())
    got = json.loads((tmp_path / "small" / "metrics.json").read_text())
    assert got["tasks"] == want["tasks"] and got["summary"] == want["summary"]
    assert (got["settings"]["max_tokens"], want["settings"]["max_tokens"]) == (16, 2048)
    assert want["tasks"]["ner"]["support"] > 0 and want["tasks"]["ner"]["f1"] > 0  # not a vacuous comparison


def test_negative_max_tokens_is_a_one_line_error_before_anything_is_written(best: Path, tmp_path: Path, capsys):
    assert main(["evaluate", "--model", str(best), "--max-tokens", "-1", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --max-tokens must be 0 (no token bound) or a positive number of sub-words, got -1"
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_plotting_names_the_output_folder(best: Path, tmp_path: Path, capsys, monkeypatch):
    """Issue 38 case 13: the error said 'No space left on device' without a path (a plot's writer names none)."""
    from mtl_decoder.evaluation import plots

    def full_disk(metrics, plots_dir):
        plots_dir.mkdir(parents=True)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plots, "write_plots", full_disk)
    out = tmp_path / "o"
    assert main(["evaluate", "--model", str(best), "--split", "test", "--output", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {out}: cannot write the evaluation (No space left on device)\n"
    assert list(tmp_path.iterdir()) == []
