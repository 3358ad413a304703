"""The sharded tensor store shared by the state cache and the distillation targets: entries by key across
instances, the user's check, and shards that vanish or go bad between indexing and reading."""

from __future__ import annotations

import torch

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
