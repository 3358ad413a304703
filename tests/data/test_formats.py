"""Readers: every format gives the same examples for the same sentences; lines are right; reading streams."""

from __future__ import annotations

import csv
import json
import sys
import tracemalloc
from pathlib import Path

import pytest

from mtl_decoder.config import ColumnsConfig, TaskConfig, TaskDataConfig
from mtl_decoder.data.formats import RecordReader, detect_format
from mtl_decoder.data.hub import read_hub
from mtl_decoder.data.tasks import Source, load_split, read_source
from mtl_decoder.errors import DataError

SENTENCES = [
    {"tokens": ["EU", "rejects", "German", "call"], "ner_tags": ["B-ORG", "O", "B-MISC", "O"], "label": "negative"},
    {"tokens": ["Peter", "Blackburn", ",", "\"", "quoted", "\""], "ner_tags": ["B-PER", "I-PER", "O", "O", "O", "O"],
     "label": "positive"},
    {"tokens": ["Straße", "in", "Köln", "'s", "centre"], "ner_tags": ["O", "O", "B-LOC", "O", "O"],
     "label": "positive"},
]  # fmt: skip


def write_format(path: Path, fmt: str, rows: list[dict], tokens_as: str = "json") -> Path:
    path = path.with_suffix(f".{fmt}")
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")
    elif fmt == "tsv":  # IANA TSV: no quoting
        lines = ["\t".join(rows[0])]
        for r in rows:
            as_text = (lambda v: json.dumps(v, ensure_ascii=False)) if tokens_as == "json" else " ".join
            cells = [v if isinstance(v, str) else as_text(v) for v in r.values()]
            lines.append("\t".join(cells))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif fmt == "csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, delimiter=",")
            writer.writerow(list(rows[0]))
            for r in rows:
                cells = []
                for v in r.values():
                    if isinstance(v, list):
                        v = json.dumps(v, ensure_ascii=False) if tokens_as == "json" else " ".join(v)
                    cells.append(v)
                writer.writerow(cells)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "conll":
        blocks = ["\n".join(f"{w}\t{t}" for w, t in zip(r["tokens"], r["ner_tags"], strict=True)) for r in rows]
        path.write_text("-DOCSTART-\tO\n\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


def tagging_task(path: Path | None = None, name: str = "ner", tags: str = "ner_tags", **kw) -> TaskConfig:
    data = TaskDataConfig(train=str(path) if path else None)
    return TaskConfig(name=name, kind="token_tagging", data=data, columns=ColumnsConfig(tags=tags), **kw)


def classification_task(path: Path | None = None, name: str = "sent", **kw) -> TaskConfig:
    return TaskConfig(name=name, kind="sentence_classification", data=TaskDataConfig(train=str(path)), **kw)


def examples_of(path: Path, *tasks: TaskConfig) -> list:
    return list(read_source(Source(str(path), list(tasks))))


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "tsv", "parquet", "conll"])
def test_every_format_reads_the_same_examples(tmp_path, fmt):
    path = write_format(tmp_path / "data", fmt, SENTENCES)
    assert detect_format(path) == fmt
    tasks = [tagging_task(path)] + ([] if fmt == "conll" else [classification_task(path)])
    examples = examples_of(path, *tasks)
    assert [ex.words for ex in examples] == [s["tokens"] for s in SENTENCES]
    assert [ex.labels["ner"] for ex in examples] == [s["ner_tags"] for s in SENTENCES]
    if fmt != "conll":
        assert [ex.labels["sent"] for ex in examples] == [s["label"] for s in SENTENCES]
    assert all(ex.text is None for ex in examples)


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_delimited_space_separated_tokens(tmp_path, fmt):
    rows = [{"tokens": ["EU", "rejects", "it"], "ner_tags": ["B-ORG", "O", "O"]}]
    path = write_format(tmp_path / "d", fmt, rows, tokens_as="space")
    [ex] = examples_of(path, tagging_task(path))
    assert ex.words == ["EU", "rejects", "it"] and ex.labels["ner"] == ["B-ORG", "O", "O"]


def test_record_lines_and_empty_lines(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"a": 1}\n\n   \n{"a": 2}\r\n\n', encoding="utf-8")
    reader = RecordReader(jsonl)
    assert [(r.line, r.data["a"]) for r in reader] == [(1, 1), (4, 2)]
    assert reader.empty_lines == 3

    rows = 'text,label\n"multi\nline cell",a\n\n"b, with comma",b\n'
    (tmp_path / "a.csv").write_text(rows, encoding="utf-8")
    reader = RecordReader(tmp_path / "a.csv")
    assert [(r.line, r.data["label"]) for r in reader] == [(2, "a"), (5, "b")]
    assert reader.empty_lines == 1

    conll = "EU B-ORG\nrejects O\n\n\n\nPeter B-PER\n"
    (tmp_path / "a.conll").write_text(conll, encoding="utf-8")
    reader = RecordReader(tmp_path / "a.conll", tags_key="ner_tags")
    records = list(reader)
    assert [(r.line, r.data["tokens"], r.data["ner_tags"]) for r in records] == [
        (1, ["EU", "rejects"], ["B-ORG", "O"]),
        (6, ["Peter"], ["B-PER"]),
    ]
    assert reader.empty_lines == 2

    (tmp_path / "a.json").write_text('[\n  {"a": 1},\n\n  {"a": 2}\n]\n', encoding="utf-8")
    assert [(r.line, r.data["a"]) for r in RecordReader(tmp_path / "a.json")] == [(2, 1), (4, 2)]


