"""Every shipped YAML (configs/**, tasks/**) loads and validates. Loading never opens data files, so configs
that point at ../../shared/data validate on a machine without that data."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtl_decoder.config import TASK_KINDS, ExperimentConfig, load_config, load_task

REPO = Path(__file__).resolve().parents[2]
YAMLS = sorted(
    p
    for folder in ("configs", "tasks", "benchmarks/gpu_offline")
    for pattern in ("*.yaml", "*.yml")
    for p in (REPO / folder).rglob(pattern)
)


def test_there_are_shipped_yamls():
    names = {p.relative_to(REPO).as_posix() for p in YAMLS}
    assert {"configs/demo.yaml", "tasks/ner.yaml", "tasks/sentiment.yaml"} <= names


@pytest.mark.parametrize("path", YAMLS, ids=[p.relative_to(REPO).as_posix() for p in YAMLS])
def test_shipped_yaml_loads_and_validates(path):
    if path.relative_to(REPO).parts[0] == "tasks":
        task = load_task(path)
        assert task.kind in TASK_KINDS
        assert task.data.train is not None or task.data.hub_id is not None
        if task.data.hub_id is None:
            for split in ("train", "validation", "test"):
                value = getattr(task.data, split)
                assert value is None or Path(value).is_absolute()
        return
    cfg = load_config(path)
    assert isinstance(cfg, ExperimentConfig) and cfg.tasks
    for name, task in cfg.tasks.items():
        assert task.name == name
        assert task.data.train is not None or task.data.hub_id is not None
