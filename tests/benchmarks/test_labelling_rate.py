"""benchmarks/labelling_rate.py reads a target cache's shards: each one's write time, writer, texts and words, and
each writer's rate from its own shards."""

from __future__ import annotations

import os

import labelling_rate
import pytest
import torch

from mtl_decoder.distill.targets import SPANS, TargetStore, text_key


def test_each_shard_counts_its_texts_and_words_in_write_order(tmp_path):
    store = TargetStore(tmp_path / "t", flush_every=3)
    for i in range(7):  # shards of 3, 3 and 1 texts; text i has i + 1 words (spans) and a sentence target
        spans = torch.zeros(i + 1, 2, dtype=torch.int64)
        store.put(text_key(f"t{i}"), {"sentiment": torch.tensor([0.5, 0.5]).half(), SPANS: spans})
    store.flush()
    times = labelling_rate.shard_times(tmp_path / "t")
    assert [(n, w) for _, n, w, _ in times] == [(3, 1 + 2 + 3), (3, 4 + 5 + 6), (1, 7)]
    assert times == sorted(times) and len({t for t, *_ in times}) == 3
    assert {pid for *_, pid in times} == {str(os.getpid())}


def test_each_writer_is_timed_from_its_own_first_shard():
    minute = 60 * 10**9
    times = [(0, 5, 50, "a"), (1 * minute, 4, 40, "b"), (2 * minute, 6, 60, "a"), (5 * minute, 8, 80, "b"),
             (4 * minute, 2, 20, "a"), (9 * minute, 1, 10, "c")]  # fmt: skip
    rates = labelling_rate.writer_rates(sorted(times))
    assert set(rates) == {"a", "b"}  # c wrote one shard: no interval
    assert rates["a"]["timed_texts"] == 8 and rates["a"]["timed_minutes"] == 4
    assert rates["a"]["texts_per_minute"] == 2.0 and rates["a"]["words_per_s"] == pytest.approx(80 / 240, abs=0.05)
    assert rates["b"]["timed_words"] == 80 and rates["b"]["timed_minutes"] == 4 and rates["b"]["texts_per_minute"] == 2
