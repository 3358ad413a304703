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
    weighted_turns,
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


def draws_per_epoch(sampler: MultiTaskBatchSampler, epochs: int, sizes: list[int]) -> list[list[np.ndarray]]:
    """[epoch][source]: the source-local indices drawn in each epoch, in batch order."""
    offsets = np.cumsum([0, *sizes[:-1]])
    out = []
    for epoch in range(epochs):
        flat = np.array([i for batch in batches_of(sampler, epoch) for i in batch])
        k = source_of(flat, sizes)
        out.append([flat[k == s] - offsets[s] for s in range(len(sizes))])
    return out


@pytest.mark.parametrize("strategy", ["proportional", "temperature", "round_robin"])
@pytest.mark.parametrize("group", [False, True])
def test_every_pass_over_a_source_completes_across_epochs(strategy, group):
    """A source drawn fewer times per epoch than its size is still seen whole: at the end of every epoch, the
    times each example has been drawn since the start differ by at most one (the old sampler began a fresh
    shuffle every epoch, so some examples came back before others were ever seen)."""
    sizes = [100, 1000]
    lengths = np.random.default_rng(1).integers(5, 60, sum(sizes))
    sampler = MultiTaskBatchSampler(
        sizes, 8, strategy, lengths=lengths, group_by_length=group, seed=3, num_batches=10, window=4
    )
    epochs = draws_per_epoch(sampler, 60, sizes)  # ~40-70 draws of the big source an epoch: 2-4 passes
    for k, size in enumerate(sizes):
        counts = np.zeros(size, dtype=np.int64)
        for e, draws in enumerate(epochs):
            counts += np.bincount(draws[k], minlength=size)
            assert counts.max() - counts.min() <= 1, (k, e, np.bincount(counts))
        assert counts.sum() >= 2 * size  # the test covered more than one whole pass
        if not group:  # without grouping, a source's stream is drawn in order: every pass is a permutation
            stream = np.concatenate([draws[k] for draws in epochs])
            for lo in range(0, len(stream) - size + 1, size):
                assert sorted(stream[lo : lo + size]) == list(range(size))


@pytest.mark.parametrize("strategy", ["proportional", "round_robin"])
def test_an_epoch_is_the_same_however_it_is_reached(strategy):
    """Resume: a fresh sampler set to epoch e (a resumed run) yields what one that went through epochs 0..e-1
    did, and Accelerate's skip_first_batches on it gives the rest of the epoch."""
    from accelerate import skip_first_batches

    sizes = [37, 300]
    lengths = np.random.default_rng(2).integers(5, 60, sum(sizes))

    def make():
        return MultiTaskBatchSampler(sizes, 8, strategy, lengths=lengths, seed=5, num_batches=12, window=5)

    unbroken = make()
    seen = [batches_of(unbroken, e) for e in range(7)]
    assert batches_of(unbroken, 6) == seen[6]  # iterating an epoch twice gives the same batches
    fresh = make()
    assert batches_of(fresh, 6) == seen[6]
    assert batches_of(fresh, 3) == seen[3]  # and going back
    resumed = make()
    resumed.set_epoch(4)
    loader = torch.utils.data.DataLoader(list(range(sum(sizes))), batch_sampler=resumed, collate_fn=list)
    assert list(skip_first_batches(loader, 5)) == seen[4][5:]


def mixes(batches: list[list[int]], sizes: list[int]) -> np.ndarray:
    """(batches, sources): how many examples of each source every batch holds."""
    return np.array([np.bincount(source_of(np.array(b), sizes), minlength=len(sizes)) for b in batches])


def test_round_robin_batches_are_half_and_half_with_length_grouping():
    """The old regrouping re-cut batches across sources inside a window: a batch's share of one source ran from
    about 1/8 to 7/8 on the benchmark data. Now every batch keeps the mix drawn for it."""
    sizes = [300, 2000]
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(10, 60, 300), rng.integers(3, 25, 2000)])  # one task's are longer
    for epoch in range(3):
        batches = batches_of(
            MultiTaskBatchSampler(sizes, 16, "round_robin", lengths=lengths, seed=1, num_batches=50), epoch
        )
        assert (mixes(batches, sizes) == [8, 8]).all()
    three = batches_of(MultiTaskBatchSampler([50, 60, 70], 8, "round_robin", lengths=lengths, num_batches=30))
    assert {tuple(sorted(m)) for m in mixes(three, [50, 60, 70])} == {(2, 3, 3)}


