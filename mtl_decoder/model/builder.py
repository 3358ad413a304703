"""From a config to a model: the one place that decides which trunk and heads an experiment gets."""

from __future__ import annotations

from mtl_decoder.config import ExperimentConfig
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model.decoder import MTLDecoder
from mtl_decoder.model.heads import TaskHeadSpec


def head_specs(config: ExperimentConfig, label_sets: dict[str, list[str]]) -> list[TaskHeadSpec]:
    return [TaskHeadSpec(name, task.kind, tuple(label_sets[name])) for name, task in config.tasks.items()]


def build_model(config: ExperimentConfig, label_sets: dict[str, list[str]], encoder: TextEncoder) -> MTLDecoder:
    """A freshly initialised model for ``config``'s tasks with these label sets and this tokenizer."""
    return MTLDecoder(
        config.model, head_specs(config, label_sets), vocab_size=encoder.vocab_size, pad_id=encoder.pad_id
    )
