"""Tasks' data: validation errors name file, line and field; IOB repair; label sets; one source per shared file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mtl_decoder.config import ColumnsConfig, TaskConfig, TaskDataConfig, TokenizerConfig, load_config
from mtl_decoder.data.batching import Collator, encode_example
from mtl_decoder.data.tasks import check_labels, infer_labels, load_split, split_sources
from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.errors import ConfigError, DataError, UserError

FIXTURES = Path(__file__).parents[1] / "fixtures"
SEMEVAL = FIXTURES / "semeval_train.jsonl"


def tagging(path, name="ner", tags="ner_tags", **kw) -> TaskConfig:
    data = TaskDataConfig(train=str(path), validation=kw.pop("validation", None))
    return TaskConfig(name=name, kind="token_tagging", data=data, columns=ColumnsConfig(tags=tags), **kw)


def classification(path, name="sent", **kw) -> TaskConfig:
    data = TaskDataConfig(train=str(path), validation=kw.pop("validation", None))
    return TaskConfig(name=name, kind="sentence_classification", data=data, **kw)


def jsonl(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD_TAGS = {"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}
GOOD_TEXT = {"text": "a fine film", "label": "pos"}


@pytest.mark.parametrize(
    ("kind", "name", "lines", "line", "field", "fragment"),
    [
        ("tag", "a.jsonl", [GOOD_TAGS, GOOD_TAGS, '{"tokens": ["x"], "ner_tags": ["O"]'], 3, None, "malformed JSON"),
        ("tag", "a.csv", ["tokens,ner_tags", "EU,B-ORG", "EU,O,extra"], 3, None, "expected 2 fields, got 3"),
        ("tag", "a.jsonl", [GOOD_TAGS, {"tokens": ["EU"]}], 2, None, "missing column 'ner_tags'"),
        ("cls", "a.jsonl", [GOOD_TEXT, {"txt": "x", "label": "pos"}], 2, None, "missing column"),
        ("cls", "a.jsonl", [GOOD_TEXT, {"text": "x"}], 2, None, "missing column 'label'"),
        ("tag", "a.jsonl", [GOOD_TAGS, {"tokens": ["EU", "x"], "ner_tags": ["O"]}], 2, "ner_tags", "2 tokens but 1"),
        ("tag", "a.jsonl", [{"tokens": ["EU", "x"], "ner_tags": ["O", "I-PER"]}], 1, "ner_tags", "invalid IOB2"),
        ("tag", "a.jsonl", [GOOD_TAGS, {"tokens": ["a", "b"], "ner_tags": ["B-X", "I-Y"]}], 2, "ner_tags", "IOB2"),
        ("tag", "a.jsonl", [{"tokens": ["EU"], "ner_tags": ["PER"]}], 1, "ner_tags", "is not O, B-X or I-X"),
        ("tag", "a.jsonl", [GOOD_TAGS, {"tokens": [], "ner_tags": []}], 2, "tokens", "empty token list"),
        ("tag", "a.jsonl", [{"tokens": ["a", " "], "ner_tags": ["O", "O"]}], 1, "tokens", "empty or whitespace"),
        ("tag", "a.jsonl", [{"tokens": ["EU", "rejects"], "ner_tags": [1, 2]}], 1, "ner_tags", "expected string tags"),
        ("cls", "a.jsonl", [GOOD_TEXT, {"text": "   ", "label": "pos"}], 2, "text", "empty text"),
        ("cls", "a.jsonl", [{"text": 5, "label": "pos"}], 1, "text", "expected a string"),
        ("cls", "a.jsonl", [{"text": "x", "label": None}], 1, "label", "expected a class label"),
        ("cls", "a.jsonl", [{"text": "x", "label": " "}], 1, "label", "empty label"),
        ("cls", "a.tsv", ["text\tlabel", "good\tpos", "", "bad"], 4, None, "expected 2 fields, got 1"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path, kind, name, lines, line, field, fragment):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        jsonl(path, *lines)
    else:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    task = tagging(path) if kind == "tag" else classification(path)
    with pytest.raises(DataError) as info:
        load_split({task.name: task}, "train")
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    expected_field = f" field '{field}':" if field else ""
    assert str(err).startswith(f"{path}:{line}:{expected_field} ")
    assert fragment in str(err)


def test_iob_repair_is_counted(tmp_path):
    path = jsonl(
        tmp_path / "iob1.jsonl",
        {"tokens": ["a", "b", "c", "d"], "ner_tags": ["I-PER", "I-PER", "O", "I-LOC"]},
        {"tokens": ["e", "f"], "ner_tags": ["B-ORG", "I-MISC"]},
        GOOD_TAGS,
    )
    task = tagging(path)
    with pytest.raises(DataError, match="repair_iob=true"):
        load_split({"ner": task}, "train")
    [source] = load_split({"ner": task}, "train", repair_iob=True)
    assert [ex.labels["ner"] for ex in source.examples] == [
        ["B-PER", "I-PER", "O", "B-LOC"],
        ["B-ORG", "B-MISC"],
        ["B-ORG", "O"],
    ]
    assert source.repaired_tags == 3


def test_repair_iob_through_the_config(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", {"tokens": ["a"], "ner_tags": ["I-PER"]})
    cfg = load_config(
        None,
        ["data.repair_iob=true"],
        base={"tasks": [{"name": "ner", "kind": "token_tagging", "data": {"train": str(path)}}]},
    )
    assert cfg.data.repair_iob is True
    [source] = load_split(cfg.tasks, "train", repair_iob=cfg.data.repair_iob)
    assert source.examples[0].labels["ner"] == ["B-PER"] and source.repaired_tags == 1


def test_validation_label_outside_train_label_set(tmp_path):
    train = jsonl(tmp_path / "train.jsonl", {"tokens": ["EU"], "ner_tags": ["B-ORG"]}, GOOD_TAGS)
    dev = jsonl(tmp_path / "dev.jsonl", GOOD_TAGS, {"tokens": ["Bonn", "x"], "ner_tags": ["B-LOC", "O"]})
    tasks = {"ner": tagging(train, validation=dev)}
    [source] = load_split(tasks, "train")
    labels = {"ner": infer_labels(tasks["ner"], source.examples)}
    assert labels["ner"] == ["O", "B-ORG", "I-ORG"]  # O first; I-X completed for every type seen
    check_labels(source, labels, "train")
    [dev_source] = load_split(tasks, "validation")
    with pytest.raises(DataError) as info:
        check_labels(dev_source, labels, "validation")
    assert (info.value.path, info.value.line, info.value.field) == (str(dev), 2, "ner_tags")
    assert "'B-LOC' is not in the train label set" in str(info.value)


def test_classification_label_outside_listed_labels(tmp_path):
    path = jsonl(tmp_path / "s.jsonl", GOOD_TEXT, {"text": "meh", "label": "neutral"})
    task = classification(path, labels=["neg", "pos"])
    [source] = load_split({"sent": task}, "train")
    with pytest.raises(DataError) as info:
        check_labels(source, {"sent": infer_labels(task, source.examples)}, "train")
    assert (info.value.line, info.value.field) == (2, "label")


def test_label_ids_with_a_labels_list(tmp_path):
    path = jsonl(tmp_path / "ids.jsonl", {"tokens": ["EU", "x"], "ner_tags": [1, 0], "label": 1})
    tag = tagging(path, labels=["O", "B-ORG", "I-ORG"])
    cls = classification(path, labels=["neg", "pos"])
    [source] = load_split({"ner": tag, "sent": cls}, "train")
    assert source.examples[0].labels == {"ner": ["B-ORG", "O"], "sent": "pos"}
    bad = jsonl(tmp_path / "bad.jsonl", {"text": "x", "label": 7})
    with pytest.raises(DataError, match="out of range"):
        load_split({"sent": classification(bad, labels=["neg", "pos"])}, "train")


def test_missing_split_is_a_user_error(tmp_path):
    path = jsonl(tmp_path / "t.jsonl", GOOD_TAGS)
    with pytest.raises(UserError, match=r"task 'ner' has no 'validation' data \(set tasks.ner.data.validation\)"):
        load_split({"ner": tagging(path)}, "validation")


def test_file_with_only_empty_lines(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="no examples"):
        load_split({"ner": tagging(path)}, "train")


def test_unknown_kind_in_task_file(tmp_path):
    (tmp_path / "t.yaml").write_text("name: polarity\nkind: classification\ndata: {train: a.jsonl}\n", encoding="utf-8")
    (tmp_path / "c.yaml").write_text("tasks: [t.yaml]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "c.yaml")
    assert info.value.key == "tasks.polarity.kind"


# ------------------------------------------------------------------------------------------- shared source


def semeval_tasks() -> dict[str, TaskConfig]:
    aspect = tagging(SEMEVAL, name="aspect", tags="aspect_tags")
    polarity = classification(SEMEVAL, name="polarity", labels=["positive", "negative", "neutral", "conflict"])
    return {"aspect": aspect, "polarity": polarity}


def test_tasks_reading_one_file_share_one_source():
    tasks = semeval_tasks()
    sources = load_split(tasks, "train")
    assert len(sources) == 1
    [source] = sources
    assert [t.name for t in source.tasks] == ["aspect", "polarity"]
    rows = [json.loads(line) for line in SEMEVAL.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(source.examples) == len(rows) == 30  # one example per sentence, not one per task
    for ex, row in zip(source.examples, rows, strict=True):
        assert ex.words == row["tokens"]
        assert ex.labels == {"aspect": row["aspect_tags"], "polarity": row["label"]}


def test_same_file_by_different_spellings_is_one_source(tmp_path, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    cfg = load_config(
        None,
        ["tasks.polarity.data.train=./semeval_train.jsonl"],
        base={
            "tasks": [
                {"name": "aspect", "kind": "token_tagging", "columns": {"tags": "aspect_tags"},
                 "data": {"train": str(SEMEVAL)}},
                {"name": "polarity", "kind": "sentence_classification", "data": {"train": "x.jsonl"}},
            ]
        },
    )  # fmt: skip
    assert len(split_sources(cfg.tasks, "train")) == 1


def test_collator_puts_both_label_sets_in_the_same_rows(tmp_path):
    tasks = semeval_tasks()
    [source] = load_split(tasks, "train")
    label_sets = {name: infer_labels(task, source.examples) for name, task in tasks.items()}
    label_ids = {t: {lab: i for i, lab in enumerate(labs)} for t, labs in label_sets.items()}
    kinds = {name: t.kind for name, t in tasks.items()}
    tok = train_tokenizer((ex.words for ex in source.examples), TokenizerConfig(vocab_size=300, min_frequency=1))
    encoder = TextEncoder(tok, 64)
    encoded = [encode_example(ex, encoder, label_ids, kinds) for ex in source.examples[:6]]
    batch = Collator(encoder.pad_id, kinds)(encoded)
    B, T = batch["input_ids"].shape
    assert B == 6 and set(batch["labels"]) == {"aspect", "polarity"}
    assert batch["labels"]["aspect"].shape == (B, T) and batch["labels"]["polarity"].shape == (B,)
    for i, ex in enumerate(source.examples[:6]):
        row = batch["labels"]["aspect"][i]
        on_words = row[row != -100].tolist()
        assert on_words == [label_ids["aspect"][t] for t in ex.labels["aspect"]]
        assert batch["labels"]["polarity"][i].item() == label_ids["polarity"][ex.labels["polarity"]]
        assert torch.all(row[~batch["attention_mask"][i]] == -100)


def test_tasks_sharing_a_file_must_share_its_sampling_weight():
    tasks = semeval_tasks()
    tasks["aspect"].sampling_weight = 2.0
    with pytest.raises(UserError, match=r"different sampling weights \(tasks.aspect.sampling_weight=2, "):
        split_sources(tasks, "train")
    tasks["polarity"].sampling_weight = 2.0
    [source] = split_sources(tasks, "train")
    assert source.sampling_weight == 2.0


def test_sampling_weight_must_be_positive():
    with pytest.raises(ConfigError, match="sampling_weight"):
        classification(SEMEVAL, sampling_weight=0.0)
