"""Which experts and gates each variant has, and where each task's gradient may flow."""

import pytest
import torch
from model_testkit import FFN_VARIANTS, perturb, tiny_batch, tiny_model, tiny_specs

from mtl_decoder.config import TAGGING
from mtl_decoder.model import SHARED, ExpertGroup, Gate, TaskHeadSpec
from mtl_decoder.model.layers import SwiGLU


def _grad_norm(module: torch.nn.Module) -> float:
    return sum(0.0 if p.grad is None else p.grad.abs().sum().item() for p in module.parameters())


def _three_task_specs():
    return [*tiny_specs(), TaskHeadSpec("pos", TAGGING, ("N", "V", "X"))]


def _loss_of(model, batch, task):
    out = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], word_read=batch["word_read"])
    assert set(out.losses) == set(batch["labels"])
    return out, out.losses[task]


def _three_task_batch():
    batch = tiny_batch([6, 5, 4, 6], seed=11)
    gen = torch.Generator().manual_seed(12)
    pos = torch.randint(3, batch["labels"]["ner"].shape, generator=gen)
    batch["labels"]["pos"] = torch.where(batch["labels"]["ner"] == -100, -100, pos)
    return batch


@pytest.mark.parametrize("ffn", ["cgc", "cgc_stacked"])
@pytest.mark.parametrize("task", ["ner", "sent", "pos"])
def test_cgc_task_loss_reaches_only_its_own_experts_and_gate(task, ffn):
    model = perturb(tiny_model(ffn=ffn, specs=_three_task_specs(), seed=5, n_layers=3))
    model.train()  # dropout is 0: train mode only to be sure no eval-only path is tested
    batch = _three_task_batch()
    _, loss = _loss_of(model, batch, task)
    loss.backward()
    for layer in model.layers:
        if isinstance(layer.ffn, SwiGLU):  # the shared bottom: every task's loss reaches it
            assert ffn == "cgc" and _grad_norm(layer.ffn) > 0
            continue
        for name, experts in layer.ffn.task_experts.items():
            if name == task:
                assert _grad_norm(experts) > 0, f"own experts of {task} got no gradient"
                assert _grad_norm(layer.ffn.task_gates[name]) > 0
            else:
                assert _grad_norm(experts) == 0, f"{task} loss reached {name}'s experts"
                assert _grad_norm(layer.ffn.task_gates[name]) == 0, f"{task} loss reached {name}'s gate"
        assert _grad_norm(layer.ffn.shared) > 0
    for name, head in model.heads.items():
        assert (_grad_norm(head) > 0) == (name == task)


def test_ple_last_layer_has_no_shared_gate_and_its_shared_route_stays_put():
    model = perturb(tiny_model(ffn="ple", seed=6)).eval()
    blocks = [layer.ffn for layer in model.layers]
    assert all(b.shared_gate is not None for b in blocks[:-1])
    assert blocks[-1].shared_gate is None
    batch = tiny_batch([6, 4], seed=6)
    block_outputs = []
    hook = blocks[-1].register_forward_hook(lambda _m, _a, o: block_outputs.append(o[0]))
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"], word_read=batch["word_read"])
    hook.remove()
    assert out.layout.names == [*model.task_names, SHARED]
    n_task_columns = model.cfg.n_task_experts * len(model.task_names)
    for gates in out.gates[:-1]:
        assert set(gates) == {*model.task_names, SHARED}
        assert gates[SHARED].shape[1] == n_task_columns + model.cfg.n_shared_experts
    assert set(out.gates[-1]) == set(model.task_names)
    # The last block adds nothing to the shared route (nothing reads it after), but does to the task routes.
    (y,) = block_outputs
    assert y.shape[0] == out.layout.token_index.shape[0]
    assert torch.count_nonzero(y[out.layout.tokens(SHARED)]) == 0
    for name in model.task_names:
        assert y[out.layout.tokens(name)].abs().max() > 1e-3


