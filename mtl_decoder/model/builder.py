"""From a config to a model: the one place that decides which trunk and heads an experiment gets.

The trunk is picked once by name from the registry (model/trunks: native, frozen, layer_mix, hybrid, upcycle,
lora, and any registered beside them); it assembles the model (trunk + PLE layers + heads) and stays bound to it
as ``model.trunk_kind``, which answers what training, saving, loading, export and inference ask of the trunk.
"""

from __future__ import annotations

from pathlib import Path

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model.heads import MultiTaskModel, TaskHeadSpec
from mtl_decoder.model.trunks import trunk_for


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
    trunk = trunk_for(config.model)
    return trunk.assemble(head_specs(config, label_sets), encoder, saved_trunk, expected_identity)
