"""``--precision int8``: dynamic int8 quantisation of a model's Linear modules (W8A8 where the folder has scales).

``--precision int8``: dynamic int8 quantisation of a model's Linear modules (torch.ao.quantization.quantize_dynamic),
in place: int8 weights with one scale per output channel, activations quantised per tensor as each batch runs.

Which modules. Per-tensor int8 activations do not survive a Llama-style trunk's outlier channels everywhere.
Measured on SmolLM2-135M's block-16 states (288 CoNLL-2003 + SST-2 test sentences, 1 thread, a CPU with
AVX-512 VNNI; median per-token relative error of the states against fp32, speed against fp32): every projection
0.47 at 1.82x; ``down_proj`` alone (it reads the SwiGLU product) 0.44 at 1.27x; q/k/v 0.12 at 1.22x; o_proj 0.04
at 1.11x; ``gate_proj`` + ``up_proj`` 0.077 at 1.50x; those two and o_proj 0.087 at 1.51x; all but down_proj 0.15
at 1.76x. On linear probes trained on fp32 block-16 states (SST-2 mean-pooled, 800 train / 400 test sentences;
CoNLL-2003 last sub-word per word, 400 / 200) and applied to int8 states: gate+up keeps 98.8% of SST-2 labels
(accuracy 0.815 vs 0.823) and 99.1% of CoNLL tags (F1 0.646 vs 0.642); all but down_proj only 89.5% and 98.0%
(F1 0.627). So only the MLP's input projections are quantised (TRUNK_INT8): most of the gain at the least error.
In the native layers, the attention projections and the SwiGLU expert groups are quantised (``Int8ExpertGroup``: one
PLE layer's expert products at a fast student's sizes ran 1.40x float32's speed even on a CPU without VNNI,
benchmarks/results/expert_int8.json); the gates (their weights read directly, softmax in float32), the input
projection of a frozen trunk's states and the task heads stay float32: a small share of the work, and what the
outputs hang on.

A frozen trunk's states under int8 are cached apart from the float32 ones (``FrozenStates.set_compute``). Where
the model folder holds SmoothQuant scales (``mtl-decoder quantize``, inference/smoothquant.py), every Linear of the
cached trunk blocks runs int8 instead (W8A8), its states cached under their own tag, and so do a hybrid model's
trained top blocks, attention and experts, where the scales cover them (inference/smoothquant_top.py). Modes
``upcycle`` and ``lora`` are not supported (their experts are grouped matrix products and peft wrappers that
``quantize_dynamic`` does not reach). Agreement with fp32 on real tasks: ``benchmarks/precision_agreement.py``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mtl_decoder.errors import UserError

if TYPE_CHECKING:
    from mtl_decoder.saved import SavedModel

TRUNK_INT8 = ("gate_proj", "up_proj")
"""Trunk Linear modules (by their last name) quantised; the others stay float32 (see the module doc)."""

INT8_FLAG = "int8_quantised"
"""Attribute set on a model quantised in place: it cannot go back to fp32 or bf16."""


SMOOTHING = "int8_smoothing"
"""Attribute of a model whose folder holds SmoothQuant scales (``use_smoothing``): its int8 is then W8A8."""


def use_smoothing(model: nn.Module, scales: dict[str, torch.Tensor], settings: Any) -> None:
    """Make int8 of ``model`` W8A8: every Linear of its cached trunk blocks, smoothed by ``scales`` (smoothquant.py)."""
    model.__dict__[SMOOTHING] = (scales, settings)  # not a module attribute: outside the state dict


def use_folder_smoothing(saved: SavedModel) -> None:
    """int8 of a folder with SmoothQuant scales (``mtl-decoder quantize``) is W8A8 with them, unless given others."""
    from mtl_decoder.inference.smoothquant import SCALES_FILE, load_scales

    path = Path(saved.directory) / SCALES_FILE
    if SMOOTHING in saved.model.__dict__ or not path.is_file() or saved.model.trunk_kind.cached_states() is None:
        return
    scales, settings, record = load_scales(path)
    use_smoothing(saved.model, scales, settings)
    saved.model.__dict__[REFINE_MARGIN] = float(record.get("refine_margin", 0.0))


REFINE_MARGIN = "int8_refine_margin"
"""Attribute of a model whose folder's W8A8 check chose a margin (inference/refine.py): its close texts are predicted
again in float32."""


def refine_margin(model: nn.Module) -> float:
    """The margin within which ``model``'s int8 classifications are confirmed in float32 (0: none)."""
    return float(model.__dict__.get(REFINE_MARGIN, 0.0))


