"""At initialisation every layer is the identity and every gate leans initial_shared_weight on shared experts."""

import math

import pytest
import torch
from model_testkit import ATTENTION_MODES, FFN_VARIANTS, GATED_VARIANTS, tiny_batch, tiny_model

from mtl_decoder.model import SHARED, Gate


@pytest.mark.parametrize("attention", ATTENTION_MODES)
@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_fresh_layers_are_the_identity(ffn, attention):
    model = tiny_model(ffn=ffn, attention=attention, seed=2).eval()
    batch = tiny_batch([6, 4, 5], seed=2)
    mask = batch["attention_mask"]
    layout = model.route_layout(mask, model.task_names, None)
    bottom = layout.bottom or layout
    rope = model.rope(mask.shape[1])
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):  # each layer, attention and expert block together, on its rows
            fork, forked = i == model.fork_layer, i > model.fork_layer
            rows = (layout if forked else bottom).row_example
            h_in = torch.randn(len(rows), mask.shape[1], model.cfg.d_model, generator=gen)
            h_out, _ = layer(h_in, model._attention_mask(mask, rows), rope, layout if fork or forked else bottom, fork)
            # the fork layer gives every route a copy of its example's bottom row, unchanged
            assert torch.equal(h_out, h_in[layout.bottom_row] if fork else h_in)


def test_identity_layers_mean_logits_are_the_heads_of_the_embedding():
    """Stronger form: with identity layers, tagging logits are head(final_norm(embedding)) exactly."""
    model = tiny_model(ffn="ple", attention="bidirectional").eval()
    batch = tiny_batch([5, 3], seed=4)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"], tasks=["ner"])
        expected = model.heads["ner"](model.final_norm(model.embed(batch["input_ids"])))
    torch.testing.assert_close(out.logits["ner"], expected, atol=1e-6, rtol=0)


def _n_shared_columns(model, layer, gate: str) -> tuple[int, int]:
    names = layer.ffn.expert_names(gate, model.task_names)
    n_shared = sum(n.startswith(f"{SHARED}/") for n in names)
    return n_shared, len(names)


@pytest.mark.parametrize("ffn", GATED_VARIANTS)
def test_fresh_gates_put_initial_shared_weight_on_shared_experts(ffn):
    # Regression: MTLDecoder._init_weights used to re-initialise Gate.proj with N(0, 0.02) and a zero bias
    # after Gate.reset_parameters() had run, so gates started near uniform instead.
    isw = 0.7
    model = tiny_model(ffn=ffn, initial_shared_weight=isw, seed=3).eval()
    batch = tiny_batch([6, 5, 3], seed=3)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"])
    assert len(out.gates) == model.cfg.n_layers
    for layer, block, gates in zip(model.layers, model.expert_blocks(), out.gates, strict=True):
        if block is None:  # the shared bottom of single-level cgc / mmoe
            assert gates == {}
            continue
        expected_names = set(model.task_names) | ({SHARED} if ffn == "ple" and layer is not model.layers[-1] else set())
        assert set(gates) == expected_names
        for name, weights in gates.items():
            n_shared, n_total = _n_shared_columns(model, layer, name)
            M = out.layout.token_bounds[out.layout.names.index(name)]
            assert weights.shape == (M[1] - M[0], n_total)
            assert weights.dtype == torch.float32
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]), atol=1e-6, rtol=0)
            shared_mass = weights[:, n_total - n_shared :].sum(-1)
            if ffn.startswith("mmoe"):  # no own experts: uniform over the shared ones
                assert n_total == n_shared == model.cfg.n_shared_experts
                torch.testing.assert_close(weights, torch.full_like(weights, 1 / n_shared), atol=1e-6, rtol=0)
            else:
                torch.testing.assert_close(shared_mass, torch.full_like(shared_mass, isw), atol=1e-6, rtol=0)
                # ... spread evenly: every token gets the same weights at initialisation
                torch.testing.assert_close(weights, weights[:1].expand_as(weights), atol=1e-6, rtol=0)


@pytest.mark.parametrize(("n_own", "n_shared", "isw"), [(2, 2, 0.7), (6, 2, 0.3), (1, 3, 0.9)])
def test_gate_reset_parameters_bias(n_own, n_shared, isw):
    """The Gate on its own: zero weights, shared logits biased so the shared experts hold isw of the mass."""
    torch.manual_seed(0)
    gate = Gate(16, n_own, n_shared, isw)
    assert torch.count_nonzero(gate.proj.weight) == 0
    weights = gate(torch.randn(5, 16))
    torch.testing.assert_close(weights[:, n_own:].sum(-1), torch.full((5,), isw), atol=1e-6, rtol=0)
    expected_bias = math.log(isw * n_own / ((1 - isw) * n_shared))
    torch.testing.assert_close(gate.proj.bias[n_own:], torch.full((n_shared,), expected_bias))
