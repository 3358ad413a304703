"""Fields of the wrong shape (issue 38 cases 6 and 19): a tag with white space at an end, a string where a list
belongs, an error in a .conll file, a CSV quote that swallows the rows after it. Each is refused naming the file,
the line of the word at fault and the field (the column, in a .conll file), or counted; none is read as data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import tiny_config, tiny_tasks

from mtl_decoder.config import ColumnsConfig, TaskConfig, TaskDataConfig
from mtl_decoder.data.formats import BadRecord, FileRecords, Record
from mtl_decoder.data.tasks import check_labels, infer_labels, load_split
from mtl_decoder.diagnostics.data import debug_data
from mtl_decoder.errors import DataError


def _tagging(train: Path, validation: Path | None = None) -> dict[str, TaskConfig]:
    data = TaskDataConfig(train=str(train), validation=str(validation) if validation else None)
    return {"ner": TaskConfig(name="ner", kind="token_tagging", data=data, columns=ColumnsConfig(tags="ner_tags"))}


def _jsonl(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = {"tokens": ["EU", "rejects", "Peter"], "ner_tags": ["B-ORG", "O", "B-PER"]}


@pytest.mark.parametrize("tag", ["B-PER ", "B-PER\u00a0", " B-PER", "I-PER\t", "B- PER", "O "])
def test_a_tag_with_white_space_at_an_end_is_refused_not_a_new_type(tmp_path, tag):
    path = _jsonl(tmp_path / "a.jsonl", GOOD, {"tokens": ["EU", "Peter"], "ner_tags": ["B-ORG", tag]})
    with pytest.raises(DataError) as info:
        load_split(_tagging(path), "train")
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, "ner_tags")
    assert "at word 2 has white space around it" in info.value.reason
    assert "\u00a0" not in str(info.value)  # shown escaped: the reader sees what is wrong


@pytest.mark.parametrize(
    "row, field, fragment",
    [
        ({"tokens": "EU rejects", "ner_tags": ["B-ORG", "O"]}, "tokens", "expected a list of strings, got the string"),
        ({"tokens": ["EU"], "ner_tags": "O"}, "ner_tags", "expected a list of tags, got the string 'O'"),
    ],
)
def test_a_string_where_a_json_list_belongs_is_refused(tmp_path, row, field, fragment):
    path = _jsonl(tmp_path / "a.jsonl", GOOD, row)
    with pytest.raises(DataError) as info:
        load_split(_tagging(path), "train")
    assert (info.value.line, info.value.field) == (2, field) and fragment in info.value.reason


def test_a_csv_cell_of_space_separated_words_and_tags_is_still_read(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("tokens,ner_tags\nEU rejects,B-ORG O\n", encoding="utf-8")
    [source] = load_split(_tagging(path), "train")
    assert source.examples[0].words == ["EU", "rejects"] and source.examples[0].labels["ner"] == ["B-ORG", "O"]


CONLL = "-DOCSTART-\tO\n\nEU\tB-ORG\nrejects\tO\n\nPeter\tB-PER\nMaria\tI-PER\nin\tO\nParis\t{tag}\n"


def test_a_conll_error_names_the_words_line_and_its_column(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text(CONLL.format(tag="I-LOC"), encoding="utf-8")
    with pytest.raises(DataError) as info:
        load_split(_tagging(path), "train")
    assert (info.value.line, info.value.field) == (9, "column 2 (the tag)")  # Paris, not Peter's line 6
    assert str(info.value).startswith(f"{path}:9: field 'column 2 (the tag)': invalid IOB2 tag 'I-LOC' at word 4")


def test_a_conll_label_unseen_in_train_names_the_words_line_and_column(tmp_path):
    train = tmp_path / "train.conll"
    train.write_text(CONLL.format(tag="O"), encoding="utf-8")
    validation = tmp_path / "validation.conll"
    validation.write_text(CONLL.format(tag="B-LOC"), encoding="utf-8")
    tasks = _tagging(train, validation)
    [source] = load_split(tasks, "train")
    labels = {"ner": infer_labels(tasks["ner"], source.examples)}
    [checked] = load_split(tasks, "validation")
    with pytest.raises(DataError) as info:
        check_labels(checked, labels, "validation")
    assert (info.value.line, info.value.field) == (9, "column 2 (the tag)") and "'B-LOC'" in info.value.reason


def test_a_conll_file_without_tags_says_so(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text("EU\nrejects\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"a\.conll:1: no tag column"):
        load_split(_tagging(path), "train")


def _csv_with_a_stray_quote(path: Path) -> Path:
    """30 rows; row 11 opens a quote that a later row's quote (not followed by a comma) does not close."""
    rows = [f"sentence number {i},pos" for i in range(30)]
    rows[10] = '"opened here and never closed,neg'
    rows[20] = 'a "quoted" word later on,pos'
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_stray_csv_quote_loses_no_row(tmp_path):
    records = list(FileRecords(_csv_with_a_stray_quote(tmp_path / "a.csv")))
    bad = [r for r in records if isinstance(r, BadRecord)]
    assert len(records) == 30 and [r.line for r in bad] == [12]
    texts = [r.data["text"] for r in records if isinstance(r, Record)]
    assert texts[19] == 'a "quoted" word later on' and texts[10] == "sentence number 11"


def test_debug_data_counts_every_csv_row_after_a_stray_quote(tmp_path):
    path = _csv_with_a_stray_quote(tmp_path / "a.csv")
    tasks = tiny_tasks()
    tasks[1]["data"]["train"] = str(path)
    stats = debug_data(tiny_config(tmp_path, tasks=tasks)).tasks["sentiment"]["splits"]["train"]
    assert stats["examples"] + stats["bad_records"] == 30 and stats["bad_records"] == 1
