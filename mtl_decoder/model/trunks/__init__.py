"""Ways of reading a trunk, by name: each a ``Trunk`` (base.py) in a file of its own, registered here once.

    native     NativeTrunk     the native decoder, trained from scratch
    frozen     FrozenTrunk     native PLE layers over a frozen pretrained trunk's cached states
    layer_mix  LayerMixTrunk   the same over a learned mix of several blocks' cached states (read_layers)
    hybrid     HybridTrunk     the top pretrained blocks trained over the cached lower ones, native layers above
    upcycle    UpcycleTrunk    a pretrained trunk, each MLP an expert block of trained copies
    lora       LoraTrunk       a frozen pretrained trunk, each expert its MLP plus a low-rank update
    echo       EchoTrunk       as frozen, each text read twice and the states of its second copy kept
    echo_hybrid  EchoHybridTrunk  as hybrid, its cached blocks reading each text twice as echo does

The builder picks one by name (``trunk_name``: 'native' without model.trunk.pretrained, 'layer_mix' for mode
frozen with several read_layers, else model.trunk.mode); adding a way is a new file and a ``register_trunk``
line (a registered name becomes a valid model.trunk.mode).
"""

from __future__ import annotations

from mtl_decoder.config import ModelConfig, TrunkConfig
from mtl_decoder.config.trunk import TRUNK_MODES, allow_trunk_mode
from mtl_decoder.model.trunks.base import PRECISIONS, Trunk
from mtl_decoder.model.trunks.echo import EchoTrunk
from mtl_decoder.model.trunks.echo_hybrid import EchoHybridTrunk
from mtl_decoder.model.trunks.frozen import FrozenTrunk
from mtl_decoder.model.trunks.hybrid import HybridTrunk
from mtl_decoder.model.trunks.layermix import LayerMixTrunk
from mtl_decoder.model.trunks.lora import LoraTrunk
from mtl_decoder.model.trunks.native import NativeTrunk
from mtl_decoder.model.trunks.pretrained import TRUNK_DIR, TRUNK_FILE, PretrainedTrunk
from mtl_decoder.model.trunks.upcycle import UpcycleTrunk

TRUNKS: dict[str, type[Trunk]] = {}


def register_trunk(trunk: type[Trunk]) -> type[Trunk]:
    """Make ``trunk`` the way named ``trunk.name`` (a valid model.trunk.mode from now on); returns it."""
    TRUNKS[trunk.name] = trunk
    allow_trunk_mode(trunk.name, trunk.caches_states)
    return trunk


def trunk_name(trunk: TrunkConfig) -> str:
    """The registry name a trunk config asks for (see the module doc)."""
    if trunk.mode not in TRUNK_MODES:  # a registered way of its own
        return trunk.mode
    if not trunk.enabled:
        return NativeTrunk.name
    if trunk.mode == FrozenTrunk.name and trunk.mixes_layers:
        return LayerMixTrunk.name
    return trunk.mode


def trunk_for(cfg: ModelConfig) -> Trunk:
    """The trunk ``cfg`` asks for, not yet assembled (config-level questions only)."""
    return TRUNKS[trunk_name(cfg.trunk)](cfg)


TRUNKS.update(
    {
        t.name: t
        for t in (
            NativeTrunk,
            FrozenTrunk,
            LayerMixTrunk,
            HybridTrunk,
            UpcycleTrunk,
            LoraTrunk,
            EchoTrunk,
            EchoHybridTrunk,
        )
    }
)

__all__ = [
    "PRECISIONS",
    "TRUNKS",
    "TRUNK_DIR",
    "TRUNK_FILE",
    "PretrainedTrunk",
    "Trunk",
    "register_trunk",
    "trunk_for",
    "trunk_name",
]