def is_int8(model: nn.Module) -> bool:
    return bool(getattr(model, INT8_FLAG, False))


def quantize_int8(model: nn.Module) -> list[str]:
    """Quantise ``model`` in place (see the module doc); the names of the modules quantised (none the second time)."""
    if is_int8(model):
        return []
    trunk = model.trunk_kind
    if not trunk.supports("int8"):
        raise UserError("precision int8: supported for native models and frozen trunks, not modes upcycle and lora")
    done: list[str] = []
    states = trunk.cached_states()
    if states is not None:
        states.packs()  # whether packed texts stay apart is checked in float32, before the trunk is quantised
    smoothing = model.__dict__.get(SMOOTHING)
    if states is not None and smoothing is not None:  # W8A8 with the folder's SmoothQuant scales
        from mtl_decoder.inference.smoothquant import quantize_blocks, scales_digest
        from mtl_decoder.inference.smoothquant_top import has_top_scales, quantize_top

        scales, settings = smoothing
        done += [f"trunk.{n}" for n in quantize_blocks(states.base, scales, settings)]
        if has_top_scales(scales):  # mode hybrid's trained top blocks, where the scales cover them
            done += quantize_top(model, scales, settings)
        states.set_compute(f"w8a8-{scales_digest(scales, settings)}")
    elif states is not None:  # the frozen trunk (or its cached lower blocks), held outside the tree
        names = {n for n, m in states.base.named_modules() if isinstance(m, nn.Linear) and _leaf(n) in TRUNK_INT8}
        _quantize(states.base, names)
        states.set_compute("int8")
        done += [f"trunk.{n}" for n in sorted(names)]
    # the native layers' attention projections (and plain Linear MLPs); not the gates' .proj
    layers = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("layers.")}
    layers = {n for n in layers if _leaf(n) != "proj"}
    _quantize(model, layers)
    groups = _quantize_expert_groups(model)
    setattr(model, INT8_FLAG, True)
    return done + sorted(layers) + groups


class Int8ExpertGroup(nn.Module):
    """An ``ExpertGroup`` (E SwiGLU experts reading the same tokens) with its products in int8.

    The up product (every expert's gate and up columns, one product) and each expert's down product through
    ``Int8Linear``: weights per output channel, activations per tensor as they come (the SwiGLU product of each
    expert on its own scale). The gates that mix the experts stay float32. Not a grouped matmul, so the block runs
    its per-group path (``ExpertBlock._groupable``), whose arithmetic is the grouped one's up to float rounding."""

    def __init__(self, group: nn.Module):
        from mtl_decoder.inference.smoothquant import Int8Linear

        super().__init__()
        self.n_experts, self.hidden = group.n_experts, group.hidden
        w_in, w_out = group.w_in.detach().float(), group.w_out.detach().float()  # (C, E*2H), (E, H, C)
        self.up = Int8Linear(_linear(w_in.t()), per_token=False)
        self.down = nn.ModuleList(Int8Linear(_linear(w.t()), per_token=False) for w in w_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(M, C) -> (E, M, C): every expert on every token."""
        M, E, H = x.shape[0], self.n_experts, self.hidden
        if M == 0:  # no token reads the group: nothing to quantise
            return x.new_zeros(E, 0, x.shape[1])
        h = self.up(x).view(M, E, 2, H)  # columns: [expert][gate|up][hidden], as ExpertGroup.w_in
        a = torch.nn.functional.silu(h[:, :, 0]) * h[:, :, 1]  # (M, E, H)
        return torch.stack([down(a[:, e]) for e, down in enumerate(self.down)])


def _linear(weight: torch.Tensor) -> nn.Linear:
    """A bias-free Linear holding ``weight`` (out, in)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    return linear


def _quantize_expert_groups(model: nn.Module) -> list[str]:
    """Every SwiGLU ``ExpertGroup`` of the native layers replaced by its ``Int8ExpertGroup`` (in place); their names."""
    from mtl_decoder.model.experts import ExpertGroup

    done = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is ExpertGroup:
                setattr(module, child_name, Int8ExpertGroup(child))
                done.append(f"{name}.{child_name}" if name else child_name)
    return done


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _quantize(module: nn.Module, names: set[str]) -> None:
    if not names:
        return
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao (not a dependency)
        torch.ao.quantization.quantize_dynamic(module, {n: qconfig for n in names}, dtype=torch.qint8, inplace=True)