@pytest.mark.parametrize("strategy", ["proportional", "temperature"])
def test_length_grouping_keeps_each_drawn_mix(strategy):
    sizes = [300, 2000]
    lengths = np.random.default_rng(0).integers(3, 60, sum(sizes))
    common = dict(source_sizes=sizes, batch_size=16, strategy=strategy, lengths=lengths, seed=4, num_batches=400)
    grouped = MultiTaskBatchSampler(group_by_length=True, **common)
    plain = MultiTaskBatchSampler(group_by_length=False, **common)
    drawn = grouped.batch_mix(0)
    assert (mixes(batches_of(plain), sizes) == drawn).all()  # without grouping: batch after batch as drawn
    # with grouping, the batches of a window are shuffled, but each keeps a drawn mix
    got = mixes(batches_of(grouped), sizes)
    for lo in range(0, 400, grouped.window):
        assert sorted(map(tuple, got[lo : lo + 64])) == sorted(map(tuple, drawn[lo : lo + 64]))
    p = source_probabilities(sizes, strategy)[0]
    assert got[:, 0].sum() / got.sum() == pytest.approx(p, abs=4 * (p * (1 - p) / got.sum()) ** 0.5)


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


def greedy_turns(weights: list[float], slots: int) -> list[int]:
    """Reference: slot by slot, the source whose next turn comes first, (taken + 1/2) / weight, ties to the lower."""
    taken = [0] * len(weights)
    out = []
    for _ in range(slots):
        k = min(range(len(weights)), key=lambda j: ((taken[j] + 0.5) / weights[j], j))
        taken[k] += 1
        out.append(k)
    return out


@pytest.mark.parametrize("weights", [[1.0, 1.0, 1.0], [2.0, 1.0], [3.0, 1.0, 0.5], [0.7, 1.3]])
def test_weighted_turns_against_a_slot_by_slot_reference(weights):
    turns = weighted_turns(weights, 500)
    assert turns.tolist() == greedy_turns(weights, 500)
    share = np.asarray(weights) / sum(weights)
    for end in range(1, 501):  # every prefix holds each source's share to within one slot
        held = np.bincount(turns[:end], minlength=len(weights))
        assert np.all(np.abs(held - end * share) < 1.0 + 1e-9), (end, held)


def test_equal_weights_are_plain_round_robin():
    """Weights all 1 keep the sampler's old rule exactly (slot j of an epoch to source j % k): runs made before
    task weights existed draw the same batches."""
    sampler = MultiTaskBatchSampler(SIZES, 7, "round_robin", group_by_length=False, num_batches=30)
    slots = np.arange(30 * 7) % 3
    expected = np.stack([np.bincount(b, minlength=3) for b in slots.reshape(30, 7)])
    assert np.array_equal(sampler.batch_mix(0), expected)
    assert np.array_equal(weighted_turns([1.0] * 3, 210), slots)


@pytest.mark.parametrize("strategy", ["proportional", "temperature", "round_robin"])
def test_sampling_weights_scale_each_source_share(strategy):
    weights = [1.0, 3.0, 2.0]
    base = {"proportional": np.array(SIZES, float), "temperature": np.array(SIZES, float) ** 0.5}.get(
        strategy, np.ones(3)
    )
    expected = base * weights / (base * weights).sum()
    assert np.allclose(source_probabilities(SIZES, strategy, 2.0, weights), expected)
    sampler = MultiTaskBatchSampler(SIZES, 16, strategy, group_by_length=False, num_batches=400, weights=weights)
    drawn = np.concatenate([np.array(b) for b in batches_of(sampler)])
    share = np.bincount(source_of(drawn, SIZES), minlength=3) / len(drawn)
    assert np.allclose(share, expected, atol=0.02 if strategy != "round_robin" else 1 / len(drawn)), share


def test_weighted_round_robin_resumes_where_an_unbroken_run_stands():
    """A fresh sampler set to epoch e draws what the unbroken one does (resume), with weights too."""
    lengths = np.random.default_rng(2).integers(5, 60, sum(SIZES))

    def make():
        return MultiTaskBatchSampler(SIZES, 8, "round_robin", lengths=lengths, seed=4, window=4, weights=[2, 1, 1])

    unbroken = make()
    seen = [batches_of(unbroken, e) for e in range(4)]
    assert batches_of(make(), 3) == seen[3]


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="one positive weight per source"):
        MultiTaskBatchSampler(SIZES, 8, weights=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="one positive weight per source"):
        MultiTaskBatchSampler(SIZES, 8, weights=[1.0, 1.0])
