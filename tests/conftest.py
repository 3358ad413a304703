"""Shared fixtures: tiny configs over tests/fixtures and one tiny trained run reused by the slow tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mtl_decoder.config import ExperimentConfig, load_config

FIXTURES = Path(__file__).parent / "fixtures"


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


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread():
    """Tiny models gain nothing from two threads, and on a busy 2-core machine two threads per process wait on
    each other; one thread also makes floating-point results independent of load."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny model trained once for the whole session: RUN/ with best/, checkpoints/, metrics.jsonl."""
    from mtl_decoder.training import train

    run_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    train(tiny_config(run_dir))
    return run_dir


@pytest.fixture
def make_config():
    """The ``tiny_config`` function, for tests that build their own runs: make_config(dir, ["k=v", ...])."""
    return tiny_config


ONNX_RUN = [
    "model.tagging_decoder=crf",
    "model.char_embedding=8",
    "model.word_features=true",
    "model.word_hash_buckets=64",
]
"""The tiny run exported to ONNX: the CRF decoder and every word feature, so the graph has every input."""


@pytest.fixture(scope="session")
def onnx_export(tmp_path_factory) -> tuple[Path, Path, str]:
    """A tiny native run (``ONNX_RUN``) and its ``export --format onnx`` through the CLI: (RUN/best, the exported
    folder, what the export printed). Skipped where the optional onnx packages are not installed."""
    import contextlib
    import io

    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from mtl_decoder.cli import main
    from mtl_decoder.training import train

    run_dir = tmp_path_factory.mktemp("onnx_run") / "run"
    train(tiny_config(run_dir, ONNX_RUN))
    exported = run_dir.parent / "exported"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["export", "--format", "onnx", "--model", str(run_dir / "best"), "--output", str(exported)])
    assert code == 0, printed.getvalue()
    return run_dir / "best", exported, printed.getvalue()