def test_ple_task_loss_reaches_other_tasks_experts_only_through_the_shared_route():
    """Layer 0: task B's experts and the shared gate feed the shared route, which layer 1's shared experts read,
    so task A's loss reaches them. Last layer: task B's experts feed nothing task A reads."""
    model = perturb(tiny_model(ffn="ple", seed=7))
    batch = tiny_batch([6, 5, 4], seed=7)
    _, loss = _loss_of(model, {**batch, "labels": {"ner": batch["labels"]["ner"]}}, "ner")
    loss.backward()
    first, last = model.layers[0].ffn, model.layers[-1].ffn
    assert _grad_norm(first.shared_gate) > 0
    assert _grad_norm(first.task_experts["sent"]) > 0
    assert _grad_norm(first.shared) > 0
    # sent's gate writes sent's route, which only sent's experts and head read after layer 0 (no shared gate in
    # the last layer): ner's loss must not reach it.
    assert _grad_norm(first.task_gates["sent"]) == 0
    assert _grad_norm(last.task_experts["sent"]) == 0
    assert _grad_norm(last.task_gates["sent"]) == 0
    assert _grad_norm(last.task_experts["ner"]) > 0
    assert _grad_norm(model.heads["sent"]) == 0


def test_ple_shared_route_feeds_next_layer():
    """Changing only layer 0's shared-route output changes layer 1's task outputs (via the shared experts)."""
    model = perturb(tiny_model(ffn="ple", seed=8)).eval()
    batch = tiny_batch([6, 5], seed=8)
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def forward(bump: float, route: str = SHARED):
        def hook(_m, args):  # layer 0's output is layer 1's input
            h, *rest = args
            rows = model.route_layout(mask, model.task_names, None).rows(route)
            h = h.clone()
            h[rows] += bump
            return (h, *rest)

        handle = model.layers[1].register_forward_pre_hook(hook)
        with torch.no_grad():
            out = model(ids, mask, tasks=["ner"])
        handle.remove()
        return out.logits["ner"]

    base = forward(0.0)
    assert (base - forward(0.5)).abs().max() > 1e-3
    # Control: another task's route at layer 0 reaches ner only through the shared gate, which reads layer 0's
    # *input*; its layer-0 output is read by nobody but that task in the last layer.
    torch.testing.assert_close(base, forward(0.5, "sent"), atol=1e-6, rtol=0)


@pytest.mark.parametrize("ffn", ["mmoe", "mmoe_stacked"])
def test_mmoe_has_only_shared_experts(ffn):
    model = perturb(tiny_model(ffn=ffn, seed=9)).eval()
    for layer in model.layers:
        if isinstance(layer.ffn, SwiGLU):  # mmoe's shared bottom
            assert ffn == "mmoe" and layer is not model.layers[-1]
            continue
        assert len(layer.ffn.task_experts) == 0
        assert layer.ffn.shared_gate is None
        assert set(layer.ffn.task_gates) == set(model.task_names)
        for name in model.task_names:
            assert layer.ffn.expert_names(name, model.task_names) == [
                f"{SHARED}/{i}" for i in range(model.cfg.n_shared_experts)
            ]
    batch = tiny_batch([5, 3], seed=9)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"])
    for block, gates in zip(model.expert_blocks(), out.gates, strict=True):
        if block is None:
            assert gates == {}
            continue
        assert set(gates) == set(model.task_names)
        for weights in gates.values():
            assert weights.shape[1] == model.cfg.n_shared_experts
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[0]), atol=1e-6, rtol=0)


