"""The dense ONNX graph against the torch model itself, in torch (no ONNX needed): every variant, both attention
modes, every position embedding and the word features give the torch model's logits at real tokens and its gate
weights over the real tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mtl_decoder.config import CLASSIFICATION, TAGGING, ModelConfig
from mtl_decoder.errors import UserError
from mtl_decoder.inference.onnx_graph import DenseGraph, check_exportable, gate_names
from mtl_decoder.model import MTLDecoder, TaskHeadSpec

SPECS = [
    TaskHeadSpec("ner", TAGGING, ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")),
    TaskHeadSpec("sent", CLASSIFICATION, ("neg", "pos", "neutral")),
]
VOCAB = 40


def _model(seed: int = 0, **overrides) -> MTLDecoder:
    """A tiny model with noise on every parameter (zero-initialised branches would make the comparison vacuous)."""
    settings = dict(d_model=32, n_layers=2, n_heads=2, expert_hidden=16, dropout=0.0, n_task_experts=1)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = MTLDecoder(ModelConfig(**settings), SPECS, vocab_size=VOCAB, pad_id=0)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval()


def _batch(lengths: list[int], features: bool) -> dict[str, torch.Tensor]:
    T = max(lengths)
    gen = torch.Generator().manual_seed(3)
    mask = torch.arange(T) < torch.tensor(lengths)[:, None]
    ids = torch.randint(1, VOCAB, (len(lengths), T), generator=gen).masked_fill(~mask, 0)
    batch = {"input_ids": ids, "attention_mask": mask}
    if features:  # every real token its own distinct word, padding none
        U = int(mask.sum())
        batch["token_word"] = torch.full((len(lengths), T), -1).masked_scatter(mask, torch.arange(U))
        batch["char_ids"] = torch.randint(0, 20, (U, 6), generator=gen)
        batch["shape_ids"] = torch.randint(0, 4, (U,), generator=gen)
        batch["hash_ids"] = torch.randint(0, 16, (U, 5), generator=gen)
    return batch


def _compare(model: MTLDecoder, batch: dict[str, torch.Tensor]) -> None:
    graph = DenseGraph(model).eval()
    mask = batch["attention_mask"]
    with torch.no_grad():
        ref = model(**batch)
        dense = graph(**{k: batch[k] for k in ("input_ids", "attention_mask", *graph.features)})
    for i, task in enumerate(model.task_names):
        assert torch.equal(ref.examples[task], torch.arange(len(mask)))
        got, want = dense[i], ref.logits[task]
        if want.dim() == 3:
            got, want = got[mask], want[mask]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    gates = dense[len(model.task_names) :]
    names = gate_names(model)
    assert len(gates) == len(names) == sum(len(g) for g in ref.gates)
    for (layer, route), weights in zip(names, gates, strict=True):
        torch.testing.assert_close(weights[mask.reshape(-1)], ref.gates[layer][route], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ffn", ["ple", "cgc", "mmoe", "cgc_stacked", "mmoe_stacked", "mlp"])
@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
def test_graph_computes_the_model_for_every_variant(ffn, attention):
    _compare(_model(ffn=ffn, attention=attention, n_layers=3), _batch([7, 3, 5], features=False))


@pytest.mark.parametrize("where", ["input", "every_layer"])
@pytest.mark.parametrize("kind", ["linear", "linear_only"])
def test_graph_computes_linear_positions(kind, where):
    model = _model(position_embedding=kind, position_embedding_where=where, position_max_length=16)
    _compare(model, _batch([6, 2], features=False))


def test_graph_computes_word_features_and_one_expert_layer():
    model = _model(char_embedding=8, word_features=True, word_hash_buckets=16, word_hash_dim=8, ffn="cgc")
    _compare(model, _batch([5, 8, 1], features=True))


def test_graph_computes_an_mlp_classification_head():
    _compare(_model(classifier_hidden=24), _batch([4, 6], features=False))


def test_gates_of_ple_without_a_shared_gate_in_the_last_layer():
    names = gate_names(_model(ffn="ple", n_layers=2))
    assert names == [(0, "ner"), (0, "sent"), (0, "shared"), (1, "ner"), (1, "sent")]


def test_only_native_models_are_exportable():
    check_exportable(_model(), "RUN/best")
    with pytest.raises(UserError, match=r"RUN/best: .*native models.*pretrained trunk"):
        check_exportable(nn.Linear(2, 2), "RUN/best")
