"""benchmarks/peers/: the reader, the scorer, the results file and each peer's own pieces on tiny fixtures. The
scorer is checked against hand-counted entities and classes; the CRF's training needs the optional 'peers' extra
and skips without it, everything else runs in CI."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtl_decoder.errors import DataError

REPO = Path(__file__).resolve().parents[2]

import crf  # noqa: E402
import peer_common  # noqa: E402
import spacy_pipeline  # noqa: E402
import tfidf_lr  # noqa: E402
from spacy_throughput import bio_spans  # noqa: E402


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- reader


def test_reader_reads_every_record_and_skips_blank_lines(tmp_path):
    path = _write(
        tmp_path / "a.jsonl",
        [
            '{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}',
            "",
            '{"tokens": ["Peter"], "ner_tags": ["B-PER"], "extra": 1}',
        ],
    )
    tokens, tags = peer_common.read_tagged(path)
    assert tokens == [["EU", "rejects"], ["Peter"]]
    assert tags == [["B-ORG", "O"], ["B-PER"]]


@pytest.mark.parametrize(
    ("line", "where", "field"),
    [
        ("{not json", ":2:", None),
        ('{"tokens": ["a"]}', ":2:", "ner_tags"),
        ('{"tokens": "a b", "ner_tags": ["O"]}', ":2:", "tokens"),
        ('{"tokens": ["a", "b"], "ner_tags": ["O"]}', ":2:", "ner_tags"),
        ("[1, 2]", ":2:", None),
    ],
)
def test_reader_names_file_line_and_field_of_a_bad_record(tmp_path, line, where, field):
    path = _write(tmp_path / "bad.jsonl", ['{"tokens": ["a"], "ner_tags": ["O"]}', line])
    with pytest.raises(DataError) as err:
        peer_common.read_tagged(path)
    assert f"bad.jsonl{where}" in str(err.value)
    assert err.value.line == 2 and err.value.field == field


def test_reader_of_labelled_texts(tmp_path):
    path = _write(
        tmp_path / "s.jsonl", ['{"text": "a fine film", "label": "positive"}', '{"text": "dull", "label": 0}']
    )
    with pytest.raises(DataError, match=r"s\.jsonl:2: field 'label'"):
        peer_common.read_labelled(path)


def test_semeval_splits_carve_a_tenth_of_train_and_keep_test(tmp_path):
    folder = tmp_path / "semeval14_restaurants"
    folder.mkdir()
    record = {"tokens": ["x"], "aspect_tags": ["O"], "label": "positive"}
    _write(folder / "train.jsonl", [json.dumps({**record, "tokens": [f"w{i}"]}) for i in range(30)])
    _write(folder / "test.jsonl", [json.dumps(record)] * 4)
    splits = peer_common.semeval_splits(tmp_path)
    train = [r["tokens"][0] for r in splits["train"]]
    held = [r["tokens"][0] for r in splits["validation"]]
    assert len(held) == 3 and len(train) == 27 and len(splits["test"]) == 4
    assert sorted(train + held) == sorted(f"w{i}" for i in range(30))
    assert held == [r["tokens"][0] for r in peer_common.semeval_splits(tmp_path)["validation"]]  # a fixed seed


# ---------------------------------------------------------------------------------------------- scorer


def test_entity_f1_is_the_conlleval_count_with_strict_beside_it():
    # gold: PER(0-2), LOC(3); predicted: PER(0-2) right, ORG(3) wrong type, and an I-MISC that opens a span:
    # conlleval (seqeval's default) counts it as a MISC entity, strict IOB2 does not.
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-MISC"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "I-MISC"]]
    scores = peer_common.entity_scores(gold, pred)
    # default: 3 gold, 3 predicted, 2 correct (PER, MISC) -> P = R = F1 = 2/3
    assert scores["f1"] == pytest.approx(2 / 3)
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    # strict: the I-MISC span is not an entity -> 2 predicted, 1 correct: P 1/2, R 1/3, F1 0.4
    assert scores["f1_strict"] == pytest.approx(0.4)


def test_class_scores_accuracy_and_macro_f1_over_the_label_set():
    gold = ["positive", "positive", "negative", "neutral"]
    pred = ["positive", "negative", "negative", "positive"]
    scores = peer_common.class_scores(gold, pred, ["positive", "negative", "neutral", "conflict"])
    assert scores["accuracy"] == pytest.approx(0.5)
    # per class F1: positive P 1/2 R 1/2 -> 1/2; negative P 1/2 R 1 -> 2/3; neutral 0; conflict 0 (absent)
    assert scores["macro_f1"] == pytest.approx((1 / 2 + 2 / 3) / 4)


# ---------------------------------------------------------------------------------------------- results file


def test_save_peer_merges_peers_and_keeps_the_schema(tmp_path):
    out = tmp_path / "peers.json"
    run = {"command": "python benchmarks/peers/tfidf_lr.py", "cpu": "cpu A", "cpu_cores": 2, "avx512": True,
           "date": "2026-12-01", "commit": "abc"}  # fmt: skip
    peer_common.save_peer("tfidf_lr", {"description": "t", "sst2": {"test_accuracy": 0.8}}, run, out)
    later = {**run, "command": "python benchmarks/peers/crf.py", "commit": "def"}
    peer_common.save_peer("crf", {"description": "c", "conll2003": {"test_f1": 0.81234567891}}, later, out)
    data = json.loads(out.read_text())
    assert set(data) >= {"benchmark", "cpu", "date", "commit", "command", "peers"}
    assert data["benchmark"] == "peers" and data["commit"] == "def"
    assert list(data["peers"]) == ["crf", "tfidf_lr"]  # a fixed order, whatever ran first
    assert data["peers"]["tfidf_lr"]["run"]["commit"] == "abc"  # each peer keeps its own run's facts
    assert data["peers"]["crf"]["conll2003"]["test_f1"] == 0.81234567891  # full precision
    assert data["command"] == "python benchmarks/peers/crf.py && python benchmarks/peers/tfidf_lr.py"


# ---------------------------------------------------------------------------------------------- CRF


def test_word_shape_collapses_runs_of_character_classes():
    assert crf.shape("McDonald's") == "XxXx'x"
    assert crf.shape("1996") == "d"
    assert crf.shape("U.S.") == "X.X."


def test_crf_features_of_a_word_and_its_neighbours():
    tokens = ["German", "call", "to", "boycott", "BRITISH"]
    first, middle, last = (crf.word_features(tokens, i) for i in (0, 2, 4))
    assert first["BOS"] and "-1:lower" not in first
    assert first["word"] == "German" and first["lower"] == "german" and first["istitle"] and not first["isupper"]
    assert first["prefix3"] == "Ger" and first["suffix2"] == "an" and first["suffix3"] == "man"
    assert first["+1:lower"] == "call" and first["shape"] == "Xx"
    assert middle["-1:lower"] == "call" and middle["+1:lower"] == "boycott" and "BOS" not in middle
    assert last["EOS"] and last["isupper"] and last["shape"] == "X" and last["-1:suffix3"] == "ott"
    assert [f["word"] for f in crf.sentence_features(tokens)] == tokens


def test_crf_learns_a_tiny_tagging_rule():
    pytest.importorskip("sklearn_crfsuite")
    names, verbs = ["Anna", "Boris", "Clara", "David", "Emil"], ["runs", "sings", "reads", "waits"]
    tokens = [[n, v, "today"] for n in names for v in verbs]
    tags = [["B-PER", "O", "O"] for _ in tokens]
    held = ([["Fiona", "runs", "today"]], [["B-PER", "O", "O"]])
    out = crf.train_and_score((tokens, tags), {"held": held}, iterations=50)
    assert out["held"]["f1"] == 1.0 and out["train_cpu_s"] > 0


# ---------------------------------------------------------------------------------------------- TF-IDF + LR


def test_tfidf_lr_separates_two_kinds_of_words():
    good = [f"a truly {w} film" for w in ("great", "wonderful", "superb", "lovely")]
    bad = [f"a truly {w} film" for w in ("awful", "dreadful", "boring", "tedious")]
    texts, labels = good + bad, ["positive"] * 4 + ["negative"] * 4
    out = tfidf_lr.train_and_score(
        (texts, labels), {"train": (texts, labels)}, ["negative", "positive"], c=8.0, iterations=100
    )
    assert out["train"]["accuracy"] == 1.0 and out["train"]["macro_f1"] == 1.0


# ---------------------------------------------------------------------------------------------- spaCy


def test_spacy_entities_back_to_iob2_round_trip():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "O", "B-MISC"]
    ents = [SimpleNamespace(start=s, end=e, label_=label) for s, e, label in bio_spans(tags)]
    doc = type("Doc", (), {"ents": ents, "__len__": lambda self: len(tags)})()
    assert spacy_pipeline.to_iob2(doc) == tags


def test_spacy_peer_says_how_to_make_its_venv_when_it_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="pip install"):
        spacy_pipeline.run_worker(tmp_path / "no-venv" / "bin" / "python", {})
