"""W8A8 int8 for a pretrained trunk's blocks: SmoothQuant scales, then every Linear in int8.

SmoothQuant (Xiao et al., 2023): a Llama-style block's activations have outlier channels that per-tensor int8
cannot hold, its weights do not. Per input channel j of a Linear, ``s_j = max|X_j|^alpha / max|W_:,j|^(1-alpha)``
(max|X_j| calibrated on a few hundred texts) moves the range from the activation into the weight: the activation
is divided by s where it is made, the weight's column multiplied by it, so the float function is unchanged. Where
the division goes, per block:

    attn_in  (q/k/v's input)    into input_layernorm's weight
    mlp_in   (gate/up's input)  into post_attention_layernorm's weight
    down_in  (down_proj's input = act(gate) * up)  into up_proj's output rows
    o_in     (o_proj's input = the heads' values)  into v_proj's output rows, one scale per key-value head channel
             (query heads sharing a key-value head share its values, so they share the scale: the max over them)

Then every Linear of the blocks runs int8 (``Int8Linear``): weights per output channel, activations quantised as
each batch runs, per tensor (torch's fused dynamic kernel) or per token (``torch._int_mm``). down_proj reads the
SwiGLU product, whose outliers are per token (a few tokens carry values in the thousands at some blocks) rather
than per channel, so it is quantised per token and smoothed less (``down_alpha``). Measured on SmolLM2-135M's 16
blocks: benchmarks/smoothquant_probe.py and benchmarks/precision_agreement.py.

The scales are made once by ``mtl-decoder quantize`` (prediction/smoothquant_job.py) and stored in the model folder
(``SCALES_FILE``); ``--precision int8`` uses them when the folder has them (inference/quantize.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from mtl_decoder.errors import UserError

SCALES_FILE = "smoothquant.safetensors"
"""In a model folder: the smoothing scales of its trunk's cached blocks, and (metadata) how they were made."""
GROUPS = ("attn_in", "o_in", "mlp_in", "down_in")
"""The smoothing scales of one block (see the module doc)."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class SmoothQuantSettings:
    """How the scales are made and the Linears quantised."""

    alpha: float = 0.8
    """Migration strength of q/k/v, o_proj and gate/up: 0 keeps the activation's range, 1 moves it all."""
    down_alpha: float = 0.5
    """Migration strength of down_proj (its outliers are per token, which smoothing cannot move)."""
    down_per_token: bool = True
    """Quantise down_proj's input per token (else per tensor, like the others)."""
    all_per_token: bool = True
    """Quantise every Linear's input per token (else only down_proj's, per ``down_per_token``): closer to float32,
    a little slower (the scales are computed in Python ops rather than inside torch's fused per-tensor kernel). The
    default since two models measured it (docs/pretrained.md): on the 16-block model and on the hybrid it met every
    bar of agreement on test, where per tensor missed on the hybrid, for 5% and 23% less speed than per tensor.
    Folders quantized before keep the setting stored with their scales."""

    def __post_init__(self):
        for name in ("alpha", "down_alpha"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise UserError(f"smoothquant {name}: must be in [0, 1], got {value}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SmoothQuantSettings:
        return cls(**json.loads(text))


# ------------------------------------------------------------------------------------------------ the blocks


def blocks_of(base: nn.Module) -> list[nn.Module]:
    """The Llama-style blocks of a transformers base model; a UserError naming what is missing otherwise."""
    layers = getattr(base, "layers", None)
    if layers is None or len(layers) == 0:
        raise UserError("int8 (W8A8): the trunk has no .layers of transformer blocks")
    for i, block in enumerate(layers):
        attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
        missing = [n for n in PROJECTIONS[:4] if not isinstance(getattr(attn, n, None), nn.Linear)]
        missing += [n for n in PROJECTIONS[4:] if not isinstance(getattr(mlp, n, None), nn.Linear)]
        missing += [n for n in ("input_layernorm", "post_attention_layernorm") if not hasattr(block, n)]
        if missing:
            raise UserError(
                f"int8 (W8A8): block {i} of the trunk is not Llama-style (no {', '.join(missing)}); SmoothQuant "
                "supports Llama, Mistral and Qwen2-style blocks"
            )
    return list(layers)


def kv_layout(base: nn.Module) -> tuple[int, int, int]:
    """(key-value heads, query heads per key-value head, head width)."""
    config = base.config
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    width = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv, heads // kv, width


# ------------------------------------------------------------------------------------------------ calibration


def range_recorder(amax: dict[str, torch.Tensor], real: dict[str, torch.Tensor]) -> Callable[[str], Callable]:
    """``record(key)``: a forward pre-hook folding max|x_j| of its module's input over the real tokens into
    ``amax[key]``: a (B, T, K) input masked by ``real["mask"]`` (B, T), a packed (M, K) one taken whole."""

    def record(key: str) -> Callable:
        def hook(_module, inputs):
            x = inputs[0].detach().float().abs()
            x = x[real["mask"]] if x.dim() == 3 else x.reshape(-1, x.shape[-1])  # (tokens, K)
            if len(x):
                top = x.amax(0)
                amax[key] = torch.maximum(amax[key], top) if key in amax else top

        return hook

    return record


@torch.no_grad()
def calibrate(base: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """max|x_j| of every smoothed input over the real (unpadded) tokens of ``batches`` of (ids, mask) (B, T).

    Keys ``'{block}.{group}'`` (GROUPS); the trunk runs in float32 as it is."""
    blocks = blocks_of(base)
    amax: dict[str, torch.Tensor] = {}
    real: dict[str, torch.Tensor] = {}
    record = range_recorder(amax, real)
    hooks = []
    for i, block in enumerate(blocks):
        for group, linear in (("attn_in", block.self_attn.q_proj), ("o_in", block.self_attn.o_proj),
                              ("mlp_in", block.mlp.gate_proj), ("down_in", block.mlp.down_proj)):  # fmt: skip
            hooks.append(linear.register_forward_pre_hook(record(f"{i}.{group}")))
    was_training = base.training
    base.eval()
    try:
        for ids, mask in batches:
            real["mask"] = mask.bool()
            base(input_ids=ids, attention_mask=mask.long(), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
        base.train(was_training)
    if not amax:
        raise UserError("int8 (W8A8): no calibration text")
    return amax


def channel_scale(amax_x: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """s_j = max|X_j|^alpha / max|W_:,j|^(1-alpha), over the weights that read input channel j."""
    w = torch.stack([w.detach().float().abs().amax(0) for w in weights]).amax(0)  # (K,)
    s = amax_x.clamp(min=1e-5) ** alpha / w.clamp(min=1e-5) ** (1 - alpha)
    return s.clamp(min=1e-5)


def attention_scales(
    attn: nn.Module, amax_in: torch.Tensor, amax_o: torch.Tensor, alpha: float, layout: tuple[int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's attn_in scales (q/k/v's input) and o_in scales, one per key-value head channel (kv * d,)."""
    kv, group, width = layout
    attn_in = channel_scale(amax_in, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], alpha)
    per_query = channel_scale(amax_o, [attn.o_proj.weight], alpha)  # (heads * d,)
    return attn_in, per_query.view(kv, group, width).amax(1).reshape(-1)  # (kv * d,)


def smoothing_scales(
    base: nn.Module, amax: dict[str, torch.Tensor], settings: SmoothQuantSettings
) -> dict[str, torch.Tensor]:
    """The scales of every block (keys as ``calibrate``'s); o_in has one per key-value head channel (kv * d,)."""
    layout = kv_layout(base)
    scales = {}
    for i, block in enumerate(blocks_of(base)):
        attn, mlp = block.self_attn, block.mlp
        a = settings.alpha
        scales[f"{i}.attn_in"], scales[f"{i}.o_in"] = attention_scales(
            attn, amax[f"{i}.attn_in"], amax[f"{i}.o_in"], a, layout
        )
        scales[f"{i}.mlp_in"] = channel_scale(amax[f"{i}.mlp_in"], [mlp.gate_proj.weight, mlp.up_proj.weight], a)
        scales[f"{i}.down_in"] = channel_scale(amax[f"{i}.down_in"], [mlp.down_proj.weight], settings.down_alpha)
    return scales


# ------------------------------------------------------------------------------------------------ folding


@torch.no_grad()
def fold_attention(block: nn.Module, attn_in: torch.Tensor, o_in: torch.Tensor, layout: tuple[int, int, int]) -> None:
    """Fold a block's attn_in scales into input_layernorm and q/k/v, its o_in scales into v's rows and o's columns."""
    kv, group, width = layout
    attn = block.self_attn
    block.input_layernorm.weight.div_(attn_in)
    for linear in (attn.q_proj, attn.k_proj, attn.v_proj):
        linear.weight.mul_(attn_in)
    attn.v_proj.weight.div_(o_in[:, None])  # (kv * d,): v's rows, then o's columns for every query head of the group
    if attn.v_proj.bias is not None:
        attn.v_proj.bias.div_(o_in)
    attn.o_proj.weight.mul_(o_in.view(kv, 1, width).expand(kv, group, width).reshape(-1))


@torch.no_grad()
def fold_down(mlp: nn.Module, s: torch.Tensor) -> None:
    """Fold down_proj's input scales: act(gate) * up, so scaling up's output rows scales the product."""
    mlp.up_proj.weight.div_(s[:, None])
    if mlp.up_proj.bias is not None:
        mlp.up_proj.bias.div_(s)
    mlp.down_proj.weight.mul_(s)


@torch.no_grad()
def fold_scales(base: nn.Module, scales: dict[str, torch.Tensor]) -> None:
    """Divide each activation by its scale where it is made and multiply the reading columns by it (in place)."""
    layout = kv_layout(base)
    for i, block in enumerate(blocks_of(base)):
        fold_attention(block, scales[f"{i}.attn_in"], scales[f"{i}.o_in"], layout)
        s = scales[f"{i}.mlp_in"]
        block.post_attention_layernorm.weight.div_(s)
        for linear in (block.mlp.gate_proj, block.mlp.up_proj):
            linear.weight.mul_(s)
        fold_down(block.mlp, scales[f"{i}.down_in"])


# ------------------------------------------------------------------------------------------------ int8 Linear


@functools.cache
def full_range_is_exact() -> bool:
    """Whether this CPU's dynamic int8 kernel sums 8-bit activations without saturating.

    torch's fused dynamic product multiplies uint8 activations by int8 weights. With VNNI (AVX-512 VNNI) the
    products go straight into int32 sums; without it (AVX2, AVX-512 without VNNI) each pair of products is first
    added into an int16 (vpmaddubsw), which saturates once both operands use their full range (255 x 127 x 2 >
    32,767): torch's own dynamic Linear always passes ``reduce_range`` (7-bit activations) for that reason, at some
    precision. Probed once per process on the product that saturates such a kernel: every activation 1.0 (uint8
    255) against a weight of ones (int8 127), whose exact result is the row's length."""
    k = 64
    weight = torch.ones(1, k)
    zero = torch.zeros(1, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated for torchao (not a dependency)
        qw = torch.quantize_per_channel(weight, torch.full((1,), 1 / 127, dtype=torch.double), zero, 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, None)
    got = torch.ops.quantized.linear_dynamic(torch.ones(1, k), packed, False)
    return abs(float(got) - k) < 1e-3 * k


@functools.cache
def int8_products_are_fast() -> bool:
    """Whether ``torch._int_mm`` multiplies int8 matrices on this CPU at a useful rate (at most 4x float32's time).

    With VNNI or AMX, oneDNN's int8 kernels run several times float32's rate; without them (AVX2 alone) torch's
    int8 x int8 product took about 50x float32's time on SmolLM2's projections (benchmarks/int8_kernels.py).
    Timed once per process, best of three each, on a 64 x 512 x 512 product of each kind."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (64, 512), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (512, 512), generator=g, dtype=torch.int8)
    a_float, b_float = a.float(), b.float()

    def best(run: Callable[[], torch.Tensor]) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return min(times)

    try:
        return best(lambda: torch._int_mm(a, b)) <= 4 * best(lambda: a_float @ b_float)
    except RuntimeError:  # a torch build without a CPU int8 x int8 product: the float32 way
        return False


def integer_products(q: torch.Tensor, w: torch.Tensor, fast: bool | None = None) -> torch.Tensor:
    """q (M, K) @ w (K, N), both int8: their integer sums, as float32.

    By ``torch._int_mm`` (int32 sums) where that is fast (``fast`` None: ``int8_products_are_fast``), else as a
    float32 product of the same integers: exact while every partial sum stays under 2**24 (K x 127 x 127 reaches it
    only past K = 1,040 with every value at the extremes; beyond, float32's rounding, 6e-8 relative), at float32's
    speed. The answers are the same either way; only the time differs."""
    if fast if fast is not None else int8_products_are_fast():
        return torch._int_mm(q, w).float()
    return q.float() @ w.float()


def per_token_product(x: torch.Tensor, w_int8: torch.Tensor, w_scale: torch.Tensor, fast: bool | None = None):
    """x (M, K) float32 quantised to int8 with a symmetric scale per row, times w_int8 (K, N) with one scale per
    output column: the integer sums (``integer_products``, ``fast`` as there) rescaled by both scales, (M, N)."""
    s = x.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127  # (M, 1)
    q = torch.round(x / s).to(torch.int8)
    return integer_products(q, w_int8, fast) * s * w_scale


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (one scale per output channel) and x quantised to int8 as it comes.

    Per tensor: torch's fused dynamic kernel (the activation's scale and zero point from its range), 8 bits where
    this CPU's kernel sums them exactly, else 7 (``full_range_is_exact``). Per token: a symmetric scale per row,
    the int8 x int8 sums (``integer_products``) rescaled by both scales."""

    def __init__(self, linear: nn.Linear, per_token: bool):
        super().__init__()
        w = linear.weight.detach().float()  # (N, K)
        scale = w.abs().amax(1).clamp(min=1e-8) / 127  # (N,)
        self.in_features, self.out_features, self.per_token = linear.in_features, linear.out_features, per_token
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.register_buffer("bias", bias)
        if per_token:
            self.register_buffer("w_int8", torch.round(w / scale[:, None]).to(torch.int8).t().contiguous())  # (K, N)
            self.register_buffer("w_scale", scale)
        else:
            zero = torch.zeros_like(scale, dtype=torch.long)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # quantized tensors are deprecated for torchao (not a dependency)
                qw = torch.quantize_per_channel(w, scale.double(), zero, 0, torch.qint8)
                self.packed = torch.ops.quantized.linear_prepack(qw, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.per_token:
            reduce_range = not full_range_is_exact()
            return torch.ops.quantized.linear_dynamic(x.float().contiguous(), self.packed, reduce_range)
        shape = x.shape
        y = per_token_product(x.float().reshape(-1, shape[-1]), self.w_int8, self.w_scale)  # (M, N)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, per_token={self.per_token}"


def quantize_blocks(base: nn.Module, scales: dict[str, torch.Tensor], settings: SmoothQuantSettings) -> list[str]:
    """Fold ``scales`` into ``base`` and put every Linear of its blocks in int8 (in place); the names replaced."""
    blocks = blocks_of(base)
    missing = [f"{i}.{g}" for i in range(len(blocks)) for g in GROUPS if f"{i}.{g}" not in scales]
    if missing:
        raise UserError(f"int8 (W8A8): the stored scales do not cover the trunk's blocks (no {missing[0]})")
    fold_scales(base, scales)
    done = []
    for i, block in enumerate(blocks):
        for owner, names in ((block.self_attn, PROJECTIONS[:4]), (block.mlp, PROJECTIONS[4:])):
            for name in names:
                per_token = settings.all_per_token or (settings.down_per_token and name == "down_proj")
                setattr(owner, name, Int8Linear(getattr(owner, name), per_token))
                done.append(f"layers.{i}.{'self_attn' if owner is block.self_attn else 'mlp'}.{name}")
    return done


# ------------------------------------------------------------------------------------------------ the stored file


def scales_digest(scales: dict[str, torch.Tensor], settings: SmoothQuantSettings) -> str:
    """A short hash of the scales and settings: part of the state cache's key for states computed with them."""
    h = hashlib.sha256(settings.to_json().encode())
    for key in sorted(scales):
        h.update(key.encode())
        h.update(scales[key].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def save_scales(path: Path, scales: dict[str, torch.Tensor], settings: SmoothQuantSettings, record: dict) -> None:
    """Write the scales (float32) with the settings and ``record`` (how they were made) as metadata, atomically."""
    from mtl_decoder.files import atomic_write_safetensors

    tensors = {key: value.detach().float().contiguous() for key, value in scales.items()}
    metadata = {"settings": settings.to_json(), "record": json.dumps(record, sort_keys=True)}
    atomic_write_safetensors(path, tensors, metadata=metadata)


def load_scales(path: Path) -> tuple[dict[str, torch.Tensor], SmoothQuantSettings, dict]:
    """The scales, settings and record a model folder holds (safetensors: nothing is unpickled)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            scales = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
        settings = SmoothQuantSettings.from_json(metadata["settings"])
        record = json.loads(metadata.get("record", "{}"))
    except (OSError, KeyError, ValueError, TypeError, SafetensorError) as e:
        problem = f"{path}: not a readable smoothing-scales file ({e})"
        raise UserError(f"{problem}; make it again with mtl-decoder quantize") from None
    bad = next((k for k, v in scales.items() if not torch.isfinite(v).all() or (v <= 0).any()), None)
    if bad is not None:
        raise UserError(f"{path}: scale '{bad}' is not finite and positive; make it again with mtl-decoder quantize")
    return scales, settings, record
