"""The gate table: bucketed mean gate weights, the real gate near bucket edges, experts under the threshold skipped;
exact where it must be, files without pickles, refused on another model, and the two commands."""

from __future__ import annotations

import json
import math

import pytest
import torch
from stream_testkit import fixture_texts, saved_model

from mtl_decoder.cli import main
from mtl_decoder.config import VARIANTS
from mtl_decoder.errors import UserError
from mtl_decoder.inference import Predictor
from mtl_decoder.inference.gate_apply import _TableBlock, apply_gate_table, remove_gate_table
from mtl_decoder.inference.gate_build import _bucket, build_gate_table
from mtl_decoder.inference.gate_table import (
    GateEntry,
    GateStats,
    GateTable,
    table_paths,
)
from mtl_decoder.model import SHARED, ExpertBlock, Gate, RouteLayout
from mtl_decoder.model.gates import reference_forward
from mtl_decoder.saved import load_model

GATED = [name for name, v in VARIANTS.items() if v.gated]
TEXTS = fixture_texts()[:40]


def _model(tmp_path, ffn: str, seed: int = 0):
    return load_model(saved_model(tmp_path, [f"model.ffn={ffn}", "model.n_layers=3"], seed=seed))


def _logits(saved) -> list[dict[str, torch.Tensor]]:
    out = []
    predictor = Predictor.from_saved(saved, batch_size=8, workers=1)
    list(predictor.predict(TEXTS[:12], on_batch=lambda o, b: out.append({k: v.clone() for k, v in o.logits.items()})))
    return out


def _largest_difference(a, b) -> float:
    """The largest difference of two runs' logits, relative to 1 + |logit| (float rounding grows with the scale)."""
    return max(((x[k] - y[k]).abs() / (1 + y[k].abs())).max().item() for x, y in zip(a, b, strict=True) for k in x)


def _always_real_gates(table: GateTable) -> GateTable:
    for entry in table.entries.values():  # no norm lies inside (low, high): every token is outside the sample's range
        entry.low, entry.high = math.inf, -math.inf
    return table


@pytest.mark.parametrize("ffn", GATED)
def test_real_gates_and_no_threshold_give_the_exact_model(tmp_path, ffn):
    """With every token's real gate and nothing skipped, the table's per-expert execution is the exact block."""
    saved = _model(tmp_path, ffn)
    exact = _logits(saved)
    stats = apply_gate_table(saved, _always_real_gates(build_gate_table(saved, TEXTS, buckets=4)), threshold=0.0)
    assert _largest_difference(exact, _logits(saved)) < 1e-5
    assert stats.full_gate_share == 1.0 and stats.skipped_share == 0.0 and stats.tokens > 0
    remove_gate_table(saved)
    assert _largest_difference(exact, _logits(saved)) == 0.0  # back to the exact blocks


@pytest.mark.parametrize("ffn", GATED)
def test_a_threshold_skips_the_experts_a_gate_leaves_out(tmp_path, ffn):
    """Gates made nearly one-hot (their weights scaled up: most experts get a weight that underflows to 0 or next to
    it, a different set per token): the table, with real gates and a tiny threshold, skips those experts token by
    token and still gives the exact model's outputs (whatever way the exact block computes its gates)."""
    saved = _model(tmp_path, ffn, seed=1)
    with torch.no_grad():
        for module in saved.model.modules():
            if isinstance(module, Gate):
                module.proj.weight.mul_(300.0)
    exact = _logits(saved)
    stats = apply_gate_table(saved, _always_real_gates(build_gate_table(saved, TEXTS, buckets=4)), threshold=1e-7)
    # rounding: logits 300 times larger make the gates' last bits matter (skipping a real expert would cost ~0.1)
    assert _largest_difference(exact, _logits(saved)) < 1e-3
    assert stats.skipped_share > 0.2, stats.to_dict()


def test_a_token_inside_a_bucket_reads_its_mean_and_one_near_an_edge_runs_the_gate():
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    weights = torch.tensor([[0.9, 0.1]] * 4 + [[0.2, 0.8]] * 4)
    entry = _bucket(norms, weights, buckets=2, experts=["a/0", "shared/0"])
    assert entry.edges.tolist() == [4.5] and entry.counts.tolist() == [4, 4]
    assert torch.allclose(entry.means, torch.tensor([[0.9, 0.1], [0.2, 0.8]]))
    assert (entry.low, entry.high) == (1.0, 8.0)

    class Block:  # what _weights needs of an expert block: the gate it replaces
        def __init__(self):
            self.shared_gate = None
            self.task_gates = {"a": lambda x: torch.tensor([[0.5, 0.5]]).expand(len(x), 2)}

    stats = GateStats()
    table = _TableBlock(Block(), {"a": entry}, threshold=0.0, margin=0.1, stats=stats)
    # norms 2.0 (inside bucket 0), 4.4 (0.1 from the edge 4.5: within 0.1 x width 3.5), 7.0 (inside 1), 9.0 (outside)
    x = torch.zeros(4, 4)
    x[:, 0] = torch.tensor([2.0, 4.4, 7.0, 9.0])
    w = table._weights("a", x, Block())
    assert torch.allclose(w, torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8], [0.5, 0.5]]))
    assert stats.tokens == 4 and stats.full_gates == 2
    table.threshold = 0.15  # 0.1 is dropped, the rest renormalised
    assert torch.allclose(table._weights("a", x[:1], Block()), torch.tensor([[1.0, 0.0]]))
    table.threshold, table.margin = 0.0, 0.5  # --edge-margin 0.5: every token's real gate
    assert torch.allclose(table._weights("a", x, Block()), torch.full((4, 2), 0.5))


