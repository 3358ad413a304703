"""``diagnose`` on the session's tiny trained run: a healthy model gets no fault, and each fault planted in a copy
of it (unmasked padding, a gate forced onto one expert, a zero-variance norm, a diagonal-stuck attention layer) is
reported as itself and as nothing else. Plus the pieces the verdicts rest on: the recomputed attention weights
reproduce SDPA, the SwiGLU gate inputs reproduce the experts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtl_decoder.cli import main
from mtl_decoder.diagnostics.checks import gate_verdicts, saturation_findings
from mtl_decoder.diagnostics.findings import codes
from mtl_decoder.diagnostics.model import JSON_FILE, REPORT_FILE, diagnose, diagnose_checkpoints
from mtl_decoder.diagnostics.probes import Probes, attention_weights, gate_preactivations
from mtl_decoder.model import ExpertGroup
from mtl_decoder.model.layers import RotaryEmbedding, SelfAttention
from mtl_decoder.saved import load_model, save_model
from mtl_decoder.training.checkpoints import checkpoint_dirs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def healthy(best, tmp_path_factory):
    return diagnose(best, output_dir=tmp_path_factory.mktemp("healthy"))


def planted(best: Path, folder: Path, plant) -> Path:
    """A copy of the model with ``plant(model)`` applied to its weights."""
    saved = load_model(best)
    with torch.no_grad():
        plant(saved.model)
    return save_model(folder, saved.model, saved.encoder, saved.config, saved.label_sets)


def new_faults(result, healthy) -> set[str]:
    return codes(result.findings) - codes(healthy.findings)


def test_healthy_model_report(healthy):
    assert codes(healthy.findings) == set(), [f.line() for f in healthy.findings]
    out = healthy.output_dir
    report = json.loads((out / JSON_FILE).read_text())
    assert report["summary"]["ok"] and report["examples"] == {"ner": 20, "sentiment": 20}
    norms = report["norms"]
    for layer in (0, 1):
        for sub in ("attn_norm", "attn", "ffn_norm", "ffn"):
            assert norms[f"layers.{layer}.{sub}"]["output_rms_mean"] > 0
    assert norms["layers.0.attn_norm"]["constant_channels"] == 0.0
    assert [h["head"] for h in report["attention"]["layers.1.attn"]] == [0, 1]
    assert all(0.0 <= h["normalised_entropy"] <= 1.0 + 1e-6 for h in report["attention"]["layers.0.attn"])
    assert set(report["gates"]["verdicts"]["layer_0"]) == {"ner", "sentiment", "shared"}
    assert report["padding"]["max_relative_change"] == {"ner": 0.0, "sentiment": 0.0}
    parts = report["profile"]["breakdown_ms"]
    assert {"attention", "experts", "gates", "heads", "other"} <= set(parts) and report["profile"]["forward_ms"] > 0
    text = (out / REPORT_FILE).read_text()
    assert "## Attention entropy per head" in text and "No problems found." in text
    pngs = sorted(p.name for p in out.glob("diagnose_*.png"))
    assert "diagnose_norms.png" in pngs and "diagnose_attention.png" in pngs
    assert all((out / p).read_bytes().startswith(PNG_SIGNATURE) for p in pngs)


def test_gate_forced_onto_one_expert(best, tmp_path, healthy):
    def plant(model):
        model.layers[0].ffn.task_gates["ner"].proj.bias.copy_(torch.tensor([12.0, -12.0, -12.0]))

    result = diagnose(planted(best, tmp_path / "m", plant), output_dir=tmp_path / "d", profile=False)
    assert new_faults(result, healthy) == {"collapsed_gate"}
    (finding,) = [f for f in result.findings if f.code == "collapsed_gate"]
    assert finding.where == "layer_0.ner" and "ner/0" in finding.message
    verdicts = result.report["gates"]["verdicts"]["layer_0"]
    assert verdicts == {"ner": "collapsed", "sentiment": "balanced", "shared": "balanced"}


def test_zero_variance_norm(best, tmp_path, healthy):
    result = diagnose(
        planted(best, tmp_path / "m", lambda m: m.layers[1].attn_norm.weight.zero_()),
        output_dir=tmp_path / "d",
        profile=False,
    )
    assert new_faults(result, healthy) == {"collapsed_norm"}
    assert [f.where for f in result.findings if f.code == "collapsed_norm"] == ["layers.1.attn_norm"]
    assert not result.ok


def test_unmasked_padding(best, tmp_path, healthy, monkeypatch):
    """Attention that ignores its padding mask (bidirectional mode): real tokens read the padding."""
    original = SelfAttention.forward

    def unmasked(self, x, mask, *args, **kwargs):
        return original(self, x, None, *args, **kwargs)

    monkeypatch.setattr(SelfAttention, "forward", unmasked)
    result = diagnose(best, output_dir=tmp_path / "d", profile=False)
    assert new_faults(result, healthy) == {"padding_leak"}
    assert all(v > 1e-3 for v in result.report["padding"]["max_relative_change"].values())
    monkeypatch.undo()
    assert main(["diagnose", "--model", str(best), "--output", str(tmp_path / "cli")]) == 0


def test_attention_stuck_on_the_diagonal(best, tmp_path, healthy):
    def plant(model):
        C = model.cfg.d_model
        weight = model.layers[1].attn.qkv.weight
        weight[:C] = 30 * torch.eye(C)  # queries = keys = a scaled copy of the token: each scores itself highest
        weight[C : 2 * C] = 30 * torch.eye(C)

    result = diagnose(planted(best, tmp_path / "m", plant), output_dir=tmp_path / "d", profile=False)
    assert new_faults(result, healthy) == {"diagonal_attention"}
    assert [f.where for f in result.findings if f.code == "diagonal_attention"] == ["layers.1.attn"]


def test_checkpoints_over_time(tiny_run, tmp_path):
    result = diagnose_checkpoints(tiny_run, output_dir=tmp_path, profile=False)
    steps = [int(p.name.split("-")[-1]) for p in checkpoint_dirs(tiny_run / "checkpoints")]
    assert [row["step"] for row in result.report["over_time"]] == steps and len(steps) >= 2
    assert all(row["faults"] == [] for row in result.report["over_time"])
    assert "## Over the run's checkpoints" in (tmp_path / REPORT_FILE).read_text()
    assert (tmp_path / "diagnose_over_time.png").is_file()


@pytest.mark.parametrize("causal", [False, True])
def test_recomputed_attention_weights_reproduce_sdpa(causal):
    torch.manual_seed(0)
    attn = SelfAttention(16, 2, causal=causal)
    x = torch.randn(3, 7, 16)
    mask = None if causal else torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5]).bool()[:, None, None, :]
    rope = RotaryEmbedding(8, 10000.0)(7)
    weights, visible = attention_weights(attn, x, mask, rope)
    v = attn.qkv(x).view(3, 7, 3, 2, 8).permute(2, 0, 3, 1, 4)[2]
    expected = attn(x, mask, rope)
    got = attn.out((weights @ v).transpose(1, 2).reshape(3, 7, 16))
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 2, 7))
    assert visible[1, 0, 0] == (1 if causal else 4)


def test_gate_preactivations_reproduce_the_experts():
    torch.manual_seed(0)
    group = ExpertGroup(3, 8, 5)
    torch.nn.init.normal_(group.w_out)
    x = torch.randn(6, 8)
    g = gate_preactivations(group, x)  # (M, E, H)
    up = (x @ group.w_in).view(6, 3, 2, 5)[:, :, 1]
    rebuilt = torch.einsum("meh,ehc->emc", F.silu(g) * up, group.w_out)
    assert torch.allclose(rebuilt, group(x), atol=1e-5)


def test_saturated_expert_units_are_counted_and_reported():
    torch.manual_seed(0)
    group = ExpertGroup(2, 8, 4)
    with torch.no_grad():
        gate_columns = group.w_in.view(8, 2, 2, 4)[:, 0, 0]  # expert 0's gate half
        gate_columns.fill_(-1.0)  # g = -(sum of x) < -4 for every token below
    x = torch.ones(10, 8) + 0.1 * torch.randn(10, 8)
    with Probes(group) as probes:
        group(x)
    stats = probes.summary()["saturation"][""]
    assert stats["saturated_share"][0] == 1.0 and stats["dead_units_share"][0] == 1.0
    assert stats["saturated_share"][1] < 0.5
    findings = saturation_findings({"layers.0.ffn.shared": stats})
    assert [(f.code, f.where) for f in findings] == [("dead_units", "layers.0.ffn.shared[0]")]


def gate(mean: dict[str, float], shared_share: float) -> dict:
    return {"mean": mean, "shared_share": shared_share, "dead_threshold": 0.25 / len(mean), "normalised_entropy": 0.5}


def test_gate_verdicts_from_utilisation_numbers():
    layer = {
        "ner": gate({"ner/0": 0.03, "shared/0": 0.89, "shared/1": 0.08}, 0.97),  # ignores its own expert
        "sentiment": gate({"sentiment/0": 0.4, "shared/0": 0.58, "shared/1": 0.02}, 0.6),
        "shared": gate({"ner/0": 0.3, "sentiment/0": 0.3, "shared/0": 0.38, "shared/1": 0.02}, 0.4),
    }
    verdicts, findings = gate_verdicts({"layer_1": layer})
    assert verdicts["layer_1"] == {"ner": "ignores own experts", "sentiment": "balanced", "shared": "balanced"}
    assert sorted((f.code, f.where) for f in findings) == [
        ("dead_expert", "layer_1.shared/1"),  # every gate that can use it gives it too little
        ("ignores_own_experts", "layer_1.ner"),
    ]


def test_data_flag_reads_a_task_from_a_given_file(best, tmp_path):
    test_file = Path(__file__).parents[1] / "fixtures" / "ner_test.jsonl"
    result = diagnose(best, data=[f"ner={test_file}"], output_dir=tmp_path, examples=5, profile=False)
    assert result.report["examples"] == {"ner": 5, "sentiment": 5}
    assert result.report["sources"]["ner"] == str(test_file)
    assert result.report["sources"]["sentiment"].endswith("sentiment_validation.jsonl")
