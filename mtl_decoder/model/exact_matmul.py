"""Float32 matrix products through oneDNN that reproduce torch's own (MKL's) bits, for CPU inference.

On a CPU torch multiplies float32 matrices with MKL; oneDNN's kernels (``torch.ops.mkldnn._linear_pointwise``) are
2-3x faster on this model's small products on some CPUs (an AMD EPYC: MKL takes its generic path there). Both
compute each output element as one chain of fused multiply-adds in the order of the inner index, but MKL cuts a
long inner dimension into blocks and adds the blocks' products, while oneDNN runs one chain: ``linear`` cuts the
inner dimension where MKL does and adds the blocks' products in MKL's order.

Where that reproduces torch is measured, not assumed: ``block_of(K, N)`` multiplies random matrices of that inner
and output width (several row counts, a batched product and a transposed weight, as the model's products have)
both ways, and returns the block width at which every product is bit-identical to torch's, or None, where torch's
own product then runs. ``active`` limits the fast path to CPU float32 inference (inference mode, no autocast, no
tracing); ``disabled()`` turns it off (the reference in tests and benchmarks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

_OP = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_BLOCKS = (128, 256, 64, 192, 384, 512)
"""Inner-dimension block widths a probe tries (after no block at all), most likely first."""
MIN_ROWS = 16
"""Products of fewer rows run in torch: MKL multiplies 1-3 rows another way (a matrix-vector path)."""
_PROBE_ROWS = (MIN_ROWS, 31, 100, 1000)
_plans: dict[tuple[int, int, int], int | None] = {}
_state = threading.local()


@contextmanager
def disabled() -> Iterator[None]:
    """Run torch's own products in this thread while inside (the reference the fast path must equal)."""
    before = getattr(_state, "off", False)
    _state.off = True
    try:
        yield
    finally:
        _state.off = before


def active(*tensors: torch.Tensor) -> bool:
    """Whether the fast path may run on these tensors.

    CPU float32 tensors, in inference mode, without autocast, tracing or compiling, where torch has oneDNN's
    linear operator and this thread has not ``disabled`` it."""
    if _OP is None or getattr(_state, "off", False) or not torch.is_inference_mode_enabled():
        return False
    if torch.is_autocast_enabled("cpu") or torch.jit.is_tracing() or torch.compiler.is_compiling():
        return False
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def _onednn(x: torch.Tensor, weight: torch.Tensor, block: int) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T by oneDNN, the inner dimension cut into ``block``-wide pieces added in order."""
    K = x.shape[-1]
    if block >= K:
        return _OP(x, weight, None, "none", [None], "")
    return linear_pieces([x[..., k : k + block].contiguous() for k in range(0, K, block)], weight)


def linear_pieces(pieces: list[torch.Tensor], weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The sum of each piece's product by oneDNN, the pieces' products added in order, into ``out`` if given.

    ``pieces``: contiguous (..., k_i) column blocks of the input in order (oneDNN gives other bits on a strided
    input), widths ``block_of`` says; weight (N, K). ``linear``'s arithmetic where the caller holds the input
    already cut (no copies); no checks: call it where ``active`` and ``block_of`` allow."""
    k, total = 0, None
    for i, x_k in enumerate(pieces):
        width = x_k.shape[-1]
        product = _OP(x_k, weight[:, k : k + width].contiguous(), None, "none", [None], "")
        k += width
        if total is None:
            total = product
        elif i < len(pieces) - 1 or out is None:
            total += product
        else:
            return torch.add(total, product, out=out)
    return total if out is None else out.copy_(total)


def _matches(K: int, N: int, block: int, generator: torch.Generator) -> bool:
    """Whether oneDNN in ``block``-wide pieces gives torch's bits for random products of inner width K, output N."""
    for M in _PROBE_ROWS:
        x = torch.randn(2, M, K, generator=generator)
        weight = torch.randn(N, K, generator=generator)
        ours = _onednn(x, weight, block)
        if not torch.equal(ours, F.linear(x, weight)):  # a Linear module's product (B transposed)
            return False
        if not torch.equal(ours, torch.bmm(x, weight.t().repeat(2, 1, 1))):  # a batched product
            return False
    return True


def block_of(K: int, N: int) -> int | None:
    """The inner block width at which oneDNN reproduces torch's float32 products of inner width K, output width N.

    K itself (no cut) where one chain matches, else the first of ``_BLOCKS`` below K, or of K cut into 2 to 8
    equal parts, that does, else None (the fast path does not run for this shape). Measured once per (K, N, torch
    threads) in a process."""
    key = (K, N, torch.get_num_threads())
    if key not in _plans:
        generator = torch.Generator().manual_seed(K * 100_003 + N)
        with torch.inference_mode():
            halves = (-(-K // n) for n in range(2, 9))  # MKL cuts some widths into equal parts (200: 2 x 100)
            candidates = list(dict.fromkeys([K, *(b for b in _BLOCKS if b < K), *halves]))
            _plans[key] = next((b for b in candidates if _matches(K, N, b, generator)), None)
    return _plans[key]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T, bit-identical to ``F.linear(x, weight)``: by oneDNN where ``active`` and
    ``block_of`` allow (and the product has ``MIN_ROWS`` rows or more), else by torch."""
    if active(x, weight) and x.numel() >= MIN_ROWS * x.shape[-1]:
        block = block_of(x.shape[-1], weight.shape[0])
        if block is not None:
            return _onednn(x, weight, block)
    return F.linear(x, weight)


def module_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for a Linear module: through ``linear`` where it is a plain bias-free nn.Linear with no hooks.

    Anything else (a quantised module, one with a bias, a hooked one, or any hook on every module) is called as
    it is."""
    plain = type(module) is nn.Linear and module.bias is None
    hooked = module._forward_hooks or module._forward_pre_hooks
    global_hooks = nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    if not plain or hooked or global_hooks:
        return module(x)
    return linear(x, module.weight)
