"""The pieces of distillation against independent references: the loss (a float64 KL by hand, cross-entropy for
hard labels), word alignment across tokenizers, the target store on disk, the transfer set's reader and the config
section's errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtl_decoder.config import load_config
from mtl_decoder.distill.data import read_unlabelled
from mtl_decoder.distill.labelling import write_chunks
from mtl_decoder.distill.loss import DistillLossSpec, divergence, mix, tagging_divergence
from mtl_decoder.distill.states import check_states
from mtl_decoder.distill.targets import SPANS, TargetStore, align, text_key
from mtl_decoder.errors import ConfigError, DataError, UserError


def kl_by_hand(student: list[float], teacher: list[float], t: float) -> float:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)), in float64 Python."""

    def softmax(z):
        e = [math.exp(v / t) for v in z]
        return [v / sum(e) for v in e]

    p, q = softmax(teacher), softmax(student)
    return t * t * sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


@pytest.mark.parametrize("t", [1.0, 2.0, 4.0])
def test_the_soft_term_is_the_tempered_kl_of_a_softmax_teacher(t):
    gen = torch.Generator().manual_seed(0)
    student, teacher_logits = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen) * 3
    got = divergence(student, teacher_logits.softmax(-1), DistillLossSpec(t, 0.5, True))
    for i in range(5):
        assert got[i].item() == pytest.approx(kl_by_hand(student[i].tolist(), teacher_logits[i].tolist(), t), rel=1e-4)


def test_hard_labels_are_the_cross_entropy_of_the_teachers_choice():
    gen = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(6, 3, generator=gen), torch.randn(6, 3, generator=gen).softmax(-1)
    got = divergence(student, teacher, DistillLossSpec(3.0, 0.5, soft=False))
    torch.testing.assert_close(got, F.cross_entropy(student, teacher.argmax(-1), reduction="none"))


def test_tagging_divergence_averages_the_words_with_a_target_per_text():
    gen = torch.Generator().manual_seed(2)
    emissions, teacher = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 2, 4, generator=gen).softmax(-1)
    words = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)  # row 0: 3 student words, row 1: 1
    targets = torch.tensor([[1, 1], [1, 1]], dtype=torch.bool)  # the teacher read 2 words of each
    spec = DistillLossSpec(2.0, 0.5, True)
    got = tagging_divergence(emissions, words, teacher, targets, spec)
    row0 = (divergence(emissions[0, 0], teacher[0, 0], spec) + divergence(emissions[0, 1], teacher[0, 1], spec)) / 2
    row1 = divergence(emissions[1, 0], teacher[1, 0], spec)
    torch.testing.assert_close(got, (row0 + row1) / 2)
    assert tagging_divergence(emissions, words, teacher, torch.zeros_like(targets), spec) is None


def test_mix_leaves_out_the_absent_term():
    kd, gold = torch.tensor(2.0), torch.tensor(4.0)
    assert mix(kd, gold, 0.25).item() == pytest.approx(0.25 * 2 + 0.75 * 4)
    assert mix(kd, None, 0.25).item() == pytest.approx(0.5)  # an unlabelled text: the teacher term only
    assert mix(None, gold, 1.0) is None and mix(kd, gold, 0.0).item() == pytest.approx(4.0)


def test_a_student_word_takes_the_teacher_word_it_starts_in():
    text = "I don't like New-York"
    teacher = torch.tensor([[0, 1], [2, 5], [5, 7], [8, 12], [13, 21]])  # I | don | 't | like | New-York
    student = [(0, 1), (2, 5), (5, 6), (6, 7), (8, 12), (13, 16), (16, 17), (17, 21)]  # ' and t, New - York apart
    assert [text[s:e] for s, e in student][5:] == ["New", "-", "York"]
    assert align(teacher, student) == [0, 1, 2, 2, 3, 4, 4, 4]
    assert align(teacher[:3], student) == [0, 1, 2, 2, -1, -1, -1, -1]  # the teacher truncated after 't


def test_the_target_store_keeps_entries_across_instances(tmp_path):
    store = TargetStore(tmp_path / "t", flush_every=2)
    entries = {
        text_key(["a", "b"]): {
            "ner": torch.rand(2, 3).softmax(-1).half(),
            "sentiment": torch.rand(2).softmax(-1).half(),
        },
        text_key("a b"): {
            "ner": torch.rand(2, 3).softmax(-1).half(),
            SPANS: torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        },
        text_key("c"): {"sentiment": torch.rand(2).softmax(-1).half()},
    }
    for key, value in entries.items():
        store.put(key, value)
    store.flush()
    again = TargetStore(tmp_path / "t")
    assert len(again) == 3 and text_key(["a", "b"]) != text_key("a b")
    for key, value in entries.items():
        got = again.get(key)
        assert got.keys() == value.keys() and all(torch.equal(got[k], value[k]) for k in value)