def _block(variant: str, shared_gate: bool, fork: bool) -> tuple[ExpertBlock, torch.Tensor, RouteLayout]:
    """A float64 expert block with random weights and peaked gates, and a layout of four examples (cgc/mmoe: routes
    that overlap); at a fork x holds the shared bottom's tokens."""
    torch.manual_seed(0)
    block = ExpertBlock(variant, ["a", "b", "c"], 6, 2, 3, 4, 0.6, shared_gate).double()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
        for gate in [*block.task_gates.values(), block.shared_gate]:
            if gate is not None:
                gate.proj.weight.mul_(4.0)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    everyone = torch.arange(4)
    routes = {"a": everyone, "c": torch.tensor([1, 2])}
    if block.variant.shared_route:
        routes = {"a": everyone, "b": everyone, "c": everyone, SHARED: everyone}
    layout = RouteLayout.build(routes, mask, fork=fork)
    rows = layout.bottom.token_index if fork else layout.token_index
    return block, torch.randn(len(rows), 6, dtype=torch.float64), layout


@pytest.mark.parametrize(
    ("variant", "shared_gate", "fork"),
    [("ple", True, False), ("ple", False, True), ("cgc", True, False), ("cgc", True, True), ("mmoe", True, True)],
)
def test_the_tables_sparse_mix_equals_the_reference_mix_of_its_weights(variant, shared_gate, fork):
    """The table's expert-by-expert execution (each expert only on the tokens that kept it) against the reference
    block (model/gates.py) mixing every expert with the same weights, in float64: the experts it skipped weigh 0."""
    block, x, layout = _block(variant, shared_gate, fork)
    entries = {}
    for route in block.route_plan(layout, fork):
        if route.gate is not None:  # an empty sample range: every token runs its real gate
            experts = block.expert_names(route.name, ["a", "b", "c"])
            uniform = torch.full((1, len(experts)), 1 / len(experts))
            entries[route.name] = GateEntry(torch.zeros(0), math.inf, -math.inf, uniform, torch.ones(1), experts)
    stats = GateStats()
    with torch.no_grad():
        out, gates = _TableBlock(block, entries, threshold=0.2, margin=0.1, stats=stats)(x, layout, fork)
        ref, _ = reference_forward(block, x, layout, fork, weights=gates)
    assert out.dtype == torch.float64 and out.abs().max() > 1e-2
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    assert 0 < stats.expert_rows_run < stats.expert_rows  # experts were skipped
    assert all(bool(((w == 0) | (w >= 0.2)).all()) for w in gates.values())


def test_files_round_trip_without_pickles_and_are_refused_on_another_model(tmp_path):
    saved = _model(tmp_path / "a", "ple")
    table = build_gate_table(saved, TEXTS, buckets=3, threshold=0.2, edge_margin=0.05, sample={"input": "x"})
    tensors, meta = table.save(tmp_path / "gates")
    assert (tensors, meta) == table_paths(tmp_path / "gates.safetensors") == table_paths(tmp_path / "gates.json")
    assert tensors.read_bytes()[8:9] == b"{"  # a safetensors header (JSON), not a pickle
    info = json.loads(meta.read_text(encoding="utf-8"))
    assert info["buckets"] == 3 and info["threshold"] == 0.2 and info["sample"]["records"] == len(TEXTS)
    assert len(info["gates"]) == len(table.entries) and info["weights_sha256"]
    loaded = GateTable.load(tmp_path / "gates")
    for key, entry in table.entries.items():
        assert torch.equal(loaded.entries[key].means, entry.means) and loaded.entries[key].experts == entry.experts
    other = _model(tmp_path / "b", "ple", seed=9)
    with pytest.raises(UserError, match="built from another model"):
        apply_gate_table(other, tmp_path / "gates")
    cgc = _model(tmp_path / "c", "cgc")
    loaded.weights_sha256 = None
    with pytest.raises(UserError, match="not this model's"):
        apply_gate_table(cgc, loaded)
    meta.write_text("{broken", encoding="utf-8")
    with pytest.raises(UserError, match="not a readable gate table"):
        GateTable.load(tmp_path / "gates")
    with pytest.raises(UserError, match="no such file"):
        GateTable.load(tmp_path / "missing")


def test_build_gate_table_and_predict_with_it_through_the_cli(tmp_path, capsys):
    model = saved_model(tmp_path, ["model.ffn=ple"])
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    table = tmp_path / "gates"
    args = ["build-gate-table", "--model", str(model), "--input", str(sample), "--output", str(table)]
    assert main([*args, "--buckets", "4", "--threshold", "0.2"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(args) == 2 and "already exists" in capsys.readouterr().err
    out = tmp_path / "out.jsonl"
    predict = ["predict", "--model", str(model), "--input", str(sample), "--output", str(out)]
    assert main([*predict, "--gate-table", str(table)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(TEXTS) and "ner" in json.loads(lines[0])["predictions"]
    mlp = saved_model(tmp_path / "mlp", ["model.ffn=mlp"])
    assert main(["build-gate-table", "--model", str(mlp), "--input", str(sample), "--output", str(tmp_path / "t")]) == 2
    assert "no gates" in capsys.readouterr().err
