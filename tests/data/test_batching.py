"""Batches: sampling proportions, determinism, without-replacement passes, length grouping, the collator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING
from mtl_decoder.data.batching import (
    Collator,
    EncodedExample,
    MultiTaskBatchSampler,
    MultiTaskDataset,
    drop_words,
    source_probabilities,
)
from mtl_decoder.data.wordfeatures import MAX_WORD_CHARS, N_HASHED, hashed_features

SIZES = [400, 100, 25]


def batches_of(sampler: MultiTaskBatchSampler, epoch: int = 0) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


def source_of(indices: np.ndarray, sizes: list[int]) -> np.ndarray:
    return np.searchsorted(np.cumsum(sizes), indices, side="right")


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("proportional", np.array(SIZES) / sum(SIZES)),
        ("temperature", np.array(SIZES) ** 0.5 / (np.array(SIZES) ** 0.5).sum()),
        ("round_robin", np.full(3, 1 / 3)),
    ],
)
def test_sampling_proportions(strategy, expected):
    assert np.allclose(source_probabilities(SIZES, strategy, 2.0), expected)
    sampler = MultiTaskBatchSampler(SIZES, 16, strategy, temperature=2.0, group_by_length=False, num_batches=400)
    drawn = np.concatenate([np.array(b) for b in batches_of(sampler)])
    assert len(drawn) == 400 * 16
    share = np.bincount(source_of(drawn, SIZES), minlength=3) / len(drawn)
    if strategy == "round_robin":
        assert np.all(np.bincount(source_of(drawn, SIZES)) == len(drawn) // 3 + np.array([1, 0, 0]))
    else:
        assert np.allclose(share, expected, atol=0.02), (share, expected)


def test_temperature_flattens_towards_uniform():
    p1 = source_probabilities(SIZES, "temperature", 1.0)
    p4 = source_probabilities(SIZES, "temperature", 4.0)
    assert np.allclose(p1, source_probabilities(SIZES, "proportional"))
    assert p4.max() < p1.max() and p4.min() > p1.min()


@pytest.mark.parametrize("strategy", ["proportional", "temperature", "round_robin"])
@pytest.mark.parametrize("group", [False, True])
def test_deterministic_per_seed_and_epoch(strategy, group):
    lengths = np.random.default_rng(0).integers(5, 60, sum(SIZES))

    def make(seed):
        return MultiTaskBatchSampler(SIZES, 8, strategy, lengths=lengths, group_by_length=group, seed=seed, window=4)

    a, b = make(0), make(0)
    assert batches_of(a, 0) == batches_of(b, 0)
    assert batches_of(a, 3) == batches_of(b, 3)
    assert batches_of(a, 0) != batches_of(a, 1)  # a fresh order each epoch
    assert batches_of(a, 0) != batches_of(make(1), 0)
    assert len(batches_of(a, 0)) == len(a) == -(-sum(SIZES) // 8)
    assert all(len(batch) == 8 for batch in batches_of(a, 0))


@pytest.mark.parametrize("strategy", ["proportional", "temperature", "round_robin"])
@pytest.mark.parametrize("group", [False, True])
def test_sources_are_visited_without_replacement(strategy, group):
    sizes = [40, 13, 7]
    lengths = np.random.default_rng(1).integers(5, 60, sum(sizes))
    sampler = MultiTaskBatchSampler(
        sizes, 6, strategy, lengths=lengths, group_by_length=group, seed=3, num_batches=50, window=5
    )
    flat = np.array([i for batch in batches_of(sampler, 2) for i in batch])
    offsets = np.cumsum([0, *sizes[:-1]])
    for k, size in enumerate(sizes):
        picks = flat[(flat >= offsets[k]) & (flat < offsets[k] + size)] - offsets[k]
        counts = np.bincount(picks, minlength=size)
        # passes are whole permutations: every example once per pass, so counts differ by at most one
        assert counts.max() - counts.min() <= 1, (k, counts)
        if len(picks) >= size:
            assert counts.min() >= 1
        if not group:  # without regrouping the draws of a source come pass after pass, in order
            for start in range(0, len(picks) - size + 1, size):
                assert sorted(picks[start : start + size]) == list(range(size))


def test_round_robin_oversamples_small_sources_equally():
    sampler = MultiTaskBatchSampler([30, 3], 6, "round_robin", group_by_length=False, seed=0)
    flat = np.array([i for b in batches_of(sampler) for i in b])
    assert len(sampler) == 6 and np.bincount(source_of(flat, [30, 3])).tolist() == [18, 18]
    assert np.bincount(flat[flat >= 30] - 30).tolist() == [6, 6, 6]


def padding(batches: list[list[int]], lengths: np.ndarray) -> int:
    return sum(int(lengths[b].max() * len(b) - lengths[b].sum()) for b in batches)


def test_length_grouping_reduces_padding():
    sizes = [300, 200]
    lengths = np.random.default_rng(0).integers(4, 120, sum(sizes))
    common = dict(source_sizes=sizes, batch_size=16, lengths=lengths, seed=0, window=16)
    plain = batches_of(MultiTaskBatchSampler(group_by_length=False, **common))
    grouped = batches_of(MultiTaskBatchSampler(group_by_length=True, **common))
    assert padding(grouped, lengths) < 0.3 * padding(plain, lengths)
    # grouping only regroups: the same examples are drawn
    assert sorted(i for b in grouped for i in b) == sorted(i for b in plain for i in b)


def test_dataset_concatenates_sources():
    ex = [EncodedExample([2, 5, 3], [-1, 0, -1], ["a"]), EncodedExample([2, 5, 6, 3], [-1, 0, 1, -1], ["a", "b"])]
    ds = MultiTaskDataset([[ex[0]], [ex[1], ex[0]]])
    assert len(ds) == 3 and ds.source_sizes == [1, 2] and ds.lengths.tolist() == [3, 4, 3] and ds[1] is ex[1]


def test_collator_pads_and_masks_missing_labels():
    kinds = {"ner": TAGGING, "sent": CLASSIFICATION, "other": CLASSIFICATION}
    a = EncodedExample([2, 7, 8, 9, 3], [-1, 0, 0, 1, -1], ["Xy", "z"], {"ner": [-100, 1, -100, 0, -100], "sent": 1})
    b = EncodedExample([2, 7, 3], [-1, 0, -1], ["ab"], {"sent": 0})
    batch = Collator(pad_id=0, task_kinds=kinds, word_features=True)([a, b])
    assert batch["input_ids"].tolist() == [[2, 7, 8, 9, 3], [2, 7, 3, 0, 0]]
    assert batch["attention_mask"].tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    assert batch["word_index"].tolist() == [[-1, 0, 0, 1, -1], [-1, 0, -1, -1, -1]]
    assert set(batch["labels"]) == {"ner", "sent"}  # no example carries 'other'
    assert batch["labels"]["ner"].tolist() == [[-100, 1, -100, 0, -100], [-100] * 5]
    assert batch["labels"]["sent"].tolist() == [1, 0]
    # one feature row per distinct word ('Xy', 'z', 'ab'), and each sub-word points at its word's row
    assert batch["char_ids"].shape == (3, MAX_WORD_CHARS) and batch["shape_ids"].shape == (3,)
    assert batch["char_ids"][0, :3].tolist() == [ord("X"), ord("y"), 0]
    assert batch["token_word"].tolist() == [[-1, 0, 0, 1, -1], [-1, 2, -1, -1, -1]]
    unlabeled = Collator(0, kinds)([EncodedExample([2, 3], [-1, -1], [])])
    assert "labels" not in unlabeled and unlabeled["input_ids"].dtype == torch.long


def test_word_dropout_replaces_whole_words():
    torch.manual_seed(0)
    ex = EncodedExample([2, *range(10, 30), 3], [-1, *[w for w in range(10) for _ in (0, 1)], -1], ["w"] * 10)
    batch = Collator(0, {})([ex] * 8)
    ids = drop_words(batch["input_ids"], batch["word_index"], 0.5, unk_id=1)
    words = batch["word_index"]
    assert (ids == 1).any() and (ids != 1).any()
    assert torch.all(ids[:, 0] == 2) and torch.all(ids[:, -1] == 3)
    pairs = ids[:, 1:-1].reshape(8, 10, 2)
    assert torch.all((pairs[..., 0] == 1) == (pairs[..., 1] == 1))  # both sub-words of a word or neither
    assert torch.equal(words[0], torch.tensor(ex.word_index))


def test_hashed_word_features_are_stable_and_padded():
    feats = hashed_features("Berlin", 1000)
    assert len(feats) == N_HASHED and all(1 <= f < 1000 for f in feats)
    assert feats == hashed_features("Berlin", 1000)  # crc32: the same in every process
    assert feats[1:] == hashed_features("BERLIN", 1000)[1:]  # all but the cased word are lower-cased features
    assert feats[0] != hashed_features("BERLIN", 1000)[0]
    ex = EncodedExample([2, 10, 11, 3], [-1, 0, 1, -1], ["Berlin", "calling"])
    short = EncodedExample([2, 12, 3], [-1, 0, -1], ["Rome"])
    batch = Collator(0, {}, word_features=True, hash_buckets=1000)([ex, short, ex])
    assert batch["hash_ids"].shape == (3, N_HASHED)  # Berlin, calling, Rome: a repeated word is computed once
    assert batch["hash_ids"][0].tolist() == feats
    assert batch["token_word"].tolist() == [[-1, 0, 1, -1], [-1, 2, -1, -1], [-1, 0, 1, -1]]


def test_collator_features_of_a_batch_without_words_are_empty():
    batch = Collator(0, {}, word_features=True, hash_buckets=1000)([EncodedExample([2, 3], [-1, -1], [])])
    assert batch["char_ids"].shape == (0, MAX_WORD_CHARS) and batch["hash_ids"].shape == (0, N_HASHED)
    assert batch["token_word"].tolist() == [[-1, -1]]
