"""At initialisation every layer is the identity and every gate leans initial_shared_weight on shared experts."""

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


# (n_task_experts, n_shared_experts, initial_shared_weight): equal and unequal counts both ways, so a bias that
# confused the two counts (or ignored them) would move the mass.
EXPERT_COUNTS = [(2, 2, 0.7), (1, 3, 0.7), (3, 1, 0.3), (4, 2, 0.9)]


@pytest.mark.parametrize(("n_task", "n_shared", "isw"), EXPERT_COUNTS)
@pytest.mark.parametrize("ffn", GATED_VARIANTS)
def test_fresh_gates_put_initial_shared_weight_on_shared_experts(ffn, n_task, n_shared, isw):
    """Checked by the mass the gates produce on the model's own hidden states, never by the bias that makes it: each
    gate gives its shared experts isw of the mass (ple's shared gate too, whose own experts are every task's), spread
    evenly, and its own experts the rest, evenly; mmoe's gates (no own experts) are uniform over the shared ones."""
    # Regression: MTLDecoder._init_weights used to re-initialise Gate.proj with N(0, 0.02) and a zero bias
    # after Gate.reset_parameters() had run, so gates started near uniform instead.
    model = tiny_model(ffn=ffn, initial_shared_weight=isw, n_task_experts=n_task, n_shared_experts=n_shared, seed=3)
    batch = tiny_batch([6, 5, 3], seed=3)
    with torch.no_grad():
        out = model.eval()(batch["input_ids"], batch["attention_mask"])
    assert len(out.gates) == model.cfg.n_layers
    checked = 0
    for layer, block, gates in zip(model.layers, model.expert_blocks(), out.gates, strict=True):
        if block is None:  # the shared bottom of single-level cgc / mmoe
            assert gates == {}
            continue
        expected_names = set(model.task_names) | ({SHARED} if ffn == "ple" and layer is not model.layers[-1] else set())
        assert set(gates) == expected_names
        for name, weights in gates.items():
            n_s, n_total = _n_shared_columns(model, layer, name)
            assert n_s == n_shared
            M = out.layout.token_bounds[out.layout.names.index(name)]
            assert weights.shape == (M[1] - M[0], n_total) and weights.shape[0] > 0
            assert weights.dtype == torch.float32
            mass = isw if n_total > n_shared else 1.0  # mmoe: every expert is shared
            n_own = n_total - n_shared
            expected = torch.tensor([(1 - mass) / max(n_own, 1)] * n_own + [mass / n_shared] * n_shared)
            torch.testing.assert_close(weights[:, n_own:].sum(-1), torch.full((len(weights),), mass), atol=1e-6, rtol=0)
            torch.testing.assert_close(weights, expected.expand_as(weights), atol=1e-6, rtol=0)
            checked += 1
    assert checked >= len(model.task_names)


GATE_COUNTS = [(2, 2, 0.7), (6, 2, 0.3), (1, 3, 0.9), (8, 1, 0.05), (0, 3, 0.7)]  # (n_own, n_shared, isw)


@pytest.mark.parametrize(("n_own", "n_shared", "isw"), GATE_COUNTS)
def test_a_fresh_gate_puts_isw_of_its_mass_on_the_shared_experts(n_own, n_shared, isw):
    """The Gate on its own, on random inputs of any scale: zero weights (the input cannot move it at step 0) and the
    shared experts holding isw of the softmax mass (all of it, uniformly, with no own experts: mmoe)."""
    torch.manual_seed(0)
    gate = Gate(16, n_own, n_shared, isw)
    assert torch.count_nonzero(gate.proj.weight) == 0
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1)) * torch.logspace(-2, 2, 64).unsqueeze(1)
    weights = gate(x).double()
    mass = isw if n_own else 1.0
    torch.testing.assert_close(weights.sum(-1), torch.ones(64, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(weights[:, n_own:].sum(-1), torch.full((64,), mass, dtype=torch.float64), atol=1e-6,
                               rtol=0)  # fmt: skip
    torch.testing.assert_close(weights[:, n_own:], torch.full((64, n_shared), mass / n_shared, dtype=torch.float64),
                               atol=1e-6, rtol=0)  # fmt: skip
