"""The sharded tensor store shared by the state cache and the distillation targets: entries by key across
instances, the user's check, and shards that vanish or go bad between indexing and reading."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from mtl_decoder.tensorstore import ShardedStore, entry_key


def test_entries_are_indexed_by_key_and_read_back_across_instances(tmp_path):
    store = ShardedStore(tmp_path)
    first = store.write({"a/x": torch.ones(2), "a/y": torch.zeros(3, 2), "b": torch.arange(4)})
    second = store.write({"c/x": torch.full((1,), 2.0)})
    reader = ShardedStore(tmp_path)
    assert dict(reader.location) == {"a": first, "b": first, "c": second} and entry_key("a/x/z") == "a"
    got = reader.read_shard(first)
    assert got.keys() == {"a/x", "a/y", "b"} and torch.equal(got["b"], torch.arange(4))
    assert torch.equal(reader.read("c/x"), torch.full((1,), 2.0)) and reader.read("d") is None


def test_the_users_check_decides_and_a_vanished_shard_reads_as_absent(tmp_path, capsys):
    ShardedStore(tmp_path).write({"a": torch.ones(2)})
    ShardedStore(tmp_path).write({"b": -torch.ones(2)})
    reader = ShardedStore(
        tmp_path, check=lambda ts: "negative" if any(bool((t < 0).any()) for t in ts.values()) else None
    )
    other = ShardedStore(tmp_path)
    assert torch.equal(reader.read("a"), torch.ones(2)) and reader.read("b") is None
    assert "(negative); set aside as" in capsys.readouterr().err and "b" not in reader
    other.check = reader.check
    assert other.read("b") is None and "already set aside by another process" in capsys.readouterr().err
    assert [p.name.endswith(".damaged") for p in sorted(tmp_path.iterdir())].count(True) == 1


def test_a_shard_is_read_as_views_of_one_mapping_that_writes_never_reach(tmp_path):
    """read_shard maps the file once (not a mapping per tensor, not a copy): every dtype and shape the writer takes
    comes back equal to safetensors' own reader, and a write to a tensor read stays in this process."""
    tensors = {
        "a/x": torch.randn(3, 5),
        "a/y": torch.randn(2, dtype=torch.float64),
        "b/h": torch.randn(4, 2).to(torch.bfloat16),
        "b/i": torch.arange(7, dtype=torch.int64),
        "b/m": torch.tensor([True, False, True]),
        "c": torch.tensor(2.5, dtype=torch.float16),
        "d": torch.zeros(0, 4),
    }
    shard = ShardedStore(tmp_path).write(tensors)
    got = ShardedStore(tmp_path).read_shard(shard)
    reference = load_file(shard)
    assert got.keys() == reference.keys() == tensors.keys()
    for name, t in reference.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t)
    assert len({t.untyped_storage().data_ptr() for t in got.values()}) == 1  # one mapping for the whole shard
    got["a/x"].fill_(7.0)
    assert torch.equal(load_file(shard)["a/x"], tensors["a/x"])
    assert torch.equal(ShardedStore(tmp_path).read_shard(shard)["a/x"], tensors["a/x"])
