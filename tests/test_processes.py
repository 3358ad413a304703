"""Which records a process takes (mtl_decoder.processes.Share), against a brute-force dealing of blocks."""

from __future__ import annotations

import pytest

from mtl_decoder.errors import UserError
from mtl_decoder.processes import Processes, Share


def dealt(n: int, block: int, shards: int, world: int) -> dict[tuple[int, int], list[int]]:
    """(shard, rank) -> positions, dealing block after block: shard b mod N, then the shard's j-th block to
    rank j mod world."""
    out: dict[tuple[int, int], list[int]] = {(k, r): [] for k in range(shards) for r in range(world)}
    blocks = [list(range(s, min(s + block, n))) for s in range(0, n, block)]
    taken = [0] * shards
    for b, positions in enumerate(blocks):
        k = b % shards
        out[(k, taken[k] % world)] += positions
        taken[k] += 1
    return out


@pytest.mark.parametrize("n", [0, 1, 5, 64, 65, 300])
@pytest.mark.parametrize("block,shards,world", [(1, 1, 1), (8, 1, 2), (8, 3, 1), (16, 2, 3), (64, 1, 4)])
def test_every_position_is_taken_once_as_blocks_dealt_in_turn(n, block, shards, world):
    reference = dealt(n, block, shards, world)
    for (k, r), expected in reference.items():
        share = Share(block, k, shards, r, world)
        assert [p for p in range(n) if share.owns(p)] == expected
        in_shard = sorted(p for q in range(world) for p in reference[(k, q)])
        assert [p for p in range(n) if share.in_shard(p)] == in_shard
        # rounds: the most blocks any process of the shard holds
        most = max(len({p // block for p in reference[(k, q)]}) for q in range(world))
        assert share.rounds(n) == most


@pytest.mark.parametrize("n,block,world", [(0, 4, 2), (7, 2, 3), (100, 8, 2), (9, 16, 4)])
def test_take_then_restore_gives_the_items_back_in_order(n, block, world):
    items = [f"item{i}" for i in range(n)]
    parts = [Share(block, rank=r, world=world).take(items) for r in range(world)]
    assert sorted(item for part in parts for item in part) == sorted(items)
    assert Share(block, rank=0, world=world).restore(parts, n) == items


def test_one_process_gathers_to_itself_and_bad_shares_are_refused():
    alone = Processes()
    assert alone.is_main and alone.gather("x") == ["x"] and alone.all_gather(3) == [3] and alone.broadcast(4) == 4
    with pytest.raises(UserError, match="shard must be K/N with 0 <= K < N, got 2/2"):
        Share(8, 2, 2)
    with pytest.raises(UserError, match="block must be at least 1"):
        Share(0)
