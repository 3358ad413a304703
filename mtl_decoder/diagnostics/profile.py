"""Where one forward pass spends its time.

torch.profiler over a forward whose modules are labelled by module
hooks (``record_function`` ranges), so the breakdown follows the model's pieces whatever its trunk.

Categories (inclusive times of the labelled modules): attention (``SelfAttention``), experts (each
``ExpertGroup``, or the ``SwiGLU`` of the mlp variant), gates (``Gate``), expert mixing (the rest of an
``ExpertBlock``: slicing routes and weighting experts), norms, embedding (token embedding and word features),
heads (the task heads' linear layers; a CRF's decoding is not part of the forward), and other (the rest of the
forward: route layout, masks, copies between routes). Python overhead is the time inside the forward that no
operator accounts for: the labelled ranges' self time, i.e. Python and dispatch between kernels (the profiler's
own hooks add to it, so it is an upper bound). Times are CPU-side; on a GPU, kernels run asynchronously and the
wall time of the forward (measured apart, with synchronisation) is the one to trust.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from mtl_decoder.diagnostics.probes import is_norm
from mtl_decoder.model import ExpertBlock, ExpertGroup, Gate
from mtl_decoder.model.layers import SelfAttention, SwiGLU

PREFIX = "diagnose::"
TOP = "forward"
TYPES: tuple[tuple[type, str], ...] = (
    (SelfAttention, "attention"),
    (ExpertBlock, "expert_block"),
    (ExpertGroup, "experts"),
    (SwiGLU, "experts"),
    (Gate, "gates"),
    (nn.Embedding, "embedding"),
)


def categories(model: nn.Module) -> dict[str, str]:
    """Module name -> category, outermost labelled module only (experts and gates nest in expert blocks)."""
    out: dict[str, str] = {}
    for name, module in model.named_modules():
        if not name:
            continue
        parent = next((out[p] for p in _ancestors(name) if p in out), None)
        if parent is not None and parent != "expert_block":
            continue
        category = next((c for t, c in TYPES if isinstance(module, t)), "norms" if is_norm(module) else None)
        if name.split(".")[0] in ("heads", "crfs") and parent is None:
            category = "heads" if name.count(".") == 1 else None
        elif name == "word_features":
            category = "embedding"
        if category is not None:
            out[name] = category
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


class _Labels:
    """Pre/post forward hooks that open and close a ``record_function`` range per labelled module."""

    def __init__(self, model: nn.Module):
        self.model, self.handles, self.open = model, [], {}

    def __enter__(self) -> _Labels:
        modules = dict(self.model.named_modules())
        for name, category in categories(self.model).items():
            module = modules[name]
            self.handles.append(module.register_forward_pre_hook(self._enter(name, category)))
            self.handles.append(module.register_forward_hook(self._exit(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()

    def _enter(self, name: str, category: str):
        def hook(module: nn.Module, args: tuple) -> None:
            scope = torch.profiler.record_function(PREFIX + category)
            scope.__enter__()
            self.open.setdefault(name, []).append(scope)

        return hook

    def _exit(self, name: str):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self.open[name].pop().__exit__(None, None, None)

        return hook


@contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Silence file descriptor 2 for the duration.

    File descriptor 2 pointed at /dev/null for the duration: torch's profiler (kineto) writes a
    'profiler_start'/'profiler_stop' line to it from C++ per session, which no logging setting turns off."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def wall_time_ms(model: nn.Module, batch: dict[str, Any], tasks: list[str], repeats: int = 5) -> float:
    """Median wall time of one forward (after one warm-up), synchronised on a GPU."""
    device = batch["input_ids"].device
    model(**batch, tasks=tasks)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        model(**batch, tasks=tasks)
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def profile_forward(model: nn.Module, batch: dict[str, Any], tasks: list[str], repeats: int = 3) -> dict[str, Any]:
    """Milliseconds per category of one forward pass.

    Milliseconds per category of one forward pass (the mean of ``repeats``; see the module docstring), and the
    forward's wall time without the profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    device = batch["input_ids"].device
    wall = wall_time_ms(model, batch, tasks)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _Labels(model), native_stderr_silenced():
        for _ in range(2):  # the first profiled forward pays one-off costs (seen: 10x on the gates): discarded
            with profile(activities=activities) as prof:
                for _ in range(repeats):
                    with record_function(PREFIX + TOP):
                        model(**batch, tasks=tasks)
                _sync(device)
    totals: dict[str, float] = {}
    python = 0.0
    for event in prof.key_averages():
        if event.key.startswith(PREFIX):
            totals[event.key[len(PREFIX) :]] = event.cpu_time_total / 1e3 / repeats
            python += event.self_cpu_time_total / 1e3 / repeats
    forward = totals.pop(TOP, 0.0)
    block = totals.pop("expert_block", 0.0)
    parts = {
        "attention": totals.get("attention", 0.0),
        "experts": totals.get("experts", 0.0),
        "gates": totals.get("gates", 0.0),
        "expert_mixing": max(0.0, block - _inside_blocks(model, totals)),
        "norms": totals.get("norms", 0.0),
        "embedding": totals.get("embedding", 0.0),
        "heads": totals.get("heads", 0.0),
    }
    parts["other"] = max(0.0, forward - sum(parts.values()))
    return {
        "forward_ms": forward,
        "wall_ms": wall,
        "breakdown_ms": parts,
        "python_overhead_ms": python,
        "python_overhead_share": python / forward if forward else 0.0,
        "profiled_on": str(device),
    }


def _inside_blocks(model: nn.Module, totals: dict[str, float]) -> float:
    """Experts and gates time spent inside expert blocks (all of it, unless the model is the mlp variant)."""
    has_blocks = any(isinstance(m, ExpertBlock) for m in model.modules())
    return totals.get("experts", 0.0) + totals.get("gates", 0.0) if has_blocks else 0.0
