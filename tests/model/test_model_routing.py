"""Which experts and gates each variant has, and where each task's gradient may flow."""

import pytest
import torch
from model_testkit import perturb, tiny_batch, tiny_model, tiny_specs

from mtl_decoder.config import TAGGING
from mtl_decoder.model import SHARED, ExpertGroup, Gate, TaskHeadSpec
from mtl_decoder.model.layers import SwiGLU


def _grad_norm(module: torch.nn.Module) -> float:
    return sum(0.0 if p.grad is None else p.grad.abs().sum().item() for p in module.parameters())


def _three_task_specs():
    return [*tiny_specs(), TaskHeadSpec("pos", TAGGING, ("N", "V", "X"))]


def _loss_of(model, batch, task):
    out = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], word_index=batch["word_index"])
    assert set(out.losses) == set(batch["labels"])
    return out, out.losses[task]


def _three_task_batch():
    batch = tiny_batch([6, 5, 4, 6], seed=11)
    gen = torch.Generator().manual_seed(12)
    pos = torch.randint(3, batch["labels"]["ner"].shape, generator=gen)
    batch["labels"]["pos"] = torch.where(batch["labels"]["ner"] == -100, -100, pos)
    return batch


@pytest.mark.parametrize("task", ["ner", "sent", "pos"])
def test_cgc_task_loss_reaches_only_its_own_experts_and_gate(task):
    model = perturb(tiny_model(ffn="cgc", specs=_three_task_specs(), seed=5))
    model.train()  # dropout is 0: train mode only to be sure no eval-only path is tested
    batch = _three_task_batch()
    _, loss = _loss_of(model, batch, task)
    loss.backward()
    for layer in model.layers:
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
        out = model(batch["input_ids"], batch["attention_mask"], word_index=batch["word_index"])
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


def test_mmoe_has_only_shared_experts():
    model = perturb(tiny_model(ffn="mmoe", seed=9)).eval()
    for layer in model.layers:
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
    for gates in out.gates:
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


@pytest.mark.parametrize("ffn", ["ple", "cgc", "mmoe", "mlp"])
def test_batch_without_any_label_gives_an_empty_output(ffn):
    # Regression: for cgc/mmoe no task has an example, so RouteLayout.build gets no routes; torch.cat([]) used
    # to raise there, while ple and mlp returned an empty output.
    model = tiny_model(ffn=ffn, seed=12)
    batch = tiny_batch([5, 3], seed=12)
    labels = {"ner": torch.full_like(batch["labels"]["ner"], -100), "sent": torch.full((2,), -100)}
    out = model(batch["input_ids"], batch["attention_mask"], labels=labels, word_index=batch["word_index"])
    assert out.logits == {} and out.losses == {}
    assert out.loss is None
    assert len(out.gates) == model.cfg.n_layers
