"""The trunk registry: each config picks one way of reading its trunk by name, once, and the way answers what the
package asks (a pretrained checkpoint or not, the precisions, streaming, its banner line) without a model."""

from __future__ import annotations

import pytest
from helpers import tiny_config

from mtl_decoder.errors import ConfigError
from mtl_decoder.model.trunks import TRUNKS, trunk_for, trunk_name

PRETRAINED = "model.trunk.pretrained=some/model"
CASES = {
    "native": [],
    "frozen": [PRETRAINED, "model.trunk.mode=frozen"],
    "layer_mix": [PRETRAINED, "model.trunk.mode=frozen", "model.trunk.read_layers=[8, 16]"],
    "hybrid": [PRETRAINED, "model.trunk.mode=hybrid"],
    "upcycle": [PRETRAINED, "model.trunk.mode=upcycle", "model.attention=causal"],
    "lora": [PRETRAINED, "model.trunk.mode=lora", "model.attention=causal"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_config_picks_its_trunk_by_name(tmp_path, name):
    cfg = tiny_config(tmp_path, CASES[name])
    trunk = trunk_for(cfg.model)
    assert trunk_name(cfg.model.trunk) == name and type(trunk) is TRUNKS[name] and trunk.name == name
    assert trunk.pretrained == (name != "native")
    assert trunk.streams == (name == "native")
    assert trunk.supports("int8") == (name not in ("upcycle", "lora")) and trunk.supports("bf16")
    assert trunk.describe()


def test_a_read_layers_list_of_the_last_block_alone_is_the_frozen_trunk(tmp_path):
    cfg = tiny_config(tmp_path, [PRETRAINED, "model.trunk.read_layers=[16]"])
    assert trunk_name(cfg.model.trunk) == "frozen"


def test_an_unregistered_mode_is_still_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^config key 'model.trunk.mode'"):
        tiny_config(tmp_path, ["model.trunk.mode=no_such_trunk"])


def test_a_trunk_asked_for_its_model_before_it_built_one_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="has no model yet"):
        trunk_for(tiny_config(tmp_path).model).state_to_save()


def test_every_layer_mix_the_config_accepts_has_its_module():
    from mtl_decoder.config.trunk import LAYER_MIXES as ACCEPTED
    from mtl_decoder.model.pretrained.layermix import LAYER_MIXES

    assert sorted(LAYER_MIXES) == sorted(ACCEPTED)
