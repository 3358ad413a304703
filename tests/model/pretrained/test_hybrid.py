"""Mode hybrid: the lower blocks of a tiny random checkpoint cached, the top ``train_top`` blocks trained on the
cache (upcycle or lora), native layers optional above; step 0 against AutoModel, what trains, and the product
around it (train, save, load, evaluate, predict, export refusing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers import FIXTURES, tiny_config
from hf_testkit import FAMILIES, FP16_ROUNDING, tiny_checkpoint
from trunk_runs import batch, trained

import mtl_decoder.model.pretrained.state_cache as state_cache
from mtl_decoder.cli import main
from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import ConfigError, UserError
from mtl_decoder.evaluation.evaluate import evaluate
from mtl_decoder.export import export_trunk
from mtl_decoder.inference import Predictor
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.model.pretrained.hybrid import HybridDecoder
from mtl_decoder.saved import load_model

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [["EU", "rejects", "German", "call", "."], "Peter Blackburn went home.", ["Rain"]]
BLOCKS = 3


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {family: tiny_checkpoint(root / family, family, layers=BLOCKS) for family in FAMILIES}


def _model(checkpoint: Path, tmp: Path, *overrides: str) -> tuple[HybridDecoder, TextEncoder]:
    cfg = tiny_config(tmp / "run", [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={tmp}/cache",
                                    "model.trunk.mode=hybrid", *overrides])  # fmt: skip
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    return build_model(cfg, LABELS, encoder).eval(), encoder


def _batch(encoder: TextEncoder) -> tuple[torch.Tensor, torch.Tensor]:
    return batch(encoder, ITEMS)


def _reference(checkpoint: Path, ids, mask) -> torch.Tensor:
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return ref(input_ids=ids, attention_mask=mask.long()).last_hidden_state


def _assert_task_routes_equal(model, ids, mask, expected, ffn: str, atol: float, rtol: float | None = None) -> list:
    layout = model.route_layout(mask, model.task_names, None)
    with torch.no_grad():
        hidden, gates = model.encode(ids, mask, layout, {})
    task_routes = [r for r in layout.names if r != SHARED or ffn == "mlp"]  # ple's shared route is not read
    assert task_routes
    for route in task_routes:
        rows = layout.rows(route)
        for row, example in zip(range(rows.start, rows.stop), layout.row_example[rows].tolist(), strict=True):
            real = mask[example]
            rt = atol if rtol is None else rtol
            torch.testing.assert_close(hidden[row][real], expected[example][real], atol=atol, rtol=rt)
    return gates


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("top_mode", ["upcycle", "lora"])
@pytest.mark.parametrize("ffn", ["ple", "cgc", "mlp"])
def test_step_zero_computes_the_pretrained_function(checkpoints, tmp_path, monkeypatch, family, top_mode, ffn):
    """Cached block 1 + trained blocks 2-3 + the final norm, no native layers: every task route's states equal
    AutoModel's over all 3 blocks (the cache kept in float32 here, so only the arithmetic is compared). The top
    blocks attend causally (top_attention's default), whatever model.attention says of the layers above."""
    monkeypatch.setattr(state_cache, "STORE_DTYPE", torch.float32)
    overrides = ["model.trunk.train_top=2", "model.n_layers=0", "model.attention=bidirectional"]
    model, encoder = _model(checkpoints[family], tmp_path, *overrides, f"model.trunk.top_mode={top_mode}",
                            f"model.ffn={ffn}")  # fmt: skip
    ids, mask = _batch(encoder)
    gates = _assert_task_routes_equal(model, ids, mask, _reference(checkpoints[family], ids, mask), ffn, 1e-5)
    assert [bool(g) for g in gates] == {"ple": [True, True], "cgc": [False, True]}.get(ffn, [False, False])
    assert [b is not None for b in model.expert_blocks()] == [bool(g) for g in gates]


def test_the_top_blocks_attend_both_ways_when_asked(checkpoints, tmp_path):
    """top_attention lifts the causal mask in the trained blocks only: the first token then sees the others."""
    overrides = ["model.trunk.train_top=1", "model.n_layers=0"]
    causal, encoder = _model(checkpoints["llama"], tmp_path, *overrides)
    both, _ = _model(checkpoints["llama"], tmp_path, *overrides, "model.trunk.top_attention=bidirectional")
    ids, mask = _batch(encoder)
    with torch.no_grad():
        a, _ = causal.encode(ids, mask, causal.route_layout(mask, causal.task_names, None), {})
        b, _ = both.encode(ids, mask, both.route_layout(mask, both.task_names, None), {})
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-3
    torch.testing.assert_close(causal.states(ids, mask), both.states(ids, mask))  # the cached blocks: causal


def test_a_hook_on_the_top_blocks_sees_only_their_calls(checkpoints, tmp_path):
    """The top is a shallow copy of the trunk's model: its hooks are its own, not shared with the cached part's."""
    model, encoder = _model(checkpoints["llama"], tmp_path, "model.trunk.train_top=1", "model.n_layers=0")
    seen: list[str] = []
    model.top.register_forward_pre_hook(lambda _m, _a, kw: seen.append("top" if "inputs_embeds" in kw else "base"),
                                        with_kwargs=True)  # fmt: skip
    ids, mask = _batch(encoder)
    model.states.base(input_ids=ids, attention_mask=mask.long())
    assert seen == []
    with torch.no_grad():
        model.encode(ids, mask, model.route_layout(mask, model.task_names, None), {})
    assert seen == ["top"]


@pytest.mark.parametrize("family", FAMILIES)
def test_w8a8_finds_every_expert_of_llama_style_top_blocks_and_none_in_gpt2(checkpoints, tmp_path, family):
    from mtl_decoder.inference.smoothquant_top import top_blocks

    model, _ = _model(checkpoints[family], tmp_path, "model.trunk.train_top=2")
    tops = top_blocks(model)
    if family == "gpt2":  # its fused attention is not Llama-style (Qwen2's is): its top blocks stay float32
        assert tops == []
        return
    m = model.cfg
    assert len(tops) == 2 and all(len(t.experts) == 2 * m.n_task_experts + m.n_shared_experts for t in tops)
    assert [len(t.gates) for t in tops] == [3, 2]  # the last block has no shared gate: nothing reads its shared route


def test_with_the_float16_cache_step_zero_is_the_pretrained_function_to_its_rounding(checkpoints, tmp_path):
    model, encoder = _model(checkpoints["llama"], tmp_path, "model.trunk.train_top=1", "model.n_layers=0",
                            "model.attention=causal")  # fmt: skip
    ids, mask = _batch(encoder)
    expected = _reference(checkpoints["llama"], ids, mask)
    # The top block reads block 2's states rounded to float16 (at most 2**-11 of their magnitude) and the final norm
    # rescales: its outputs move by about that much of theirs. Measured (this test on llama, qwen2 and gpt2
    # checkpoints): max error / max |expected| = 2.7e-4, 3.6e-4, 2.6e-4, i.e. 0.54-0.73 x 2**-11; bound 2 x 2**-11.
    atol = 2 * FP16_ROUNDING * expected[mask].abs().max().item()
    _assert_task_routes_equal(model, ids, mask, expected, "ple", atol, rtol=0.0)


def _block_weights(checkpoint: Path) -> dict[int, dict[str, torch.Tensor]]:
    from transformers import AutoModel

    state = AutoModel.from_pretrained(checkpoint).state_dict()
    return {i: {k: v for k, v in state.items() if k.startswith(f"layers.{i}.")} for i in range(BLOCKS)}


@pytest.mark.parametrize("top_mode", ["upcycle", "lora"])
def test_only_the_top_blocks_train_and_the_cached_states_stay_the_pretrained_ones(checkpoints, tmp_path, top_mode):
    model, encoder = _model(checkpoints["llama"], tmp_path, "model.trunk.train_top=1", "model.n_layers=1",
                            f"model.trunk.top_mode={top_mode}", "model.trunk.lora_attention=true")  # fmt: skip
    original = _block_weights(checkpoints["llama"])
    trained_names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any(n.startswith("top.layers.1") for n in trained_names)  # the top holds one block: its index 0
    assert not any("embed_tokens" in n for n, _ in model.named_parameters())  # the top reads the cached states
    lower = model.states.base
    assert len(lower.layers) == BLOCKS - 1 and not any(p.requires_grad for p in lower.parameters())
    if top_mode == "upcycle":
        assert "top.layers.0.self_attn.q_proj.weight" in trained_names
    else:
        assert trained_names and all(
            "lora_" in n or ".proj." in n or not n.startswith("top.") for n in trained_names
        )  # updates and gates in the top block; native layers, mix projection and heads above
    ids, mask = _batch(encoder)
    before = model.states(ids, mask).clone()
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    torch.manual_seed(0)
    with torch.no_grad():  # off the zero-initialised updates and outputs, so that every trained part moves
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    moved = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    for _ in range(2):
        optimizer.zero_grad()
        model(ids, mask, labels={"sentiment": torch.tensor([0, 1, 1])}).loss.backward()
        optimizer.step()
    now = dict(model.named_parameters())
    assert any(not torch.equal(value, now[n]) for n, value in moved.items() if n.startswith("top."))
    for i in range(BLOCKS - 1):  # the cached blocks: the pretrained weights, untouched
        for key, value in original[i].items():
            torch.testing.assert_close(lower.state_dict()[key], value, atol=0, rtol=0)
    model.states.cache.misses = 0
    torch.testing.assert_close(model.states(ids, mask), before, atol=0, rtol=0)
    assert model.states.cache.misses == 0


def test_native_layers_above_read_every_route_of_the_top_blocks(checkpoints, tmp_path):
    model, encoder = _model(checkpoints["gpt2"], tmp_path, "model.trunk.train_top=2", "model.n_layers=2")
    ids, mask = _batch(encoder)
    out = model(ids, mask)
    assert len(out.gates) == 2 + 2 == len(model.expert_blocks()) and all(out.gates)
    assert out.logits["ner"].shape[:2] == ids.shape and out.logits["sentiment"].shape == (len(ITEMS), 2)


def test_train_top_must_leave_blocks_to_cache(checkpoints, tmp_path):
    with pytest.raises(ConfigError, match=r"^config key 'model.trunk.train_top'"):
        tiny_config(tmp_path, ["model.trunk.pretrained=x", "model.trunk.mode=hybrid", "model.trunk.layers=2",
                               "model.trunk.train_top=2"])  # fmt: skip
    with pytest.raises(UserError, match=r"^model.trunk.train_top: 3 trained blocks leave none of the 3 blocks"):
        _model(checkpoints["llama"], tmp_path, "model.trunk.train_top=3")
    with pytest.raises(ConfigError, match=r"^config key 'model.char_embedding'"):
        tiny_config(tmp_path, ["model.trunk.pretrained=x", "model.trunk.mode=hybrid", "model.n_layers=0",
                               "model.char_embedding=16"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^config key 'model.n_layers'"):
        tiny_config(tmp_path, ["model.trunk.pretrained=x", "model.trunk.mode=frozen", "model.n_layers=0"])


# ------------------------------------------------------------------------------------ the product around it


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "trunk-runs"


def _items() -> list:
    items: list = []
    for name in ("ner_test.jsonl", "sentiment_test.jsonl"):
        for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            items.append(record["tokens"] if "tokens" in record else record["text"])
    return items


def _predictions(model, encoder, label_sets) -> list:
    return list(Predictor(model, encoder, label_sets, batch_size=16, workers=1).predict(_items()))


def test_a_trained_hybrid_model_saves_loads_evaluates_and_predicts(root, tmp_path):
    run = trained(root, "hybrid")
    saved = load_model(run.best, device="cpu")
    assert type(saved.model) is HybridDecoder is type(run.model)
    expected, got = (
        _predictions(run.model, run.encoder, run.label_sets),
        _predictions(saved.model, saved.encoder, saved.label_sets),
    )
    assert len(got) == len(expected) == len(_items())
    for a, b in zip(got, expected, strict=True):
        assert a.tags == b.tags and a.labels == b.labels
        for task, probs in b.probs.items():
            assert a.probs[task] == pytest.approx(probs, abs=1e-6)
    result = evaluate(run.best, split="validation", output_dir=tmp_path / "eval")
    assert set(result.metrics["tasks"]) == {"ner", "sentiment"}
    assert "hybrid: its states at block 1" in (run.best / "README.md").read_text()
    assert json.loads((run.best / "trunk" / "config.json").read_text())["num_hidden_layers"] == 2  # the whole trunk
    out = tmp_path / "pred.jsonl"
    source = FIXTURES / "sentiment_test.jsonl"
    assert main(["predict", "--model", str(run.best), "--input", str(source), "--output", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == len(source.read_text().splitlines())
    assert json.loads(lines[0])["predictions"]["sentiment"]["label"] in run.label_sets["sentiment"]
    with pytest.raises(UserError, match="export --trunk does not handle mode hybrid"):
        export_trunk(run.best, tmp_path / "hf")


@pytest.mark.parametrize("top_mode", ["upcycle", "lora"])
def test_gradient_checkpointing_of_the_top_blocks_gives_the_same_loss_and_gradients(checkpoints, tmp_path, top_mode):
    results = []
    for checkpointing in ("false", "true"):
        torch.manual_seed(0)
        overrides = ["model.trunk.train_top=2", "model.n_layers=1", f"model.trunk.top_mode={top_mode}"]
        model, encoder = _model(checkpoints["llama"], tmp_path, *overrides,
                                f"model.trunk.gradient_checkpointing={checkpointing}")  # fmt: skip
        model.train()
        with torch.no_grad():  # off the zero-initialised updates and outputs, so that gradients reach every part
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(torch.randn_like(p) * 0.05)
        ids, mask = _batch(encoder)
        out = model(ids, mask, labels={"sentiment": torch.tensor([0, 1, 1])})
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.loss.detach(), grads, len(out.gates)))
    (loss_a, grads_a, gates_a), (loss_b, grads_b, gates_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)
    assert grads_a.keys() == grads_b.keys() and any(n.startswith("top.") and ".mlp." in n for n in grads_a)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert gates_a == gates_b == 2 + 1  # the recomputation's gates are not collected a second time
