"""Shared fixtures: one tiny trained run reused by the slow tests, its ONNX export, and make_config (helpers.py holds
the functions and data the tests share). Session fixtures are built once per pytest-xdist worker (pyproject's addopts
run two), module fixtures once: a file runs whole on one worker (--dist loadfile)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ONNX_RUN, tiny_config


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


@pytest.fixture(scope="session")
def best(tiny_run: Path) -> Path:
    """The tiny run's model folder, RUN/best."""
    return tiny_run / "best"


@pytest.fixture
def make_config():
    """The ``tiny_config`` function, for tests that build their own runs: make_config(dir, ["k=v", ...])."""
    return tiny_config


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
