"""Expert-utilisation statistics on gates whose weights are known: a tiny model whose gate projections are
zero and whose biases are set by hand (every token gets softmax(bias)), and hand-made weight rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING, ModelConfig
from mtl_decoder.evaluation.utilisation import NO_GATES_NOTE, GateStats, UtilisationTracker, bucket_labels
from mtl_decoder.model import MTLDecoder, TaskHeadSpec
from mtl_decoder.model.trunks.native import NativeTrunk

SPECS = [TaskHeadSpec("ner", TAGGING, ("O", "B-PER", "I-PER")), TaskHeadSpec("sent", CLASSIFICATION, ("neg", "pos"))]
NER_P = [0.7, 0.25, 0.05]  # ner/0, shared/0, shared/1: shared/1 is below 0.25 x 1/3 -> dead
SENT_P = [0.2, 0.3, 0.5]  # sent/0, shared/0, shared/1
SHARED_P = [0.1, 0.2, 0.3, 0.4]  # ner/0, sent/0, shared/0, shared/1
BOUNDS = [2, 4]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny forwards on a loaded 2-core machine run ~3x faster single-threaded (no intra-op contention)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(ffn: str = "ple", n_shared: int = 2) -> MTLDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16,
        n_layers=2,
        n_heads=2,
        expert_hidden=8,
        n_shared_experts=n_shared,
        n_task_experts=1,
        dropout=0.0,
        ffn=ffn,
    )
    return NativeTrunk(cfg).bind(MTLDecoder(cfg, SPECS, vocab_size=20)).eval()


def set_gates(model: MTLDecoder) -> None:
    """Zero gate weights and biases log(p): softmax gives exactly p on every token."""
    with torch.no_grad():
        for layer in model.layers:
            block = layer.ffn
            for name, p in (("ner", NER_P), ("sent", SENT_P)):
                block.task_gates[name].proj.weight.zero_()
                block.task_gates[name].proj.bias.copy_(torch.tensor(p).log())
            if block.shared_gate is not None:
                block.shared_gate.proj.weight.zero_()
                block.shared_gate.proj.bias.copy_(torch.tensor(SHARED_P).log())


def run(model: MTLDecoder, tracker: UtilisationTracker, tasks: list[str], lengths=(3, 6)) -> None:
    T = max(lengths)
    ids = torch.randint(1, 20, (len(lengths), T))
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    batch = {"input_ids": ids * mask, "attention_mask": mask}
    with torch.no_grad():
        tracker(model(**batch, tasks=tasks), batch)


def entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def test_hand_set_gates_give_known_statistics():
    model = tiny()
    set_gates(model)
    tracker = UtilisationTracker(model, BOUNDS, dead_fraction=0.25)
    run(model, tracker, ["ner", "sent"])
    stats = tracker.summary()
    assert list(stats) == ["layer_0", "layer_1"]
    assert list(stats["layer_0"]) == ["ner", "sent", "shared"]
    assert list(stats["layer_1"]) == ["ner", "sent"]  # ple's last layer has no shared gate

    ner = stats["layer_0"]["ner"]
    assert ner["experts"] == ["ner/0", "shared/0", "shared/1"]
    assert ner["tokens"] == 9
    assert list(ner["mean"].values()) == pytest.approx(NER_P, abs=1e-6)
    assert list(ner["std"].values()) == pytest.approx([0, 0, 0], abs=1e-4)
    assert ner["shared_share"] == pytest.approx(0.30, abs=1e-6)
    assert ner["normalised_entropy"] == pytest.approx(entropy(NER_P) / math.log(3), abs=1e-6)
    assert ner["top1_share"] == {"ner/0": 1.0, "shared/0": 0.0, "shared/1": 0.0}
    assert ner["dead_threshold"] == pytest.approx(0.25 / 3)
    assert ner["dead_experts"] == ["shared/1"]

    sent = stats["layer_1"]["sent"]
    assert sent["top1_share"]["shared/1"] == 1.0 and sent["dead_experts"] == []
    assert sent["shared_share"] == pytest.approx(0.8, abs=1e-6)

    shared = stats["layer_0"]["shared"]
    assert shared["experts"] == ["ner/0", "sent/0", "shared/0", "shared/1"]
    assert list(shared["mean"].values()) == pytest.approx(SHARED_P, abs=1e-6)
    assert shared["shared_share"] == pytest.approx(0.7, abs=1e-6)
    assert shared["normalised_entropy"] == pytest.approx(entropy(SHARED_P) / math.log(4), abs=1e-6)
    assert shared["dead_experts"] == []


def test_position_buckets_count_tokens_by_position():
    model = tiny()
    set_gates(model)
    tracker = UtilisationTracker(model, BOUNDS, dead_fraction=0.25)
    run(model, tracker, ["ner"], lengths=(3, 6))  # positions 0,1,2 and 0..5
    buckets = tracker.summary()["layer_0"]["ner"]["positions"]
    assert [b["bucket"] for b in buckets] == ["0-1", "2-3", "4+"] == bucket_labels(BOUNDS)
    assert [b["tokens"] for b in buckets] == [4, 3, 2]
    for b in buckets:
        assert list(b["mean"].values()) == pytest.approx(NER_P, abs=1e-6)
        assert b["shared_share"] == pytest.approx(0.3, abs=1e-6)
    empty = UtilisationTracker(model, [100], 0.25)
    run(model, empty, ["ner"], lengths=(2,))
    assert empty.summary()["layer_0"]["ner"]["positions"][1] == {
        "bucket": "100+",
        "tokens": 0,
        "mean": None,
        "shared_share": None,
    }


def test_a_task_gate_covers_only_its_own_tasks_examples():
    model = tiny()
    tracker = UtilisationTracker(model, BOUNDS, dead_fraction=0.25)
    run(model, tracker, ["ner"], lengths=(3, 6))  # ple computes every route, but only ner was evaluated
    layer = tracker.summary()["layer_0"]
    assert set(layer) == {"ner", "shared"}
    run(model, tracker, ["sent"], lengths=(5,))
    layer = tracker.summary()["layer_0"]
    assert layer["ner"]["tokens"] == 9 and layer["sent"]["tokens"] == 5
    assert layer["shared"]["tokens"] == 14  # the shared gate covers every evaluated example


def test_streaming_sums_match_numpy_on_hand_made_rows():
    rows = np.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9], [0.7, 0.3]])
    stats = GateStats(["a/0", "shared/0"], [2])
    stats.add(torch.tensor(rows[:3], dtype=torch.float32), torch.tensor([0, 1, 2]))
    stats.add(torch.tensor(rows[3:], dtype=torch.float32), torch.tensor([5]))  # a second batch
    s = stats.summary(dead_fraction=0.25)
    assert list(s["mean"].values()) == pytest.approx(rows.mean(0), abs=1e-6)
    assert list(s["std"].values()) == pytest.approx(rows.std(0), abs=1e-6)  # population std over tokens
    assert s["top1_share"] == {"a/0": 0.75, "shared/0": 0.25}  # the 0.5/0.5 tie goes to the first expert
    ent = -(rows * np.log(rows)).sum(1).mean() / math.log(2)
    assert s["normalised_entropy"] == pytest.approx(ent, abs=1e-6)
    assert s["shared_share"] == pytest.approx(rows[:, 1].mean(), abs=1e-6)
    assert [b["tokens"] for b in s["positions"]] == [2, 2]
    assert s["positions"][1]["mean"]["a/0"] == pytest.approx((0.1 + 0.7) / 2, abs=1e-6)


def test_one_hot_rows_mark_unused_experts_dead():
    stats = GateStats(["a/0", "a/1", "shared/0", "shared/1"], [4])
    stats.add(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), torch.tensor([0, 1]))
    s = stats.summary(dead_fraction=0.25)
    assert s["dead_experts"] == ["a/1", "shared/1"]
    assert s["normalised_entropy"] == pytest.approx(0.0)
    assert s["std"]["a/0"] == pytest.approx(0.5)


def test_mlp_has_no_gates_and_says_so():
    model = tiny("mlp")
    tracker = UtilisationTracker(model, BOUNDS, 0.25)
    run(model, tracker, ["ner", "sent"])
    assert tracker.summary() == {}
    assert tracker.notes() == [NO_GATES_NOTE]


def test_mmoe_gates_see_shared_experts_only():
    model = tiny("mmoe", n_shared=1)
    tracker = UtilisationTracker(model, BOUNDS, 0.25)
    run(model, tracker, ["ner"])
    ner = tracker.summary()["layer_1"]["ner"]
    assert ner["experts"] == ["shared/0"]
    assert ner["shared_share"] == pytest.approx(1.0)
    assert ner["normalised_entropy"] is None  # one expert: no choice, entropy undefined