def test_empty_lines_reach_the_source(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "good", "label": "pos"}\n\n\n{"text": "bad", "label": "neg"}\n\n', encoding="utf-8")
    [source] = load_split({"s": classification_task(path, name="s")}, "train")
    assert len(source.examples) == 2 and source.empty_lines == 3
    assert [ex.line for ex in source.examples] == [1, 4]


def test_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("text,label\ngreat film,pos\n".encode("utf-8-sig"))
    [ex] = examples_of(path, classification_task(path))
    assert ex.text == "great film" and ex.labels["sent"] == "pos"
    path = tmp_path / "bom.jsonl"
    path.write_bytes('{"text": "ok", "label": "pos"}\n'.encode("utf-8-sig"))
    assert examples_of(path, classification_task(path))[0].text == "ok"


def test_csv_class_ids_map_to_listed_labels(tmp_path):
    path = tmp_path / "ids.csv"
    path.write_text("text,label\nbad film,0\ngood film,1\n", encoding="utf-8")
    task = classification_task(path, labels=["negative", "positive"])
    assert [ex.labels["sent"] for ex in examples_of(path, task)] == ["negative", "positive"]


@pytest.mark.parametrize(
    ("name", "content", "line", "fragment"),
    [
        ("a.jsonl", b'{"a": 1}\n{"a": \xff}\n', 2, "UTF-8"),
        ("a.jsonl", b'{"a": 1}\n[1, 2]\n', 2, "expected a JSON object"),
        ("a.jsonl", b'{"a": 1}\r\n{"a": 1\r\n', 2, "malformed JSON (Expecting ',' delimiter at column 8)"),
        ("a.json", b'[\n{"a": 1}\n{"a": 2}\n]', 3, "expected ',' or ']'"),
        ("a.json", b'[\n{"a": 1},\n{"a": }\n]', 3, "malformed JSON"),
        ("a.json", b'[\n{"a": 1}\n', 3, "unterminated"),
        ("a.json", b'{"a": 1}', 1, "JSON array"),
        ("a.csv", b"", 1, "missing header"),
        ("a.conll", b"EU B-ORG\nrejects\n", 2, "same columns"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, name, content, line, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        list(RecordReader(path))
    assert str(info.value).startswith(f"{path}:{line}:")
    assert fragment in str(info.value)


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"unknown file format '\.xlsx'"):
        RecordReader(tmp_path / "a.xlsx")
    with pytest.raises(DataError, match="file not found"):
        RecordReader(tmp_path / "missing.jsonl")
    (tmp_path / "x.parquet").write_text("not parquet", encoding="utf-8")
    with pytest.raises(DataError, match="parquet"):
        list(RecordReader(tmp_path / "x.parquet"))


def test_jsonl_reading_streams(tmp_path):
    """The reader is a generator: the first record comes before the rest of the file is read or parsed,
    and a full pass keeps memory flat (records are not accumulated)."""
    path = tmp_path / "big.jsonl"
    line = json.dumps({"tokens": ["word"] * 40, "ner_tags": ["O"] * 40}) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(line * 10000)  # ~ 4 MB
        f.write("{this line is broken\n")
    reader = iter(RecordReader(path))
    first = next(reader)  # a reader that parsed the whole file first would fail on the last line
    assert first.line == 1 and len(first.data["tokens"]) == 40

    tracemalloc.start()
    try:
        count = 0
        with pytest.raises(DataError, match=r":10001: malformed JSON"):
            for _ in reader:
                count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 9999
    assert peak < 1_000_000  # a small multiple of one record, not the 4 MB file


@pytest.mark.skipif(sys.platform == "win32", reason="path-based hub id")
def test_read_hub_local_dataset_maps_class_labels(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    features = datasets.Features(
        {
            "tokens": datasets.Sequence(datasets.Value("string")),
            "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"])),
            "label": datasets.ClassLabel(names=["negative", "positive"]),
        }
    )
    rows = {"tokens": [["John", "Smith"], ["hi"]], "ner_tags": [[1, 2], [0]], "label": [1, -1]}
    folder = tmp_path / "hub"
    folder.mkdir()
    try:
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(folder / "train.parquet"))
        records = list(read_hub(str(folder), None, "train"))
    except Exception as err:  # a datasets version that cannot load a local folder cleanly
        pytest.skip(f"datasets cannot load a local folder here: {err}")
    assert [r.line for r in records] == [1, 2]
    assert records[0].data["ner_tags"] == ["B-PER", "I-PER"]
    assert records[0].data["label"] == "positive"
    assert records[1].data["label"] is None  # -1 (no label) must not wrap to the last class
