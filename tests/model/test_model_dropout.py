"""The model's dropout drops a share p of the elements, keeps the expectation, and never rounds p away."""

import math

import pytest
import torch

from mtl_decoder.config import load_config
from mtl_decoder.errors import ConfigError
from mtl_decoder.model.layers import Dropout


@pytest.mark.parametrize("p", [0.001, 0.0003, 0.1, 0.5])
def test_drop_rate_is_p_within_binomial_error(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = Dropout(p).train()(x)
    dropped = (y == 0).double().mean().item()
    sd = math.sqrt(p * (1 - p) / x.numel())
    assert abs(dropped - p) < 5 * sd + 2**-16  # the first form dropped nothing at p = 0.001 and 0.0003
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, kept[0].item()))  # one scale for every kept element
    assert abs(y.double().mean().item() - 1.0) < 5 * sd / (1 - p) + 1e-4  # E[y] = x


def test_eval_and_zero_p_are_the_identity():
    x = torch.randn(64, 32)
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)


def test_a_p_too_small_to_draw_is_refused_not_rounded_to_zero(tmp_path):
    with pytest.raises(ValueError, match="1/65,536"):
        Dropout(1e-6)
    with pytest.raises(ConfigError, match=r"model\.dropout"):
        load_config("configs/demo.yaml", ["model.dropout=1e-6"])
