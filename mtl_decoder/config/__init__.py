"""Experiment configuration: typed dataclasses (``schema``) loaded from YAML with dotted overrides (``loading``).

config = load_config("configs/demo.yaml", ["model.d_model=64", "tasks.ner.data.train=my.jsonl"])
"""

from mtl_decoder.config.loading import (
    apply_override,
    build,
    config_from_dict,
    load_config,
    load_task,
    load_task_file,
    parse_override,
)
from mtl_decoder.config.schema import (
    CLASSIFICATION,
    SPLITS,
    TAGGING,
    TASK_KINDS,
    BalancingConfig,
    ColumnsConfig,
    DataConfig,
    EvaluationConfig,
    ExperimentConfig,
    ModelConfig,
    TaskConfig,
    TaskDataConfig,
    TokenizerConfig,
    TrainingConfig,
)

__all__ = [
    "CLASSIFICATION",
    "SPLITS",
    "TAGGING",
    "TASK_KINDS",
    "BalancingConfig",
    "ColumnsConfig",
    "DataConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "ModelConfig",
    "TaskConfig",
    "TaskDataConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "apply_override",
    "build",
    "config_from_dict",
    "load_config",
    "load_task",
    "load_task_file",
    "parse_override",
]
