"""Each balancing method's weights on scripted loss sequences."""

from __future__ import annotations

import math

import pytest
import torch

from mtl_decoder.config import BalancingConfig
from mtl_decoder.training.balancing import LossBalancer


def _feed(balancer: LossBalancer, sequence: list[dict[str, float]]) -> list[dict[str, float]]:
    seen = []
    for values in sequence:
        balancer.observe(values)
        seen.append(balancer.weights())
    return seen


def test_ema_starts_at_the_first_value_and_follows_the_decay():
    bal = LossBalancer(BalancingConfig(method="ema", beta=0.9), ["a", "b"])
    weights = _feed(bal, [{"a": 2.0, "b": 0.5}, {"a": 1.0}])
    assert weights[0] == pytest.approx({"a": 0.5, "b": 2.0})
    assert weights[1]["a"] == pytest.approx(1 / (0.9 * 2.0 + 0.1 * 1.0))
    assert weights[1]["b"] == pytest.approx(2.0)  # a task absent from a batch keeps its average


def test_ema_gives_tasks_with_100x_loss_scales_equal_effective_weight():
    bal = LossBalancer(BalancingConfig(method="ema", beta=0.95), ["small", "big"])
    for step in range(200):
        noise = 1 + 0.05 * math.sin(step)
        bal.observe({"small": 0.01 * noise, "big": 1.0 * noise})
    w = bal.weights()
    assert w["small"] * 0.01 == pytest.approx(w["big"] * 1.0, rel=1e-6)
    losses = {"small": torch.tensor(0.01), "big": torch.tensor(1.0)}
    total = bal.combine(losses)
    assert float(total) == pytest.approx(w["small"] * 0.01 + w["big"] * 1.0)


def test_ema_guards_keep_weights_within_bounds_of_the_mean():
    bal = LossBalancer(BalancingConfig(method="ema", beta=0.0, min_weight=0.5, max_weight=2.0), ["a", "b"])
    bal.observe({"a": 0.01, "b": 1.0})  # raw weights 100 and 1, mean 50.5: b is lifted to the floor
    w = bal.weights()
    assert w["a"] == pytest.approx(100.0)
    assert w["b"] == pytest.approx(0.5 * 50.5)
    three = LossBalancer(BalancingConfig(method="ema", beta=0.0, max_weight=1.5), ["a", "b", "c"])
    three.observe({"a": 0.01, "b": 1.0, "c": 1.0})  # raw 100, 1, 1: mean 34
    assert three.weights() == pytest.approx({"a": 1.5 * 34, "b": 1.0, "c": 1.0})


def test_equal_static_and_scale():
    losses = {"a": torch.tensor(2.0), "b": torch.tensor(3.0)}
    equal = LossBalancer(BalancingConfig(method="equal", scale=0.5), ["a", "b"])
    assert equal.weights() == {"a": 1.0, "b": 1.0}
    assert float(equal.combine(losses)) == pytest.approx(0.5 * 5.0)
    static = LossBalancer(BalancingConfig(method="static"), ["a", "b"], {"a": 0.25, "b": 2.0})
    assert float(static.combine(losses)) == pytest.approx(0.25 * 2 + 2.0 * 3)


def test_dwa_uses_the_ratio_of_the_last_two_epoch_means():
    bal = LossBalancer(BalancingConfig(method="dwa", temperature=2.0), ["a", "b"])
    assert bal.weights() == {"a": 1.0, "b": 1.0}
    _feed(bal, [{"a": 1.0, "b": 1.0}, {"a": 3.0, "b": 1.0}])  # epoch 1 means: a 2, b 1
    bal.end_epoch()
    assert bal.weights() == {"a": 1.0, "b": 1.0}  # one epoch is not enough for a ratio
    _feed(bal, [{"a": 1.0, "b": 1.0}])  # epoch 2 means: a 1 (ratio 0.5), b 1 (ratio 1)
    bal.end_epoch()
    w = bal.weights()
    ea, eb = math.exp(0.5 / 2), math.exp(1.0 / 2)
    assert w["a"] == pytest.approx(2 * ea / (ea + eb))
    assert w["b"] == pytest.approx(2 * eb / (ea + eb))
    assert sum(w.values()) == pytest.approx(2.0)


def test_uncertainty_learns_log_variances():
    bal = LossBalancer(BalancingConfig(method="uncertainty"), ["a", "b"])
    assert bal.weights() == {"a": 1.0, "b": 1.0}
    opt = torch.optim.SGD(bal.parameters(), lr=0.1)
    for _ in range(300):  # the optimum of exp(-s) L + s is s = log L
        opt.zero_grad()
        bal.combine({"a": torch.tensor(4.0), "b": torch.tensor(0.25)}).backward()
        opt.step()
    w = bal.weights()
    assert w["a"] == pytest.approx(0.25, rel=0.02)
    assert w["b"] == pytest.approx(4.0, rel=0.02)


def test_state_round_trip_restores_weights():
    cfg = BalancingConfig(method="ema", beta=0.9)
    bal = LossBalancer(cfg, ["a", "b"])
    _feed(bal, [{"a": 2.0, "b": 0.5}, {"a": 1.0, "b": 0.7}])
    copy = LossBalancer(cfg, ["a", "b"])
    copy.load(bal.state())
    assert copy.weights() == bal.weights()
