"""model.position_embedding linear: the sub-layer x * (1 + alpha_i) + beta_i is exactly the identity at
initialisation, the tanh bound holds, positions past the table are an error, the inference table is computed once
and gives the same outputs as the training path, and the option trains through the CLI."""

from __future__ import annotations

import pytest
import torch
import yaml
from model_testkit import perturb, tiny_batch, tiny_model

from mtl_decoder.cli import main
from mtl_decoder.config import ModelConfig
from mtl_decoder.errors import ConfigError, UserError
from mtl_decoder.model.positions import PositionScaleShift
from mtl_decoder.saved import load_model

LINEAR = [("linear", "input"), ("linear", "every_layer"), ("linear_only", "input")]


def _inputs(model, lengths=(7, 4)):
    batch = tiny_batch(list(lengths))
    mask = batch["attention_mask"].bool()
    return batch["input_ids"], mask, model.route_layout(mask, model.task_names, None)


@pytest.mark.parametrize("bound", [None, 0.5])
@pytest.mark.parametrize(("kind", "where"), LINEAR)
@torch.no_grad()
def test_the_sublayer_is_exactly_the_identity_at_initialisation(kind, where, bound):
    model = tiny_model(position_embedding=kind, position_embedding_where=where, position_scale_bound=bound)
    layer = model.positions
    assert layer is not None and layer.weight.shape[0] == (model.cfg.n_layers if where == "every_layer" else 1)
    x = torch.randn(3, 9, model.cfg.d_model) * 5
    positions = torch.arange(9)
    for sublayer in range(layer.weight.shape[0]):
        assert torch.equal(layer(x, sublayer, positions), x)  # a factor of 2 (scale rows at 1) would fail here
    # the whole model: the same function as without the sub-layer (perturbed, so the layers do something)
    perturb(model)
    with torch.no_grad():
        layer.weight.zero_()
    ids, mask, layout = _inputs(model)
    with_layer, _ = model.encode(ids, mask, layout, {})
    model.positions = None
    without, _ = model.encode(ids, mask, layout, {})
    assert torch.equal(with_layer, without)


def test_gradients_reach_the_map_and_then_the_table():
    """Identity at the start does not mean stuck there: W gets a gradient at once (from the table's random code), and
    the table once W is no longer zero."""
    model = perturb(tiny_model(position_embedding="linear"))
    with torch.no_grad():
        model.positions.weight.zero_()
    ids, mask, _ = _inputs(model)
    out = model(ids, mask, labels=None)
    out.logits["ner"].pow(2).sum().backward()
    assert model.positions.weight.grad.abs().sum() > 0


@torch.no_grad()
def test_the_tanh_bound_holds_the_scale():
    layer = PositionScaleShift(1, 16, 8, scale_bound=0.25)
    layer.weight.normal_(std=10.0)
    layer.train()
    alpha, beta = layer.coefficients(0, torch.arange(16)).chunk(2, dim=-1)
    assert alpha.abs().max() <= 0.25 and beta.abs().max() > 1.0  # tanh saturates at the bound; beta is not bounded
    unbounded = PositionScaleShift(1, 16, 8)
    unbounded.load_state_dict(layer.state_dict())
    assert unbounded.coefficients(0, torch.arange(16)).chunk(2, dim=-1)[0].abs().max() > 1.0


def test_positions_past_the_table_are_an_error():
    model = tiny_model(position_embedding="linear", position_max_length=8)
    ids, mask, layout = _inputs(model, lengths=(9, 3))
    with pytest.raises(UserError, match="position 8 is past the position table's 8 rows"):
        model.encode(ids, mask, layout, {})
    ids, mask, layout = _inputs(model, lengths=(8, 3))
    model.encode(ids, mask, layout, {})  # positions 0..7 fit
    with pytest.raises(ConfigError, match="position_embedding"):
        ModelConfig(position_embedding="learned")
    with pytest.raises(ConfigError, match="position_embedding_where"):
        ModelConfig(position_embedding_where="everywhere")


def test_data_max_length_must_fit_the_table(tmp_path):
    from helpers import tiny_config

    with pytest.raises(ConfigError, match=r"model\.position_max_length"):
        tiny_config(tmp_path, ["model.position_embedding=linear", "model.position_max_length=32"])  # max_length 48
    tiny_config(tmp_path, ["model.position_embedding=rope", "model.position_max_length=32"])  # unused with RoPE


@pytest.mark.parametrize(("kind", "where"), LINEAR)
def test_the_inference_table_is_computed_once_and_gives_the_same_outputs(kind, where):
    model = perturb(tiny_model(position_embedding=kind, position_embedding_where=where, position_scale_bound=0.5))
    ids, mask, layout = _inputs(model)
    model.eval()
    with torch.enable_grad():  # the training path: the table's rows through the map, position by position
        direct, _ = model.encode(ids, mask, layout, {})
    assert model.positions.table_builds == 0
    with torch.inference_mode():
        tabled, _ = model.encode(ids, mask, layout, {})
        again, _ = model.encode(ids, mask, layout, {})
    assert model.positions.table_builds == 1
    assert torch.allclose(tabled, direct.detach(), atol=1e-6, rtol=0) and torch.equal(tabled, again)
    # the parameters change (an optimizer step): the table follows
    with torch.no_grad():
        model.positions.weight.add_(0.1)
    with torch.enable_grad():
        direct, _ = model.encode(ids, mask, layout, {})
    with torch.inference_mode():
        tabled, _ = model.encode(ids, mask, layout, {})
    assert model.positions.table_builds == 2
    assert torch.allclose(tabled, direct.detach(), atol=1e-6, rtol=0)


def test_linear_positions_train_through_the_cli(tmp_path):
    from helpers import TINY, tiny_tasks

    config = {**TINY, "tasks": tiny_tasks()}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run = tmp_path / "run"
    overrides = ["model.position_embedding=linear", "model.position_embedding_where=every_layer"]
    assert main(["train", "--config", str(path), "--output-dir", str(run), *overrides, "training.max_steps=6"]) == 0
    saved = load_model(run / "best")
    assert saved.config.model.position_embedding == "linear"
    assert saved.model.positions.weight.abs().sum() > 0, "the map left zero: it trained"
    out = tmp_path / "out.jsonl"
    (tmp_path / "in.txt").write_text("Peter lives in London\n", encoding="utf-8")
    assert (
        main(["predict", "--model", str(run / "best"), "--input", str(tmp_path / "in.txt"), "--output", str(out)]) == 0
    )