def test_mlp_has_no_experts_and_no_gates():
    model = perturb(tiny_model(ffn="mlp", seed=10)).eval()
    assert not any(isinstance(m, (Gate, ExpertGroup)) for m in model.modules())
    assert all(isinstance(layer.ffn, SwiGLU) for layer in model.layers)
    batch = tiny_batch([5, 3], seed=10)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"])
    assert out.layout.names == [SHARED]
    assert len(out.gates) == model.cfg.n_layers
    assert all(g == {} for g in out.gates)
    assert set(out.logits) == set(model.task_names)


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_batch_without_any_label_gives_an_empty_output(ffn):
    # Regression: for cgc/mmoe no task has an example, so RouteLayout.build gets no routes; torch.cat([]) used
    # to raise there, while ple and mlp returned an empty output.
    model = tiny_model(ffn=ffn, seed=12)
    batch = tiny_batch([5, 3], seed=12)
    labels = {"ner": torch.full_like(batch["labels"]["ner"], -100), "sent": torch.full((2,), -100)}
    out = model(batch["input_ids"], batch["attention_mask"], labels=labels, word_read=batch["word_read"])
    assert out.logits == {} and out.losses == {}
    assert out.loss is None
    assert len(out.gates) == model.cfg.n_layers


# ---------------------------------------------------------------------------------- the shared bottom and the fork


def _rows_through_layers(model, batch, labels=None):
    """Rows entering each layer, leaving it, and passing through its attention."""
    seen = {"in": [], "out": [], "attention": []}
    hooks = []
    for layer in model.layers:
        hooks.append(layer.register_forward_pre_hook(lambda _m, args: seen["in"].append(args[0].shape[0])))
        hooks.append(layer.register_forward_hook(lambda _m, _a, out: seen["out"].append(out[0].shape[0])))
        hooks.append(layer.attn.register_forward_hook(lambda _m, args, _o: seen["attention"].append(args[0].shape[0])))
    try:
        with torch.no_grad():
            out = model(batch["input_ids"], batch["attention_mask"], labels=labels, word_read=batch["word_read"])
    finally:
        for h in hooks:
            h.remove()
    return seen, out


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_layers_up_to_the_fork_run_one_row_per_example(ffn):
    """The shared bottom (and the first expert layer's attention) runs once per example; only the first expert
    layer's block forks the stream into one row per (example, route)."""
    model = perturb(tiny_model(ffn=ffn, n_layers=3, seed=13)).eval()
    batch = tiny_batch([6, 5, 4], seed=13)
    seen, out = _rows_through_layers(model, batch)
    B, N = 3, len(out.layout.row_example)
    routes = {"ple": 3, "mlp": 1}.get(ffn, 2)  # ple: both tasks and the shared route; mlp: one stream
    assert routes * B == N
    fork = {"cgc": 2, "mmoe": 2, "mlp": 3}.get(ffn, 0)  # single-level: the top layer; stacked and ple: layer 0
    assert model.fork_layer == fork
    assert seen["in"] == [B if i <= fork else N for i in range(3)]
    assert seen["attention"] == seen["in"]
    assert seen["out"] == [B if i < fork else N for i in range(3)]


@pytest.mark.parametrize("ffn", ["cgc", "mmoe"])
def test_single_level_variants_hold_experts_and_gates_only_in_the_top_layer(ffn):
    model = perturb(tiny_model(ffn=ffn, n_layers=3, seed=14)).eval()
    *bottom, top = model.layers
    for layer in bottom:  # a plain SwiGLU MLP of width mlp_width, as in the mlp variant
        assert isinstance(layer.ffn, SwiGLU)
        assert layer.ffn.down.in_features == model.cfg.mlp_width
        assert not any(isinstance(m, (Gate, ExpertGroup)) for m in layer.modules())
    assert set(top.ffn.task_gates) == set(model.task_names) and top.ffn.shared_gate is None
    assert sum(isinstance(m, Gate) for m in model.modules()) == len(model.task_names)
    batch = tiny_batch([6, 5], seed=14)
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"])
    assert out.gates[:-1] == [{}, {}] and set(out.gates[-1]) == set(model.task_names)


