"""The KV cache under the trunk: cached incremental hidden states equal the full forward pass for every ffn variant,
one stream or several of different lengths in a batch (each its own history), allocated once and filled in place,
and the work per token stays flat as the stream grows."""

from __future__ import annotations

import pytest
import torch
from model_testkit import perturb, tiny_model
from torch.utils.flop_counter import FlopCounterMode

from mtl_decoder.config import VARIANTS
from mtl_decoder.errors import UserError

POSITIONS = [
    {},
    {"position_embedding": "linear", "position_embedding_where": "every_layer"},
    {"position_embedding": "linear_only"},
]


def _model(ffn: str, **overrides):
    torch.manual_seed(0)
    return perturb(tiny_model(ffn=ffn, attention="causal", n_layers=3, **overrides)).eval()


def _stream(model, ids: torch.Tensor, lengths: list[int], capacity: int, seed: int) -> list[torch.Tensor]:
    """Feed each row's tokens in random-sized steps (rows advance by different amounts, some not at all) and
    return each row's hidden states on every route, (routes, length_b, C), in position order."""
    B = len(lengths)
    cache = model.new_cache(B, capacity)
    gen = torch.Generator().manual_seed(seed)
    done = [0] * B
    pieces: list[list[torch.Tensor]] = [[] for _ in range(B)]
    while any(d < n for d, n in zip(done, lengths, strict=True)):
        take = [min(int(torch.randint(0, 5, (1,), generator=gen)), n - d) for d, n in zip(done, lengths, strict=True)]
        t = max(take)
        if t == 0:
            continue
        step_ids = torch.zeros(B, t, dtype=torch.long)
        step_mask = torch.zeros(B, t, dtype=torch.bool)
        for b in range(B):
            step_ids[b, : take[b]] = ids[b, done[b] : done[b] + take[b]]
            step_mask[b, : take[b]] = True
        layout = model.route_layout(step_mask, model.task_names, None)
        h, _ = model.encode_step(step_ids, step_mask, layout, {}, cache)
        for b in range(B):
            pieces[b].append(h[layout.row_example == b][:, : take[b]])
            done[b] += take[b]
    assert cache.lengths.tolist() == lengths
    return [torch.cat(p, dim=1) for p in pieces]


@pytest.mark.parametrize("positions", POSITIONS, ids=["rope", "linear_every_layer", "linear_only"])
@pytest.mark.parametrize("lengths", [[13], [13, 5, 9]], ids=["batch1", "batch3"])
@pytest.mark.parametrize("ffn", list(VARIANTS))
@torch.no_grad()
def test_cached_steps_equal_the_full_forward_pass(ffn, lengths, positions):
    model = _model(ffn, **positions)
    B, T = len(lengths), max(lengths)
    ids = torch.randint(1, 40, (B, T), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(T) < torch.tensor(lengths)[:, None]
    ids = ids.masked_fill(~mask, 0)
    layout = model.route_layout(mask, model.task_names, None)
    full, _ = model.encode(ids, mask, layout, {})
    streamed = _stream(model, ids, lengths, capacity=16, seed=len(lengths))
    for b, n in enumerate(lengths):
        expected = full[layout.row_example == b][:, :n]
        assert streamed[b].shape == expected.shape
        assert (streamed[b] - expected).abs().max() < 1e-5, f"stream {b} differs from the full pass"


@torch.no_grad()
def test_each_stream_keeps_its_own_history():
    """Two streams with different tokens in one batch: each one's states are those it has alone (a cache shared or
    broadcast across the batch would give the second stream the first one's keys)."""
    model = _model("ple")
    ids = torch.randint(1, 40, (2, 10), generator=torch.Generator().manual_seed(2))
    together = _stream(model, ids, [10, 7], capacity=12, seed=3)
    for b, n in enumerate([10, 7]):
        alone = _stream(model, ids[b : b + 1], [n], capacity=12, seed=4)[0]
        assert (together[b] - alone).abs().max() < 1e-5


@torch.no_grad()
def test_cache_is_allocated_once_and_its_memory_stays_flat():
    model = _model("ple")
    capacity, B = 24, 2
    cache = model.new_cache(B, capacity)
    storages = [(layer.k.data_ptr(), layer.v.data_ptr()) for layer in cache.layers]
    nbytes = cache.nbytes()
    C, layout_rows = model.cfg.d_model, [len(r) for r in cache.layer_rows]
    assert nbytes == sum(2 * rows * capacity * C * 4 for rows in layout_rows)  # float32 keys and values
    assert layout_rows[-1] == B * len(
        model.route_layout(torch.ones(B, 1, dtype=torch.bool), model.task_names, None).names
    )
    for _ in range(capacity):
        ids, mask = torch.randint(1, 40, (B, 1)), torch.ones(B, 1, dtype=torch.bool)
        model.encode_step(ids, mask, model.route_layout(mask, model.task_names, None), {}, cache)
        assert cache.nbytes() == nbytes
        assert [(layer.k.data_ptr(), layer.v.data_ptr()) for layer in cache.layers] == storages
    assert cache.lengths.tolist() == [capacity] * B
    with pytest.raises(ValueError, match="capacity"):  # the caller applies the max-length policy, never a resize
        model.encode_step(ids, mask, model.route_layout(mask, model.task_names, None), {}, cache)
    cache.reset()
    model.encode_step(ids, mask, model.route_layout(mask, model.task_names, None), {}, cache)
    assert [(layer.k.data_ptr(), layer.v.data_ptr()) for layer in cache.layers] == storages


@torch.no_grad()
def test_work_per_token_stays_flat_up_to_the_maximum_length():
    """One token at a time: the matrix work outside attention is the same at every position (only the new token
    runs through the layers), and attention reads one more cached key per position, never more than the capacity;
    re-running the whole prefix instead would grow with the position."""
    model = _model("ple")
    capacity = 48
    cache = model.new_cache(1, capacity)
    flops, keys = [], []
    mask = torch.ones(1, 1, dtype=torch.bool)
    layout = model.route_layout(mask, model.task_names, None)
    for _ in range(capacity):
        keys.append(next(iter(cache.step(mask, model.rope).values())).keys)
        with FlopCounterMode(display=False) as counter:
            model.encode_step(torch.randint(1, 40, (1, 1)), mask, layout, {}, cache)
        flops.append(counter.get_total_flops())
    assert len(set(flops)) == 1 and flops[0] > 0
    assert keys == list(range(1, capacity + 1))
    full_mask = torch.ones(1, capacity, dtype=torch.bool)
    with FlopCounterMode(display=False) as counter:
        model.encode(
            torch.randint(1, 40, (1, capacity)), full_mask, model.route_layout(full_mask, model.task_names, None), {}
        )
    assert counter.get_total_flops() >= capacity * flops[0]  # what a re-run of the prefix would cost per token


def test_bidirectional_model_has_no_cache():
    model = tiny_model(attention="bidirectional")
    with pytest.raises(UserError, match="causal"):
        model.new_cache(1, 8)
