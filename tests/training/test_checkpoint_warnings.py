"""Accelerate's 'Removed shared tensor' warning is hidden only for the aliases a model has by construction."""

import logging

import torch

from mtl_decoder.training.checkpoints import _ExpectedAliases, tensor_aliases


def _record(names: set[str]) -> logging.LogRecord:
    msg = f"Removed shared tensor {names} while saving. This should be OK, but check by verifying ..."
    return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 1, msg, None, None)


def test_aliases_are_the_later_names_of_one_storage():
    w = torch.zeros(4, 4)
    state = {"a.weight": w, "b.weight": w, "c.weight": torch.zeros(4, 4), "d.weight": w[:2]}
    assert tensor_aliases(state) == {"b.weight", "d.weight"}


def test_only_a_warning_about_expected_aliases_is_dropped():
    quiet = _ExpectedAliases({"experts.1.up.weight", "experts.2.up.weight"})
    assert not quiet.filter(_record({"experts.1.up.weight"}))
    assert not quiet.filter(_record({"module.experts.2.up.weight", "experts.1.up.weight"}))
    prefixed = _record({"experts.1.up.weight"})
    prefixed.msg = "[RANK 0] " + prefixed.msg  # as Accelerate's multi-process logger writes it
    assert not quiet.filter(prefixed)
    assert quiet.filter(_record({"experts.1.up.weight", "head.weight"}))  # one unexpected name: a real warning
    other = logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 1, "something else", None, None)
    assert quiet.filter(other)
