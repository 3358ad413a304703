"""Helpers the tests share: the tiny fixtures' task list, a seconds-to-train config over them, and the tiny run's
variants. Test files import them from here (``pythonpath`` in pyproject.toml puts tests/ on the path); conftest.py
holds only fixtures."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtl_decoder.config import ExperimentConfig, load_config

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"

TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
needs_torchrun = pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun not installed")


def torchrun(processes: int = 2) -> list[str]:
    """The launch of ``processes`` local workers. ``--standalone`` lets the rendezvous take a free port: the fixed
    default (29500) would make two launches at once (pytest-xdist's workers) refuse each other."""
    return [TORCHRUN, "--standalone", "--nproc_per_node", str(processes)]


def torchrun_cli(*args: str, processes: int = 2) -> subprocess.CompletedProcess:
    """``torchrun ... -m mtl_decoder ARGS`` from this checkout, one thread a process, its output captured."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [*torchrun(processes), "-m", "mtl_decoder", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def tiny_tasks() -> list[dict[str, Any]]:
    return [
        {
            "name": "ner",
            "kind": "token_tagging",
            "data": {split: str(FIXTURES / f"ner_{split}.jsonl") for split in ("train", "validation", "test")},
        },
        {
            "name": "sentiment",
            "kind": "sentence_classification",
            "labels": ["negative", "positive"],
            "data": {split: str(FIXTURES / f"sentiment_{split}.jsonl") for split in ("train", "validation", "test")},
        },
    ]


TINY = {
    "model": {
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 2,
        "expert_hidden": 16,
        "n_shared_experts": 2,
        "n_task_experts": 1,
        "dropout": 0.0,
        "attention": "bidirectional",
    },
    "tokenizer": {"vocab_size": 400, "min_frequency": 1},
    "data": {"batch_size": 8, "eval_batch_size": 16, "max_length": 48},
    "training": {"epochs": 2, "lr": 3e-3, "log_every": 5, "progress": False, "keep_checkpoints": 2},
}


def tiny_config(
    output_dir: Path, overrides: list[str] = (), tasks: list[dict[str, Any]] | None = None
) -> ExperimentConfig:
    """A seconds-to-train config over the fixtures; ``overrides`` as on the command line."""
    base = copy.deepcopy(TINY)
    base["tasks"] = tasks or tiny_tasks()
    base["training"]["output_dir"] = str(output_dir)
    return load_config(None, list(overrides), base=base)


ONNX_RUN = [
    "model.tagging_decoder=crf",
    "model.char_embedding=8",
    "model.word_features=true",
    "model.word_hash_buckets=64",
]
"""The tiny run exported to ONNX: the CRF decoder and every word feature, so the graph has every input."""
