"""Causality and padding: what a token's outputs may depend on.

Every model here is perturbed first: the residual branches start at zero, and on a fresh model every layer is
the identity, which would make these tests pass for any mask.
"""

import pytest
import torch
from model_testkit import ATTENTION_MODES, FFN_VARIANTS, PAD, VOCAB, perturb, tiny_batch, tiny_model

ATOL = 1e-5


def run(model, input_ids, attention_mask, word_index):
    """Forward with the residual stream after every layer captured: logits, residuals (N, T, C), gates."""
    residuals = []
    hooks = [layer.register_forward_hook(lambda _m, _a, out: residuals.append(out[0])) for layer in model.layers]
    try:
        with torch.no_grad():
            out = model(input_ids, attention_mask, word_index=word_index)
    finally:
        for h in hooks:
            h.remove()
    return out, residuals


def route_positions(layout, route: str) -> torch.Tensor:
    """Sequence position of each of a route's packed tokens (the rows of that route's gate weights)."""
    return layout.token_position[layout.tokens(route)]


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_causal_outputs_ignore_later_tokens(ffn):
    model = perturb(tiny_model(ffn=ffn, attention="causal")).eval()
    batch = tiny_batch([8, 8, 6], seed=3)
    ids, mask, wi = batch["input_ids"], batch["attention_mask"], batch["word_index"]
    t = 3
    changed = ids.clone()
    changed[:, t + 1 :] = torch.randint(1, VOCAB, changed[:, t + 1 :].shape, generator=torch.Generator().manual_seed(9))
    changed[~mask] = PAD
    assert not torch.equal(changed, ids)

    a, res_a = run(model, ids, mask, wi)
    b, res_b = run(model, changed, mask, wi)

    torch.testing.assert_close(a.logits["ner"][:, : t + 1], b.logits["ner"][:, : t + 1], atol=ATOL, rtol=0)
    for h_a, h_b in zip(res_a, res_b, strict=True):
        torch.testing.assert_close(h_a[:, : t + 1], h_b[:, : t + 1], atol=ATOL, rtol=0)
    for layer_a, layer_b in zip(a.gates, b.gates, strict=True):
        assert layer_a.keys() == layer_b.keys()
        for name in layer_a:
            early = route_positions(a.layout, name) <= t
            torch.testing.assert_close(layer_a[name][early], layer_b[name][early], atol=ATOL, rtol=0)
    # Not vacuous: the later positions did change.
    assert (a.logits["ner"][:, t + 1 :] - b.logits["ner"][:, t + 1 :]).abs().max() > 1e-3
    assert (res_a[-1][:, t + 1 :] - res_b[-1][:, t + 1 :]).abs().max() > 1e-3


def test_bidirectional_outputs_do_see_later_tokens():
    """The control of the causal test: with bidirectional attention, early positions do change."""
    model = perturb(tiny_model(ffn="cgc", attention="bidirectional")).eval()
    batch = tiny_batch([8, 8], seed=3)
    ids, mask, wi = batch["input_ids"], batch["attention_mask"], batch["word_index"]
    changed = ids.clone()
    changed[:, 5:] = ids[:, 5:] % (VOCAB - 1) + 1  # every later token replaced by a different one
    assert (changed[:, 5:] != ids[:, 5:]).all()
    a, _ = run(model, ids, mask, wi)
    b, _ = run(model, changed, mask, wi)
    assert (a.logits["ner"][:, :5] - b.logits["ner"][:, :5]).abs().max() > 1e-3


@pytest.mark.parametrize("attention", ATTENTION_MODES)
@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_appended_padding_changes_nothing(ffn, attention):
    model = perturb(tiny_model(ffn=ffn, attention=attention)).eval()
    lengths = [7, 4, 6]
    T0, extra = 7, 5
    short = tiny_batch(lengths, T=T0, seed=5)
    long = tiny_batch(lengths, T=T0 + extra, seed=5)
    # Same real tokens and words, only a wider padded tail.
    assert torch.equal(long["input_ids"][:, :T0], short["input_ids"])
    assert not long["attention_mask"][:, T0:].any()
    long["input_ids"][:, T0:] = 7  # whatever sits under the pad mask must not matter either

    a, res_a = run(model, short["input_ids"], short["attention_mask"], short["word_index"])
    b, res_b = run(model, long["input_ids"], long["attention_mask"], long["word_index"])

    real = short["attention_mask"]  # (B, T0)
    ner_rows = a.examples["ner"]
    assert torch.equal(ner_rows, b.examples["ner"])
    torch.testing.assert_close(
        a.logits["ner"][real[ner_rows]], b.logits["ner"][:, :T0][real[ner_rows]], atol=ATOL, rtol=0
    )
    torch.testing.assert_close(a.logits["sent"], b.logits["sent"], atol=ATOL, rtol=0)
    row_real = real[a.layout.row_example]  # (N, T0)
    bottom_real = real[(a.layout.bottom or a.layout).row_example]  # (B, T0): the shared bottom's rows
    assert torch.equal(a.layout.row_example, b.layout.row_example)
    for i, (h_a, h_b) in enumerate(zip(res_a, res_b, strict=True)):
        rows_real = bottom_real if i < model.fork_layer else row_real  # the fork layer outputs the routes' rows
        torch.testing.assert_close(h_a[rows_real], h_b[:, :T0][rows_real], atol=ATOL, rtol=0)
    for layer_a, layer_b in zip(a.gates, b.gates, strict=True):
        assert layer_a.keys() == layer_b.keys()
        for name in layer_a:  # gate rows are the real tokens only, in the same order
            torch.testing.assert_close(layer_a[name], layer_b[name], atol=ATOL, rtol=0)
    assert torch.equal(a.layout.token_position, b.layout.token_position)


def test_route_examples_run_a_tasks_route_on_examples_without_its_label():
    """cgc routes a task only on the examples labelled for it; ``route_examples`` (distillation: the examples that
    carry a teacher target) adds the others, and their rows are what a forward on them alone computes."""
    model = perturb(tiny_model(ffn="cgc")).eval()
    ids = torch.randint(1, 40, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 6, dtype=torch.bool)
    labels = {"sent": torch.tensor([1, -100, -100])}
    plain = model(ids, mask, labels=labels, tasks=["sent"])
    assert plain.examples["sent"].tolist() == [0]
    every = {"sent": torch.ones(3, dtype=torch.bool)}
    routed = model(ids, mask, labels=labels, tasks=["sent"], route_examples=every)
    assert routed.examples["sent"].tolist() == [0, 1, 2]
    torch.testing.assert_close(routed.losses["sent"], plain.losses["sent"])  # the gold loss: example 0 only
    alone = model(ids[1:], mask[1:], tasks=["sent"])
    torch.testing.assert_close(routed.logits["sent"][1:], alone.logits["sent"], atol=1e-5, rtol=1e-5)