def _count_expert_tokens(block):
    """ExpertGroup -> tokens it was called on, for the groups of ``block``."""
    calls = {}
    groups = {SHARED: block.shared, **block.task_experts}
    hooks = [
        g.register_forward_hook(lambda _m, args, _o, name=name: calls.setdefault(name, []).append(args[0].shape[0]))
        for name, g in groups.items()
    ]
    return calls, hooks


@pytest.mark.parametrize("ffn", ["ple", "cgc", "mmoe", "cgc_stacked", "mmoe_stacked"])
def test_the_fork_runs_each_expert_once_on_exactly_the_tokens_that_read_it(ffn):
    """At the fork every route reads the same bottom tokens: the shared experts run once per bottom token (not once
    per route), each task's experts once on the tokens of its route's examples."""
    model = perturb(tiny_model(ffn=ffn, n_layers=2, seed=15)).eval()
    batch = tiny_batch([6, 5, 4, 3], seed=15)
    mask = batch["attention_mask"]
    labels = batch["labels"]
    if ffn != "ple":  # ner on examples 0-2, sent on 1-3: the routes overlap in part (ple runs every route anyway)
        labels = {
            "ner": torch.where(torch.tensor([1, 1, 1, 0])[:, None].bool(), labels["ner"], -100),
            "sent": torch.where(torch.tensor([0, 1, 1, 1]).bool(), labels["sent"], -100),
        }
    route_examples = (
        {"ner": [0, 1, 2], "sent": [1, 2, 3]} if ffn != "ple" else {"ner": [0, 1, 2, 3], "sent": [0, 1, 2, 3]}
    )
    block = model.layers[model.fork_layer].ffn
    calls, hooks = _count_expert_tokens(block)
    try:
        _rows_through_layers(model, batch, labels)
    finally:
        for h in hooks:
            h.remove()
    tokens = mask.sum(1)
    assert calls[SHARED] == [int(tokens.sum())]  # every bottom token once, though two routes read most of them
    for task in block.task_experts:
        assert calls[task] == [int(tokens[route_examples[task]].sum())]


@pytest.mark.parametrize("ffn", ["cgc", "mmoe"])
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_single_level_variants_compute_the_papers_function(ffn, attention):
    """Written out from the papers: a shared bottom (here the trunk's lower layers, and the top layer's attention)
    gives x; task k's output is the bottom plus sum_e g_k(x)_e * expert_e(x) over [task-k experts, shared experts]
    (CGC) or over the shared experts alone (MMoE); task k's head reads it."""
    model = perturb(tiny_model(ffn=ffn, attention=attention, n_layers=2, seed=16)).eval()
    batch = tiny_batch([6, 4, 5], seed=16)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        out = model(ids, mask)
        rope, key_mask = model.rope(ids.shape[1]), model._attention_mask(mask, torch.arange(3))
        bottom, top = model.layers
        h = model.embed(ids)
        h = h + bottom.attn(bottom.attn_norm(h), key_mask, rope)
        h = h + bottom.ffn(bottom.ffn_norm(h))
        h = h + top.attn(top.attn_norm(h), key_mask, rope)
        x = top.ffn_norm(h)[mask]  # (M, C) real tokens
        y_shared = list(top.ffn.shared(x))
        for task in model.task_names:
            experts = (list(top.ffn.task_experts[task](x)) if ffn == "cgc" else []) + y_shared
            weights = torch.softmax(top.ffn.task_gates[task].proj(x), -1)
            route = h.clone()
            route[mask] = h[mask] + sum(weights[:, e : e + 1] * y for e, y in enumerate(experts))
            hidden = model.final_norm(route)
            if model.task(task).kind == "sentence_classification":
                hidden = model._pool(hidden, mask)
                torch.testing.assert_close(out.logits[task], model.heads[task](hidden), atol=1e-5, rtol=1e-5)
            else:
                torch.testing.assert_close(
                    out.logits[task][mask], model.heads[task](hidden)[mask], atol=1e-5, rtol=1e-5
                )
