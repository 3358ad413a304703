"""Class labels as the declared kind (issue 27 cases 5, 6): a string or an integer, one spelling per class. A JSON
float (1.0, NaN) or a NaN spelling is an error naming file:line; '1' beside '1.0' (or an id beside its class name)
is an error naming both lines; debug-data reports them as bad records where training stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import tiny_config, tiny_tasks

from mtl_decoder.config import TaskConfig, TaskDataConfig
from mtl_decoder.data.tasks import load_split
from mtl_decoder.diagnostics.data import debug_data
from mtl_decoder.errors import DataError


def _task(path: Path, labels: list[str] | None = None) -> dict[str, TaskConfig]:
    data = TaskDataConfig(train=str(path), validation=str(path))
    return {"s": TaskConfig(name="s", kind="sentence_classification", data=data, labels=labels)}


def _jsonl(path: Path, labels: list) -> Path:
    rows = [json.dumps({"text": f"text number {i}", "label": v}) for i, v in enumerate(labels)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")  # json.dumps writes NaN as JSON readers take it
    return path


def _csv(path: Path, labels: list[str]) -> Path:
    path.write_text("text,label\n" + "".join(f"text {i},{v}\n" for i, v in enumerate(labels)), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "write, labels, line, fragment",
    [
        (_jsonl, [0, 1, 0.0, 1.0], 3, "got the number 0.0"),  # was four classes: 0, 0.0, 1, 1.0
        (_jsonl, [1, float("nan")], 2, "got the number NaN"),  # was a class named 'nan'
        (_jsonl, ["pos", 1.5], 2, "got the number 1.5"),
        (_csv, ["0", "1", "0.0", "1.0"], 4, "label '0.0' and label '0' (line 2) spell one class two ways"),
        (_csv, ["1", "01"], 3, "label '01' and label '1' (line 2)"),
        (_csv, ["pos", "NaN"], 3, "got 'NaN' (a missing value?)"),
    ],
)
def test_a_label_of_the_wrong_kind_or_spelling_names_its_line(tmp_path, write, labels, line, fragment):
    suffix = ".jsonl" if write is _jsonl else ".csv"
    path = write(tmp_path / f"d{suffix}", labels)
    with pytest.raises(DataError) as caught:
        load_split(_task(path), "train")
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), line, "label")
    assert fragment in str(caught.value)


def test_an_id_beside_its_class_name_is_two_spellings(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [0, "positive", "negative"])
    with pytest.raises(DataError, match=r"d.jsonl:3: .*label 'negative' and label '0' \(line 1\)"):
        load_split(_task(path, labels=["negative", "positive"]), "train")


def test_one_spelling_per_class_reads_as_before(tmp_path):
    ints = load_split(_task(_jsonl(tmp_path / "i.jsonl", [0, 1, "1", 0])), "train")[0]
    assert [ex.labels["s"] for ex in ints.examples] == ["0", "1", "1", "0"]  # 1 and "1": one spelling
    floats = load_split(_task(_csv(tmp_path / "f.csv", ["0.0", "1.0", "1.0"])), "train")[0]
    assert [ex.labels["s"] for ex in floats.examples] == ["0.0", "1.0", "1.0"]
    ids = load_split(_task(_jsonl(tmp_path / "ids.jsonl", [0, 1, 1]), labels=["neg", "pos"]), "train")[0]
    assert [ex.labels["s"] for ex in ids.examples] == ["neg", "pos", "pos"]


def test_debug_data_reports_mixed_spellings_and_nan_as_errors(tmp_path):
    mixed = _csv(tmp_path / "mixed.csv", ["negative", "positive", "0", "0.0", "negative"])
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"text": "a b", "label": "positive"}\n{"text": "c d", "label": NaN}\n', encoding="utf-8")
    tasks = tiny_tasks()
    tasks[1]["labels"] = None
    tasks[1]["data"].update(train=str(mixed), validation=str(nan))
    report = debug_data(tiny_config(tmp_path, tasks=tasks))
    assert not report.ok
    bad = {f.where: f for f in report.findings if f.code == "bad_records"}
    assert "sentiment/train" in bad and "sentiment/validation" in bad
    assert "mixed.csv:5: field 'label': label '0.0' and label '0' (line 4)" in " ".join(bad["sentiment/train"].examples)
    assert "nan.jsonl:2: field 'label'" in " ".join(bad["sentiment/validation"].examples)
