"""Input readers: every format streams records with their line numbers; bad records come out, not exceptions."""

from __future__ import annotations

import pytest
from predict_testkit import write_conll, write_delimited, write_lines

from mtl_decoder.data.formats import detect_format
from mtl_decoder.data.inputs import BadRecord, InputReader, InputRecord
from mtl_decoder.errors import DataError


def _read(path, **kwargs) -> tuple[list, InputReader]:
    reader = InputReader(path, **kwargs)
    return list(reader), reader


def _lines(records) -> list[tuple[str, int]]:
    return [("bad" if isinstance(r, BadRecord) else "ok", r.line) for r in records]


def test_jsonl_bad_records_keep_their_line_and_reason(tmp_path):
    path = write_lines(
        tmp_path / "in.jsonl",
        [
            '{"id": 1, "text": "fine"}',
            "",
            '{"id": 2, "text": ',
            "[1, 2]",
            '{"id": 3}',
            '{"tokens": ["a", 3]}',
            '{"tokens": []}',
            '{"text": "   "}',
            '{"text": "lone \\ud800 surrogate"}',
            '{"text": "pair \\ud83d\\ude00 is fine", "tokens": null}',
            '{"id": 4, "tokens": ["EU", "rejects"], "text": "ignored"}',
        ],
    )
    records, reader = _read(path)
    assert _lines(records) == [("ok", 1)] + [("bad", n) for n in range(3, 10)] + [("ok", 10), ("ok", 11)]
    reasons = [r.reason for r in records if isinstance(r, BadRecord)]
    assert reasons[0].startswith("malformed JSON")
    assert reasons[1] == "expected a JSON object, got an array"
    assert reasons[2] == "no 'tokens' or 'text' field"
    assert reasons[3] == "token 1 is int, not a string"
    assert reasons[4] == "is an empty list"
    assert reasons[5] == "is empty"
    assert "surrogate" in reasons[6]
    assert records[1].raw == '{"id": 2, "text": '
    assert records[-2].item == "pair 😀 is fine"
    assert records[-1].item == ["EU", "rejects"] and records[-1].fields["text"] == "ignored"
    assert reader.empty_lines == 1


def test_jsonl_text_column_and_fields_kept(tmp_path):
    path = write_lines(tmp_path / "in.ndjson", ['{"sentence": "hello there", "meta": {"k": [1, 2]}}'])
    [record], _ = _read(path, text_column="sentence")
    assert record.item == "hello there" and record.fields == {"sentence": "hello there", "meta": {"k": [1, 2]}}


def test_csv_quoted_multiline_fields_and_bad_rows(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text(
        '\ufeffid,text\n1,"He said ""hi"", then left"\n2,"two\nlines"\n\n3,too,many\n4,"bad"quote\n5,\n6,last\n',
        encoding="utf-8",
    )
    records, reader = _read(path)
    assert _lines(records) == [("ok", 2), ("ok", 3), ("bad", 6), ("bad", 7), ("bad", 8), ("ok", 9)]
    assert records[0].item == 'He said "hi", then left' and records[0].fields == {"id": "1", "text": records[0].item}
    assert records[1].item == "two\nlines"
    assert records[2].reason == "expected 2 fields, got 3" and records[2].raw == "3,too,many"
    assert records[3].reason.startswith("malformed CSV")
    assert records[4].field == "text"
    assert reader.empty_lines == 1


def test_tsv_reads_quotes_verbatim(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text('text\tlabel\n" a movie " is good\t1\n', encoding="utf-8")
    [record], _ = _read(path)
    assert record.item == '" a movie " is good' and record.fields["label"] == "1"


def test_csv_without_the_text_column_is_a_file_error(tmp_path):
    path = write_delimited(tmp_path / "in.csv", [{"id": "1", "sentence": "x"}], ",")
    with pytest.raises(DataError, match=r"no column 'text'.*--text-column"):
        _read(path)
    [record], _ = _read(path, text_column="sentence")
    assert record.item == "x"


def test_txt_undecodable_line_is_one_bad_record(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"first line\r\n\n  \nbad \xff byte\nlast, with  spaces \n")
    records, reader = _read(path)
    assert _lines(records) == [("ok", 1), ("bad", 4), ("ok", 5)]
    assert records[0].item == "first line"
    assert "UTF-8" in records[1].reason and records[1].raw == "bad \ufffd byte"
    assert records[2].item == "last, with  spaces " and records[2].fields == {"text": "last, with  spaces "}
    assert reader.empty_lines == 2


def test_conll_sentences_docstart_and_extra_columns(tmp_path):
    path = write_conll(tmp_path / "in.conll", [["EU", "rejects"], ["Peter"]])
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n\nlast\n")  # redundant blank lines, and no final blank line
    records, reader = _read(path)
    assert _lines(records) == [("ok", 3), ("ok", 6), ("ok", 10)]
    assert records[0].item == ["EU", "rejects"] and records[0].fields["columns"] == [["NNP", "O"], ["NNP", "O"]]
    assert records[2].fields == {"tokens": ["last"]}
    assert reader.empty_lines == 2  # the blank line after -DOCSTART- is not counted


def test_format_by_suffix_or_flag(tmp_path):
    assert detect_format("a.JSONL", prediction=True) == "jsonl" and detect_format("a.ndjson") == "jsonl"
    assert detect_format("a.dat", "txt", prediction=True) == "txt"
    with pytest.raises(DataError, match="--format"):
        detect_format("a.dat", prediction=True)
    with pytest.raises(DataError, match="unknown format 'txt'"):  # training data needs labels: no .txt
        detect_format("a.txt", "txt")
    with pytest.raises(DataError, match="file not found"):
        InputReader(tmp_path / "missing.txt")
    assert isinstance(next(iter(InputReader(write_lines(tmp_path / "a.dat", ["x"]), "txt"))), InputRecord)
