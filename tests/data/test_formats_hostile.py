"""The file-format layer under hostile input: bounded nesting and line length, an unclosed CSV quote reported
where it began, a folder called a folder, a hub dataset that cannot be loaded as one line. A bad record is one
record's problem (a BadRecord; training's RecordReader raises it as a DataError naming file and line)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mtl_decoder.data import formats
from mtl_decoder.data.formats import BadRecord, FileRecords, Record, RecordReader
from mtl_decoder.data.hub import read_hub
from mtl_decoder.data.inputs import InputReader
from mtl_decoder.data.safejson import MAX_JSON_DEPTH
from mtl_decoder.data.tasks import load_split
from mtl_decoder.errors import DataError, UserError


def _write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _summary(records) -> list[tuple[int, str]]:
    return [(r.line, "bad" if isinstance(r, BadRecord) else "ok") for r in records]


@pytest.mark.parametrize("nested", ["[" * 1500, "[" * 1500 + "]" * 1500, '{"a": ' * 1500 + "1" + "}" * 1500])
def test_deep_nesting_is_one_bad_record(tmp_path, nested):
    path = _write(tmp_path / "in.jsonl", ['{"text": "one"}', nested, '{"text": "three"}'])
    records = list(FileRecords(path))
    assert _summary(records) == [(1, "ok"), (2, "bad"), (3, "ok")]
    assert records[1].reason == f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    with pytest.raises(DataError, match=r"in\.jsonl:2: JSON nested deeper than 64 levels"):
        list(RecordReader(path))


def test_nesting_at_the_bound_is_read_and_brackets_in_strings_do_not_count(tmp_path):
    at_bound = {"text": "x", "deep": json.loads("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))}
    path = _write(tmp_path / "in.jsonl", [json.dumps(at_bound), json.dumps({"text": "[" * 5000})])
    assert _summary(FileRecords(path)) == [(1, "ok"), (2, "ok")]


def test_a_deeply_nested_csv_cell_stays_text(tmp_path):
    path = _write(tmp_path / "in.csv", ["tokens,label", '"' + "[" * 1500 + '",positive'])
    [record] = list(RecordReader(path))
    assert record.data["tokens"] == "[" * 1500


def test_a_json_array_nested_too_deep_is_a_file_error(tmp_path):
    path = tmp_path / "in.json"
    path.write_text("[" * 1500, encoding="utf-8")
    with pytest.raises(DataError, match="nested deeper than"):
        list(RecordReader(path))


def test_a_line_longer_than_the_bound_is_one_bad_record(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", 1000)
    long = json.dumps({"text": "word " * 1000})
    path = _write(tmp_path / "in.jsonl", ['{"text": "one"}', long, '{"text": "three"}', "x" * 3000])
    records = list(FileRecords(path))
    assert _summary(records) == [(1, "ok"), (2, "bad"), (3, "ok"), (4, "bad")]
    assert records[1].reason == "line longer than 1,000 bytes" and len(records[1].raw) <= 1024
    assert records[2].data == {"text": "three"}


def test_an_unclosed_csv_quote_is_reported_where_it_began_and_the_rows_after_it_are_read(tmp_path):
    rows = ["text,label", "fine,positive", '"opened here,negative', "after,positive", "more,negative", "last,positive"]
    path = _write(tmp_path / "in.csv", rows)
    records = list(FileRecords(path))
    assert _summary(records) == [(2, "ok"), (3, "bad"), (4, "ok"), (5, "ok"), (6, "ok")]
    assert records[1].reason == "a quoted field opened on this line is never closed"
    assert records[1].raw == '"opened here,negative'
    assert [r.data["text"] for r in records if isinstance(r, Record)] == ["fine", "after", "more", "last"]
    with pytest.raises(DataError, match=r"in\.csv:3: a quoted field opened on this line is never closed"):
        list(RecordReader(path))


@pytest.mark.parametrize("name", ["data", "data.jsonl"])
def test_a_folder_is_called_a_folder(tmp_path, name):
    (tmp_path / name).mkdir()
    for read in (RecordReader, FileRecords, InputReader):
        with pytest.raises(DataError, match=r"is a folder, not a file"):
            read(tmp_path / name)


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError("Dataset scripts are no longer supported, but found squad.py"),
        ConnectionError("Couldn't reach 'someone/missing' on the Hub (OfflineModeIsEnabled)"),
        ValueError("Unknown split \"validation\". Should be one of ['train']."),
        "DatasetNotFoundError",
    ],
)
def test_a_hub_dataset_that_cannot_be_loaded_is_one_line(monkeypatch, make_config, tmp_path, raised):
    datasets = pytest.importorskip("datasets")
    if raised == "DatasetNotFoundError":
        raised = datasets.exceptions.DatasetNotFoundError("Dataset 'someone/missing' doesn't exist on the Hub")

    def load_dataset(*args, **kwargs):
        raise raised

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(UserError) as caught:
        list(read_hub("someone/missing", None, "train"))
    message = str(caught.value)
    assert message.startswith("hub dataset 'someone/missing' split 'train': cannot be loaded (")
    assert str(raised).splitlines()[0] in message and "data.hub_id" in message and "\n" not in message
    ner = make_config(tmp_path / "run").tasks["ner"]
    hub = dataclasses.replace(ner, data=dataclasses.replace(ner.data, hub_id="someone/missing", train="train"))
    with pytest.raises(UserError, match="hub dataset 'someone/missing'"):  # the path a run takes
        load_split({"ner": hub}, "train")
