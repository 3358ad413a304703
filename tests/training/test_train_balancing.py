"""Each balancing method's weights on scripted loss sequences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtl_decoder.config import BalancingConfig
from mtl_decoder.errors import ConfigError
from mtl_decoder.training.balancing import LossBalancer, bounded_weights


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


def test_ema_guards_bind_with_two_tasks():
    """The issue's numbers: EMA losses 0.01 and 1.0. The old guard clipped against the unclipped arithmetic mean
    (weights 100 and 25.25, so max_weight 2.0 never acted); now the weights are bounded around their geometric
    mean, which stays 1."""
    bal = LossBalancer(BalancingConfig(method="ema", beta=0.0, min_weight=0.5, max_weight=2.0), ["a", "b"])
    bal.observe({"a": 0.01, "b": 1.0})
    assert bal.weights() == pytest.approx({"a": 2.0, "b": 0.5})
    cap_only = LossBalancer(BalancingConfig(method="ema", beta=0.0, max_weight=2.0), ["a", "b"])
    cap_only.observe({"a": 0.01, "b": 1.0})
    assert cap_only.weights() == pytest.approx({"a": 2.0, "b": 0.5})  # the cap alone binds too
    close = LossBalancer(BalancingConfig(method="ema", beta=0.0, min_weight=0.5, max_weight=2.0), ["a", "b"])
    close.observe({"a": 0.8, "b": 1.0})  # within the bounds: the unguarded ratio, at geometric mean 1
    w = close.weights()
    assert w["a"] / w["b"] == pytest.approx(1.25) and w["a"] * w["b"] == pytest.approx(1.0)


def test_ema_guards_water_fill_several_tasks():
    bal = LossBalancer(BalancingConfig(method="ema", beta=0.0, min_weight=0.5, max_weight=2.0), list("abcd"))
    bal.observe({"a": 0.001, "b": 0.5, "c": 1.0, "d": 1000.0})
    w = bal.weights()
    assert math.prod(w.values()) == pytest.approx(1.0)  # the geometric mean stays 1
    assert w["a"] == pytest.approx(2.0) and w["d"] == pytest.approx(0.5)  # both bounds bind
    assert w["b"] == pytest.approx(2**0.5) and w["c"] == pytest.approx(2**-0.5)  # free: their raw ratio
    tighter = LossBalancer(BalancingConfig(method="ema", beta=0.0, min_weight=0.5, max_weight=1.5), list("abcd"))
    tighter.observe({"a": 0.001, "b": 0.5, "c": 1.0, "d": 1000.0})
    # b would be 1.63 with a and d at their bounds: it is capped too, and c alone takes up the rest
    assert tighter.weights() == pytest.approx({"a": 1.5, "b": 1.5, "c": 1 / (1.5 * 1.5 * 0.5), "d": 0.5})
    late = LossBalancer(BalancingConfig(method="ema", beta=0.0, min_weight=0.5, max_weight=2.0), list("abc"))
    late.observe({"a": 0.01, "b": 1.0})  # c not seen yet: weight 1, the others bounded among themselves
    assert late.weights() == pytest.approx({"a": 2.0, "b": 0.5, "c": 1.0})


@pytest.mark.parametrize("seed", range(20))
def test_bounded_weights_hold_their_definition(seed):
    rng = np.random.default_rng(seed)
    raw = list(np.exp(rng.normal(0, 3, rng.integers(1, 7))))
    lo, hi = float(rng.uniform(0.1, 1.0)), float(rng.uniform(1.0, 5.0))
    w = np.array(bounded_weights(raw, lo, hi))
    assert np.log(w).sum() == pytest.approx(0.0, abs=1e-9)
    assert np.all(w >= lo * (1 - 1e-9)) and np.all(w <= hi * (1 + 1e-9))
    free = (w > lo * (1 + 1e-9)) & (w < hi * (1 - 1e-9))
    if free.sum() >= 2:  # weights strictly inside the bounds keep the raw ratios
        ratio = w[free] / np.array(raw)[free]
        assert np.allclose(ratio, ratio[0])
    order = np.argsort(raw)
    assert np.all(np.diff(w[order]) >= -1e-12)  # a larger raw weight never gets a smaller bounded one


def test_guards_must_bracket_one():
    for bad in ({"min_weight": 1.5}, {"max_weight": 0.8}):
        with pytest.raises(ConfigError):
            BalancingConfig(method="ema", **bad)


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


def test_uncertainty_uses_kendalls_classification_form():
    """Kendall et al. 2018, eq. (10), softmax likelihood: L / sigma^2 + log sigma = exp(-s) L + s / 2 for
    s = log sigma^2, whose optimum is s = log(2 L), weight 1 / (2 L). The old code used exp(-s) L + s (optimum
    weight 1 / L)."""
    bal = LossBalancer(BalancingConfig(method="uncertainty"), ["a", "b"])
    assert bal.weights() == {"a": 1.0, "b": 1.0}
    with torch.no_grad():
        bal.log_vars.copy_(torch.tensor([0.7, -0.3]))
    total = bal.combine({"a": torch.tensor(4.0), "b": torch.tensor(0.25)})
    expected = math.exp(-0.7) * 4.0 + 0.35 + math.exp(0.3) * 0.25 - 0.15
    assert total.item() == pytest.approx(expected)
    with torch.no_grad():
        bal.log_vars.zero_()
    opt = torch.optim.SGD(bal.parameters(), lr=0.1)
    for _ in range(400):
        opt.zero_grad()
        bal.combine({"a": torch.tensor(4.0), "b": torch.tensor(0.25)}).backward()
        opt.step()
    w = bal.weights()
    assert w["a"] == pytest.approx(1 / 8, rel=0.02)
    assert w["b"] == pytest.approx(2.0, rel=0.02)


def test_state_round_trip_restores_weights():
    cfg = BalancingConfig(method="ema", beta=0.9)
    bal = LossBalancer(cfg, ["a", "b"])
    _feed(bal, [{"a": 2.0, "b": 0.5}, {"a": 1.0, "b": 0.7}])
    copy = LossBalancer(cfg, ["a", "b"])
    copy.load(bal.state())
    assert copy.weights() == bal.weights()
