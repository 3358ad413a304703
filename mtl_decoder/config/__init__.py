"""Experiment configuration: typed sections loaded from YAML.

Experiment configuration: typed dataclasses (``schema``; the model section in ``model``, a task's in ``task``)
loaded from YAML with dotted overrides (``loading``); task kinds and metric names (``kinds``) and the expert-block
variants (``variants``) are written once here.

config = load_config("configs/demo.yaml", ["model.d_model=64", "tasks.ner.data.train=my.jsonl"])
"""

from mtl_decoder.config.kinds import (
    CLASSIFICATION,
    CLASSIFICATION_METRICS,
    METRICS,
    SPLITS,
    TAGGING,
    TAGGING_METRICS,
    TASK_KINDS,
)
from mtl_decoder.config.lexicon import LexiconConfig
from mtl_decoder.config.loading import (
    apply_override,
    build,
    config_from_dict,
    load_config,
    load_task,
    load_task_file,
    parse_override,
    parse_task_names,
)
from mtl_decoder.config.model import ModelConfig
from mtl_decoder.config.schema import (
    BalancingConfig,
    DataConfig,
    DistillConfig,
    EvaluationConfig,
    ExperimentConfig,
    TokenizerConfig,
    TrainingConfig,
)
from mtl_decoder.config.task import ColumnsConfig, TaskConfig, TaskDataConfig
from mtl_decoder.config.trunk import TrunkConfig
from mtl_decoder.config.variants import SHARED, VARIANTS, Variant

__all__ = [
    "CLASSIFICATION",
    "CLASSIFICATION_METRICS",
    "METRICS",
    "SHARED",
    "SPLITS",
    "TAGGING",
    "TAGGING_METRICS",
    "TASK_KINDS",
    "VARIANTS",
    "BalancingConfig",
    "ColumnsConfig",
    "DataConfig",
    "DistillConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "LexiconConfig",
    "ModelConfig",
    "TaskConfig",
    "TaskDataConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "TrunkConfig",
    "Variant",
    "apply_override",
    "build",
    "config_from_dict",
    "load_config",
    "load_task",
    "load_task_file",
    "parse_override",
    "parse_task_names",
]