def test_the_store_streams_its_shards_and_keeps_only_what_it_is_asked_to(tmp_path, monkeypatch):
    """Entries over several shards: ``scan`` gives each key's entry in the order asked (a key again: again),
    reading each shard once however the keys alternate between them and adding nothing to memory; ``load`` with a
    transform keeps only transformed tensors; a damaged shard's entries read as absent in both, and ``verify``
    sets it aside without holding anything."""
    writer = TargetStore(tmp_path / "s", flush_every=2)  # a shard per two entries
    entries = {text_key(f"t{i}"): {"ner@states": torch.randn(i + 1, 4).half()} for i in range(7)}
    for key, value in entries.items():
        writer.put(key, value)
    writer.flush()
    keys = list(entries)
    asked = [keys[5], keys[0], keys[2], keys[1], keys[4], keys[0], keys[6], keys[3], keys[5]]
    store = TargetStore(tmp_path / "s", check=check_states)
    reads = []
    real_read = store.disk.read_shard
    monkeypatch.setattr(store.disk, "read_shard", lambda shard: reads.append(shard) or real_read(shard))
    got = [entry["ner@states"] for entry in store.scan(asked)]
    assert len(got) == len(asked)
    assert all(torch.equal(g, entries[k]["ner@states"]) for g, k in zip(got, asked, strict=True))
    assert store.memory == {}
    assert sorted(reads) == sorted({store.disk.location[k] for k in asked}) and len(reads) == 4  # 7 entries, 2 a shard
    monkeypatch.undo()

    store.load(keys, transform=lambda part, t: t.float().sum(-1))
    assert all(torch.equal(store.get(k)["ner@states"], v["ner@states"].float().sum(-1)) for k, v in entries.items())
    store.forget()
    assert store.memory == {} and len(store) == 7

    damaged = store.disk.location[keys[0]]
    damaged.write_bytes(damaged.read_bytes()[:-8])  # cut short: its header no longer covers the file
    again = TargetStore(tmp_path / "s", check=check_states)
    again.verify(keys)
    assert again.memory == {} and keys[0] not in again and keys[1] not in again and len(again) == 5
    assert [k for k in asked if k in again] == [keys[5], keys[2], keys[4], keys[6], keys[3], keys[5]]
    assert len(list(again.scan(asked))) == 6


@pytest.mark.parametrize(("max_texts", "max_words"), [(4, 30), (3, 1000), (1000, 12), (2, 1)])
def test_labelling_writes_after_a_bounded_number_of_texts_and_words(max_texts, max_words):
    """The chunks between two cache writes cover the texts in order; each keeps both bounds (or is one text too
    long alone) and could not take the next text without breaking one."""
    sizes = [int(n) for n in torch.randint(1, 25, (60,), generator=torch.Generator().manual_seed(0))]
    chunks = write_chunks(sizes, max_texts, max_words)
    assert [i for chunk in chunks for i in chunk] == list(range(len(sizes)))
    for chunk, after in zip(chunks, [*chunks[1:], None], strict=True):
        words = sum(sizes[i] for i in chunk)
        assert len(chunk) <= max_texts and (words <= max_words or len(chunk) == 1)
        if after is not None:
            assert len(chunk) == max_texts or words + sizes[after.start] > max_words
    assert write_chunks([], max_texts, max_words) == []


def test_a_bad_record_in_an_unlabelled_file_stops_naming_file_and_line(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_text('{"text": "fine"}\n{"text": 3}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"u\.jsonl:2: field 'text'"):
        read_unlabelled([str(path)], None)
    txt = tmp_path / "u.txt"
    txt.write_text("one\ntwo\nthree\n", encoding="utf-8")
    assert read_unlabelled([str(txt)], 2) == [(str(txt), ["one", "two"])]


@pytest.mark.parametrize(
    "override, key", [("distill.alpha=1.5", "distill.alpha"), ("distill.temperature=0", "distill.temperature"),
                      ("distill.unlabelled_limit=0", "distill.unlabelled_limit"), ("distill.temp=2", "distill.temp")]
)  # fmt: skip
def test_distill_settings_are_checked_naming_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml", [override])
    assert err.value.key == key


def test_an_unlabelled_file_that_cannot_be_read_says_why_in_distills_terms(tmp_path):
    csv = tmp_path / "u.csv"
    csv.write_text("sentence,id\nhello there,1\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_unlabelled([str(csv)], None)
    assert "no column 'text'" in str(err.value) and "--text-column" not in str(err.value)  # distill has no flag
    with pytest.raises(UserError, match=r"is a folder, not a file"):
        read_unlabelled([str(tmp_path)], None)
    with pytest.raises(UserError, match=r"file not found"):
        read_unlabelled([str(tmp_path / "missing.txt")], None)
