"""From a config to a model: the one place that decides which trunk and heads an experiment gets.

model.trunk.pretrained unset     -> MTLDecoder: the native trunk, trained from scratch
model.trunk.mode: upcycle | lora -> PretrainedDecoder: a transformers model, PLE in each of its blocks
model.trunk.mode: frozen         -> FrozenDecoder: native PLE layers over a frozen model's cached states
    with model.trunk.read_layers -> LayerMixDecoder: the same over a learned mix of several blocks' states
model.trunk.mode: hybrid         -> HybridDecoder: the top blocks trained (upcycle or lora) over the cached lower
                                    blocks, native PLE layers (if any) above
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec


def head_specs(config: ExperimentConfig, label_sets: dict[str, list[str]]) -> list[TaskHeadSpec]:
    return [TaskHeadSpec(name, task.kind, tuple(label_sets[name])) for name, task in config.tasks.items()]


def build_model(
    config: ExperimentConfig,
    label_sets: dict[str, list[str]],
    encoder: TextEncoder,
    saved_trunk: Path | None = None,
    expected_identity: dict | None = None,
) -> MultiTaskModel:
    """A freshly initialised model for ``config``'s tasks with these label sets and this tokenizer.

    A pretrained trunk is loaded from ``model.trunk.pretrained``, or, for a saved model, from ``saved_trunk``
    (its trunk/ folder) when that holds the weights (model.trunk.save=full) or when every trunk weight is in the
    model's own weights file (mode upcycle: only the architecture is read); ``expected_identity`` (the saved
    model's trunk.json) must match the weights loaded."""
    specs = head_specs(config, label_sets)
    trunk = config.model.trunk
    if not trunk.enabled:
        return MTLDecoder(config.model, specs, vocab_size=encoder.vocab_size, pad_id=encoder.pad_id)
    from mtl_decoder.model.pretrained.hub import base_from_config, load_base

    if saved_trunk is not None and trunk.mode == "upcycle" and expected_identity is not None:
        base, identity = base_from_config(saved_trunk, expected_identity, trunk.dtype)
    else:
        if saved_trunk is not None and any(saved_trunk.glob("*.safetensors")):
            trunk = dataclasses.replace(trunk, pretrained=str(saved_trunk), revision=None)
        base, identity = load_base(trunk)
    if expected_identity is not None and expected_identity.get("sha256") != identity.sha256:
        raise UserError(
            f"model.trunk.pretrained '{trunk.pretrained}' is not the trunk this model was trained on (weights hash "
            f"{identity.sha256[:12]}..., expected {str(expected_identity.get('sha256'))[:12]}... from "
            f"{expected_identity.get('source')})"
        )
    if trunk.mode == "frozen" and trunk.mixes_layers:
        from mtl_decoder.model.pretrained.layermix import LayerMixDecoder, layered_cache

        blocks = list(trunk.read_layers)
        cache = layered_cache(base, identity, blocks, trunk.dtype, trunk.cache_dir)
        return LayerMixDecoder(config.model, specs, base, identity, cache, blocks)
    if trunk.mode == "hybrid":
        from mtl_decoder.model.pretrained.hybrid import HybridDecoder

        return HybridDecoder(config.model, specs, base, identity)
    if trunk.mode == "frozen":
        from mtl_decoder.model.pretrained.frozen import FrozenDecoder, cache_for

        cache = cache_for(identity, trunk.dtype, trunk.cache_dir, base.config)
        return FrozenDecoder(config.model, specs, base, identity, cache)
    from mtl_decoder.model.pretrained.finetuned import PretrainedDecoder

    return PretrainedDecoder(config.model, specs, base, identity)
