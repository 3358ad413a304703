"""Pretrained trunks: tiny random Llama / Qwen2 / GPT-2 checkpoints loaded through transformers' own classes."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import FAMILIES, assert_fp16_rounded, tiny_checkpoint

from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [["EU", "rejects", "German", "call", "."], "Peter Blackburn went home.", ["Rain"]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {family: tiny_checkpoint(root / family, family) for family in FAMILIES}


def _model(checkpoint: Path, tmp: Path, *overrides: str):
    cfg = tiny_config(
        tmp / "run", [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={tmp}/cache", *overrides]
    )
    encoder = TextEncoder.for_model(load_tokenizer(cfg.model.trunk), cfg.model, cfg.data.max_length)
    return build_model(cfg, LABELS, encoder).eval(), encoder


def _batch(encoder: TextEncoder) -> tuple[torch.Tensor, torch.Tensor]:
    encoded = encoder.encode_batch(ITEMS)
    T = max(len(e.ids) for e in encoded)
    ids = torch.zeros(len(encoded), T, dtype=torch.long)
    mask = torch.zeros(len(encoded), T, dtype=torch.bool)
    for i, e in enumerate(encoded):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = True
    return ids, mask


def _reference(checkpoint: Path, ids, mask, causal: bool, layers: int | None = None) -> torch.Tensor:
    from transformers import AutoModel

    extra = {} if layers is None else {"num_hidden_layers": layers}
    ref = AutoModel.from_pretrained(checkpoint, **extra).eval()
    with torch.no_grad():
        return ref(input_ids=ids, attention_mask=mask.long(), is_causal=causal).last_hidden_state


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["upcycle", "lora"])
@pytest.mark.parametrize("ffn", ["ple", "cgc", "mmoe", "cgc_stacked", "mlp"])
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_step_zero_computes_the_pretrained_function(checkpoints, tmp_path, family, mode, ffn, attention):
    """Every task route's hidden states equal AutoModel's (causal mask lifted or not) before any training."""
    model, encoder = _model(checkpoints[family], tmp_path, f"model.trunk.mode={mode}", f"model.ffn={ffn}",
                            f"model.attention={attention}")  # fmt: skip
    ids, mask = _batch(encoder)
    layout = model.route_layout(mask, model.task_names, None)
    with torch.no_grad():
        hidden, gates = model.encode(ids, mask, layout, {})
    expected = _reference(checkpoints[family], ids, mask, causal=attention == "causal")
    task_routes = [r for r in layout.names if r != SHARED or ffn == "mlp"]  # ple's shared route is not read
    assert task_routes
    for route in task_routes:
        rows = layout.rows(route)
        for row, example in zip(range(rows.start, rows.stop), layout.row_example[rows].tolist(), strict=True):
            real = mask[example]
            torch.testing.assert_close(hidden[row][real], expected[example][real], atol=1e-5, rtol=1e-5)
    # gates in every block (ple), in the top block only (single-level cgc, mmoe: the others keep their MLP), or none
    assert [bool(g) for g in gates] == {
        "ple": [True] * 2,
        "cgc_stacked": [True] * 2,
        "cgc": [False, True],
        "mmoe": [False, True],
    }.get(ffn, [False, False])
    assert [b is not None for b in model.expert_blocks()] == [bool(g) for g in gates]


def test_bidirectional_differs_from_causal(checkpoints, tmp_path):
    """The causal mask really is lifted: the first token sees the others."""
    causal, encoder = _model(checkpoints["llama"], tmp_path, "model.trunk.mode=upcycle", "model.attention=causal")
    both, _ = _model(checkpoints["llama"], tmp_path, "model.trunk.mode=upcycle", "model.attention=bidirectional")
    ids, mask = _batch(encoder)
    with torch.no_grad():
        a, _ = causal.encode(ids, mask, causal.route_layout(mask, causal.task_names, None), {})
        b, _ = both.encode(ids, mask, both.route_layout(mask, both.task_names, None), {})
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-3


def test_layers_keeps_the_first_blocks(checkpoints, tmp_path):
    model, encoder = _model(checkpoints["qwen2"], tmp_path, "model.trunk.mode=upcycle", "model.trunk.layers=1")
    ids, mask = _batch(encoder)
    layout = model.route_layout(mask, model.task_names, None)
    with torch.no_grad():
        hidden, gates = model.encode(ids, mask, layout, {})
    expected = _reference(checkpoints["qwen2"], ids, mask, causal=False, layers=1)
    row = layout.rows("ner").start
    torch.testing.assert_close(hidden[row][mask[0]], expected[0][mask[0]], atol=1e-5, rtol=1e-5)
    assert len(gates) == 1 and model.identity.layers == 1


def test_lora_trains_only_updates_gates_and_heads(checkpoints, tmp_path):
    model, _ = _model(checkpoints["llama"], tmp_path, "model.trunk.mode=lora", "model.trunk.lora_attention=true")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    gates = re.compile(r"\.(task_gates\.\w+|shared_gate)\.proj\.")
    assert trainable and all("lora_" in n or gates.search(n) or n.startswith(("heads.", "crfs.")) for n in trainable)
    assert any(gates.search(n) for n in trainable) and any("lora_" in n for n in trainable)
    assert any("self_attn" in n for n in trainable)  # lora_attention puts updates on the attention projections
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    base = sum(p.numel() for p in _reference_model(checkpoints["llama"]).parameters())
    assert frozen == base  # the experts share the frozen MLP: memory close to the base model's


def _reference_model(checkpoint: Path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(checkpoint)


def test_frozen_states_are_cached_and_shared_between_models(checkpoints, tmp_path):
    model, encoder = _model(checkpoints["gpt2"], tmp_path, "model.trunk.mode=frozen", "model.trunk.layers=1")
    ids, mask = _batch(encoder)
    states = model.states
    computed, _ = states.precompute([row[m].tolist() for row, m in zip(ids, mask, strict=True)])
    assert computed == len(ITEMS)
    got = states(ids, mask)
    expected = _reference(checkpoints["gpt2"], ids, mask, causal=True, layers=1)
    for i in range(len(ITEMS)):  # stored in float16: AutoModel's values to float16's rounding, elementwise
        assert_fp16_rounded(got[i][mask[i]], expected[i][mask[i]])  # measured: at most 0.98 of the bound
    again, _ = _model(checkpoints["gpt2"], tmp_path, "model.trunk.mode=frozen", "model.trunk.layers=1")
    assert again.states.cache.directory == states.cache.directory
    torch.testing.assert_close(again.states(ids, mask), got)
    assert again.states.cache.misses == 0  # read from the shards the first model wrote
    assert not any(p is q for p in model.parameters() for q in states.base.parameters())  # not trained, not saved


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def test_upcycled_copies_become_different_experts(checkpoints, tmp_path):
    """Copies of one MLP under a zero-weight gate would get identical gradients forever; random gate weights give
    each copy its own, while step 0 still computes the pretrained function (test above).

    Plain SGD moves a copy by lr * its gradient each step, so after k steps two copies are apart by lr times the sum
    of their gradients' differences. Measured here (lr 0.1, 4 steps, both blocks' two shared copies): the copies'
    gradients differ by 11-14% of their norm at every step, the copies end 0.106-0.112 x the length of copy a's
    path (the sum of its per-step updates) apart, and their outputs on one input differ by 4-7e-4 of their norm,
    1,700-3,100 x the float32 rounding of that output (measured against float64). The bounds: 0.03 x the path,
    300 x the rounding. Copies that stayed the same (zero gate weights), or moved apart by float noise, fail both."""
    lr, steps = 0.1, 4
    model, encoder = _model(checkpoints["llama"], tmp_path, "model.trunk.mode=upcycle", "model.n_shared_experts=2")
    model.train()
    ids, mask = _batch(encoder)
    labels = {"sentiment": torch.tensor([0, 1, 1])}
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    pairs = [block.shared.experts for block in model.expert_blocks()]
    assert len(pairs) == 2 and all(len(pair) == 2 for pair in pairs)
    assert all(torch.equal(_flat(a), _flat(b)) for a, b in pairs)  # exact copies at step 0
    path = [0.0] * len(pairs)  # the length of each pair's first copy's path: sum_t lr * ||grad_t||
    for _ in range(steps):
        before = [_flat(a) for a, _ in pairs]
        optimizer.zero_grad()
        model(ids, mask, labels=labels).loss.backward()
        optimizer.step()
        for i, (a, _) in enumerate(pairs):
            path[i] += (_flat(a) - before[i]).norm().item()
    x = torch.randn(7, model.identity.hidden_size, generator=torch.Generator().manual_seed(0))
    for (a, b), length in zip(pairs, path, strict=True):
        assert length > 0
        apart = (_flat(a) - _flat(b)).norm().item()
        assert apart > 0.03 * length, f"the copies are {apart:.3g} apart after a path of {length:.3g}"
        with torch.no_grad():
            ya, yb = a(x), b(x)
            exact = copy.deepcopy(a).double()(x.double())  # copy a's output in float64: its float32 rounding
        rounding = ((ya.double() - exact).norm() / exact.norm()).item()
        differ = ((ya - yb).norm() / ya.norm()).item()
        assert differ > 300 * rounding, f"the copies' outputs differ by {differ:.3g}, float32 rounding {rounding:.3g}"
