"""``debug-data`` on the tiny fixtures: healthy data passes, and each planted fault is reported (as itself, and
as nothing else) with its count and the lines where it sits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES, tiny_config, tiny_tasks

from mtl_decoder.cli import main
from mtl_decoder.diagnostics.data import GLOBAL_PREFIX, debug_data
from mtl_decoder.diagnostics.findings import codes
from mtl_decoder.diagnostics.overlap import normalise


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def tasks_with(ner: dict[str, str] | None = None, sentiment: dict[str, str] | None = None) -> list[dict]:
    """The fixture tasks, with some of their split files replaced."""
    tasks = tiny_tasks()
    tasks[0]["data"].update(ner or {})
    tasks[1]["data"].update(sentiment or {})
    return tasks


@pytest.fixture(scope="module")
def healthy():
    return debug_data(tiny_config(Path("unused")))


def test_healthy_fixtures_have_no_errors_and_json_has_a_key_per_task(healthy):
    assert healthy.ok, [f.line() for f in healthy.findings]
    data = healthy.to_json()
    assert {"ner", "sentiment"} <= set(data)
    others = [k for k in data if k not in ("ner", "sentiment")]
    assert others and all(k.startswith(GLOBAL_PREFIX) for k in others)
    ner = data["ner"]["splits"]["train"]
    assert ner["examples"] == 60 and ner["invalid_iob"] == 0 and ner["subwords"]["max"] >= ner["words"]["max"]
    assert data["sentiment"]["splits"]["validation"]["label_counts"].keys() == {"negative", "positive"}
    assert 0.0 <= data["ner"]["unseen_entities"]["validation"]["unseen_share"] <= 1.0
    json.dumps(data)  # plain JSON values throughout


def test_mislabelled_overlap_is_reported_and_nothing_else(tmp_path, healthy):
    """A validation file that repeats train sentences with other labels: an error naming the lines."""
    train = read_jsonl(FIXTURES / "ner_train.jsonl")
    flipped = []
    for row in train[:6]:
        tags = ["O"] * len(row["ner_tags"])  # its entities dropped, or one added where it had none
        if tags == row["ner_tags"]:
            tags[0] = "B-LOC"
        flipped.append({**row, "ner_tags": tags})
    validation = write_jsonl(tmp_path / "ner_val.jsonl", read_jsonl(FIXTURES / "ner_validation.jsonl") + flipped)
    report = debug_data(tiny_config(tmp_path, tasks=tasks_with(ner={"validation": str(validation)})))
    assert codes(report.findings) - codes(healthy.findings) == {"overlap_mislabelled"}
    finding = next(f for f in report.findings if f.code == "overlap_mislabelled")
    assert finding.severity == "error" and finding.where == "ner/validation" and not report.ok
    assert f"{validation}:21:" in finding.examples[0] or "ner_val.jsonl:21:" in finding.examples[0]
    overlap = report.tasks["ner"]["overlap"]["validation"]
    assert overlap["exact_other_labels"] == 6 and overlap["exact"] == 6


def test_invalid_iob_and_bad_records_are_counted_not_stopped_at(tmp_path, healthy):
    rows = read_jsonl(FIXTURES / "ner_train.jsonl")
    for i in (3, 10, 20):  # an I-X with nothing before it: IOB1-style, repairable
        rows[i]["ner_tags"] = ["I-PER", *rows[i]["ner_tags"][1:]]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with path.open("a", encoding="utf-8") as f:
        f.write('{"tokens": ["broken"\n{"tokens": ["x"], "ner_tags": ["PER"]}\n')
    config = tiny_config(tmp_path, tasks=tasks_with(ner={"train": str(path)}))
    report = debug_data(config)
    stats = report.tasks["ner"]["splits"]["train"]
    assert stats["invalid_iob"] == 3 and stats["bad_records"] == 2 and stats["examples"] == 60
    assert [c.split(":")[-3] for c in stats["invalid_iob_cases"]] == ["4", "11", "21"]
    assert codes(report.findings, ("error",)) == {"invalid_iob", "bad_records"}
    repaired = debug_data(tiny_config(tmp_path, ["data.repair_iob=true"], tasks=tasks_with(ner={"train": str(path)})))
    assert next(f for f in repaired.findings if f.code == "invalid_iob").severity == "info"


def test_unseen_labels_and_exact_overlap_above_the_limit_are_errors(tmp_path, healthy):
    rows = read_jsonl(FIXTURES / "sentiment_validation.jsonl")
    rows[2]["label"] = "neutral"
    rows[7]["label"] = "neutral"
    validation = write_jsonl(tmp_path / "sent_val.jsonl", rows)
    test = tmp_path / "ner_test.jsonl"
    shutil.copy(FIXTURES / "ner_train.jsonl", test)  # test = train: everything overlaps, same labels
    config = tiny_config(tmp_path, tasks=tasks_with(ner={"test": str(test)}, sentiment={"validation": str(validation)}))
    report = debug_data(config)
    assert codes(report.findings, ("error",)) == {"unseen_labels", "overlap_exact"}
    assert report.tasks["sentiment"]["splits"]["validation"]["unseen_labels"] == {"neutral": 2}
    assert report.tasks["ner"]["overlap"]["test"]["exact_share"] == 1.0
    assert report.tasks["ner"]["overlap"]["test"]["exact_other_labels"] == 0


def test_truncation_counts_examples_and_words(tmp_path, healthy):
    report = debug_data(tiny_config(tmp_path, ["data.max_length=8"]))
    stats = report.tasks["ner"]["splits"]["train"]
    before = healthy.tasks["ner"]["splits"]["train"]
    assert stats["truncated"] > before["truncated"] and stats["words_cut"] >= stats["truncated"]
    assert stats["subwords"] == before["subwords"]  # lengths are measured before truncation
    assert stats["truncated_share"] == stats["truncated"] / 60 > 0.5
    finding = next(f for f in report.findings if f.code == "truncation" and f.where == "ner/train")
    assert f"{stats['truncated']} example(s)" in finding.message and finding.severity == "warning"


def test_normalisation():
    assert normalise("  Hello,   WORLD ! ") == "hello world"
    assert normalise("...") == ""


def test_cli_json_is_one_object_and_exit_status_follows_errors(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(
        "tasks:\n"
        f"  - {{name: sent, kind: sentence_classification, data: {{train: {FIXTURES / 'sentiment_train.jsonl'}, "
        f"validation: {FIXTURES / 'sentiment_validation.jsonl'}}}}}\n"
        "tokenizer: {vocab_size: 300, min_frequency: 1}\n",
        encoding="utf-8",
    )
    assert main(["debug-data", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "sent" in data and data[f"{GLOBAL_PREFIX}summary"]["ok"] is True
    overlapping = tmp_path / "c2.yaml"
    overlapping.write_text(config.read_text().replace("sentiment_validation", "sentiment_train"), encoding="utf-8")
    assert main(["debug-data", "--config", str(overlapping)]) == 1
    out = capsys.readouterr().out
    assert "overlap_exact [sent/validation]" in out and "exit status 1" in out
    assert main(["debug-data", "--config", str(tmp_path / "missing.yaml")]) == 2


def test_tasks_that_share_files(tmp_path, healthy):
    """Two tasks read one SemEval file (one example, two label sets); a third task's train file is the
    sentiment task's validation file: the shared trunk has seen those held-out inputs."""
    semeval = str(FIXTURES / "semeval_train.jsonl")
    tasks = tasks_with(sentiment={"validation": str(FIXTURES / "sentiment_train.jsonl")})
    tasks[1]["data"]["validation"] = str(FIXTURES / "sentiment_validation.jsonl")
    tasks += [
        {"name": "aspect", "kind": "token_tagging", "columns": {"tags": "aspect_tags"},
         "data": {"train": semeval, "validation": semeval}},
        {"name": "polarity", "kind": "sentence_classification",
         "data": {"train": semeval, "validation": semeval}},
        {"name": "sent2", "kind": "sentence_classification",
         "data": {"train": str(FIXTURES / "sentiment_validation.jsonl"), "validation": semeval}},
    ]  # fmt: skip
    report = debug_data(tiny_config(tmp_path, tasks=tasks))
    groups = {g["file"].split("/")[-1]: g for g in report.shared}
    assert groups["semeval_train.jsonl"]["read_by"][:4] == [
        "aspect/train", "aspect/validation", "polarity/train", "polarity/validation"
    ]  # fmt: skip
    assert groups["sentiment_validation.jsonl"]["leak"]
    assert report.tasks["aspect"]["splits"]["train"]["shared_with"] == ["polarity"]
    leaks = [f for f in report.findings if f.code == "shared_file_leak"]
    assert any("sentiment_validation.jsonl" in f.message for f in leaks)
    assert report.tasks["polarity"]["overlap"]["validation"]["exact_share"] == 1.0  # its train file, again
