"""benchmarks/labelling_rate.py reads a target cache's shards: each one's write time and how many texts it holds."""

from __future__ import annotations

import labelling_rate
import torch

from mtl_decoder.distill.targets import TargetStore, text_key


def test_each_shard_counts_its_texts_in_write_order(tmp_path):
    store = TargetStore(tmp_path / "t", flush_every=3)
    for i in range(7):  # shards of 3, 3 and 1 texts, two tensors per text
        store.put(text_key(f"t{i}"), {"sentiment": torch.tensor([0.5, 0.5]).half(), "ner": torch.ones(2, 1).half()})
    store.flush()
    times = labelling_rate.shard_times(tmp_path / "t")
    assert [n for _, n in times] == [3, 3, 1]
    assert times == sorted(times) and len({t for t, _ in times}) == 3
