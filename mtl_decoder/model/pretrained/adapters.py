"""PLE inside a pretrained trunk: each block's MLP replaced by an expert block whose experts grow from it.

The transformers block calls ``self.mlp(hidden)`` on all rows of the batch (one row per example and route); the
``RoutedMLP`` put in its place packs the real tokens by route, runs this project's ``ExpertBlock`` on them, and
scatters the result back. The route layout reaches it through a context variable set for the duration of one
forward pass (per thread, so prediction workers do not see each other's batches).

Experts: ``CopiedExperts`` (mode upcycle: each expert a trainable copy of the pretrained MLP, so every gate mix of
them is exactly the pretrained MLP at step 0) and ``LoraExperts`` (mode lora: each expert the frozen pretrained
MLP with its own peft LoRA update on every linear layer, the update zero at step 0).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from mtl_decoder.config import ModelConfig, TrunkConfig
from mtl_decoder.model.experts import ExpertBlock, RouteLayout
from mtl_decoder.model.pretrained.hub import decoder_layers


@dataclass
class Routing:
    layout: RouteLayout
    gates: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """Filled layer by layer by the RoutedMLPs as the forward pass goes."""


_ROUTING: contextvars.ContextVar[Routing | None] = contextvars.ContextVar("mtl_routing", default=None)


@contextlib.contextmanager
def routing(layout: RouteLayout) -> Iterator[Routing]:
    """Make ``layout`` the route layout of the RoutedMLPs for one forward pass; collects their gates."""
    state = Routing(layout)
    token = _ROUTING.set(state)
    try:
        yield state
    finally:
        _ROUTING.reset(token)


def checkpoint_contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """The ``context_fn`` for gradient checkpointing under routing.

    ``context_fn`` of torch's non-reentrant checkpoint (gradient checkpointing): the backward pass recomputes a
    block after ``routing`` has ended, so the recomputation gets the layout of the forward pass that checkpointed
    it again (called once per checkpointed block, during that forward pass); the gates it recomputes are dropped."""
    state = _ROUTING.get()
    replay = routing(state.layout) if state is not None else contextlib.nullcontext()
    return contextlib.nullcontext(), replay


class CopiedExperts(nn.Module):
    """E trainable copies of a pretrained MLP module, whatever its family; (M, C) -> (E, M, C)."""

    def __init__(self, mlp: nn.Module, n_experts: int):
        super().__init__()
        self.n_experts = n_experts
        self.experts = nn.ModuleList(copy.deepcopy(mlp) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([expert(x) for expert in self.experts])


def lora_wrap(layer: nn.Module, trunk: TrunkConfig, name: str) -> nn.Module:
    """A peft LoRA layer around ``layer`` (nn.Linear, or transformers' Conv1D in GPT-2), sharing its weights."""
    from peft import LoraConfig
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers.pytorch_utils import Conv1D

    conv = isinstance(layer, Conv1D)
    config = LoraConfig(r=trunk.lora_rank, lora_alpha=trunk.lora_alpha, lora_dropout=0.0, fan_in_fan_out=conv)
    return LoraLinear(layer, name, config, r=trunk.lora_rank, lora_alpha=trunk.lora_alpha, is_target_conv_1d_layer=conv)


def lora_copy(mlp: nn.Module, trunk: TrunkConfig, name: str = "expert") -> nn.Module:
    """A LoRA-updated copy of an MLP that shares its frozen weights.

    A module that computes ``mlp`` with a LoRA update on each of its linear layers; the frozen pretrained
    weights are shared with ``mlp`` (not copied), only the low-rank matrices are the copy's own."""
    from transformers.pytorch_utils import Conv1D

    clone = copy.copy(mlp)  # same class and attributes, so the family's own forward runs ...
    clone._modules = dict(mlp._modules)  # ... on children of its own
    for child_name, child in mlp.named_children():
        if isinstance(child, (nn.Linear, Conv1D)):
            clone._modules[child_name] = lora_wrap(child, trunk, name)
    return clone


class LoraExperts(nn.Module):
    """E experts, each the frozen pretrained MLP plus its own low-rank update; (M, C) -> (E, M, C)."""

    def __init__(self, mlp: nn.Module, n_experts: int, trunk: TrunkConfig):
        super().__init__()
        self.n_experts = n_experts
        self.experts = nn.ModuleList(lora_copy(mlp, trunk) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([expert(x) for expert in self.experts])


class RoutedMLP(nn.Module):
    """Takes the place of a transformers block's ``mlp``: (N, T, C) rows of all routes -> (N, T, C)."""

    def __init__(self, block: ExpertBlock):
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        state = _ROUTING.get()
        if state is None:
            raise RuntimeError("RoutedMLP called outside mtl_decoder's routing context")
        layout = state.layout
        N, T, C = hidden.shape
        x = hidden.reshape(N * T, C)[layout.token_index]  # (M, C): real tokens, grouped by route
        out, gates = self.block(x, layout)
        state.gates.append(gates)
        return hidden.new_zeros(N * T, C).index_copy(0, layout.token_index, out.to(hidden.dtype)).view(N, T, C)


class SingleExpertMLP(nn.Module):
    """Hard sharing (ffn 'mlp') in mode lora: the pretrained MLP with one low-rank update, no routes or gates."""

    def __init__(self, mlp: nn.Module, trunk: TrunkConfig):
        super().__init__()
        self.expert = lora_copy(mlp, trunk)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        state = _ROUTING.get()
        if state is not None:
            state.gates.append({})
        return self.expert(hidden)


def _no_gates(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    """Forward hook of a shared-bottom block's own MLP (upcycle): its layer's entry in the gates, which has none."""
    state = _ROUTING.get()
    if state is not None:
        state.gates.append({})


def install_expert_blocks(base: nn.Module, cfg: ModelConfig, tasks: list[str], mode: str) -> list[ExpertBlock | None]:
    """Replace the MLPs of a pretrained trunk by expert blocks.

    Replace the MLP of every block of ``base`` that the variant gives experts (all, or for single-level cgc/mmoe
    the top one) by its expert block, in place; returns each block's expert block (None: none). ``mode``: the
    experts, 'upcycle' (trained copies of the MLP) or 'lora' (the frozen MLP plus a low-rank update)."""
    trunk, variant = cfg.trunk, cfg.variant
    layers = decoder_layers(base)
    blocks: list[ExpertBlock | None] = []
    for i, layer in enumerate(layers):
        mlp = layer.mlp
        if not variant.has_experts(i, len(layers)):
            # hard sharing, or the shared bottom below the expert layers: the pretrained MLP itself (upcycle) or
            # with one LoRA update, on every row (rows of the same example stay equal up to the fork)
            if mode == "lora":
                layer.mlp = SingleExpertMLP(mlp, trunk)
            elif variant.gated:
                mlp.register_forward_hook(_no_gates)
            blocks.append(None)
            continue
        make_group: Callable[[int], nn.Module]
        if mode == "upcycle":
            make_group = lambda n, mlp=mlp: CopiedExperts(mlp, n)  # noqa: E731
        else:
            make_group = lambda n, mlp=mlp: LoraExperts(mlp, n, trunk)  # noqa: E731
        hidden = int(base.config.hidden_size)
        block = ExpertBlock(
            variant,
            tasks,
            hidden,
            cfg.n_shared_experts,
            cfg.n_task_experts,
            0,
            cfg.initial_shared_weight,
            shared_gate=i < len(layers) - 1,
            make_group=make_group,
        )
        if mode == "upcycle":
            break_symmetry(block)
        layer.mlp = RoutedMLP(block)
        blocks.append(block)
    return blocks


UPCYCLE_GATE_STD = 0.02


def break_symmetry(block: ExpertBlock) -> None:
    """Make upcycled expert copies differ.

    Upcycled experts are exact copies: under zero-weight gates every token mixes a group's copies in the same
    proportions, so they get the same gradients and never become different experts. Small random gate weights
    give each token its own mix, hence each copy its own gradient; the block's output is unchanged at step 0
    (any mix of identical experts is the pretrained MLP), and the shared-expert bias still sets the mean mass."""
    gates = [*block.task_gates.values(), *([block.shared_gate] if block.shared_gate is not None else [])]
    with torch.no_grad():
        for gate in gates:
            gate.proj.weight.normal_(0.0, UPCYCLE_GATE_STD)


def add_lora_to_linears(module: nn.Module, trunk: TrunkConfig, name: str) -> None:
    """Put a LoRA update on every linear child of ``module`` in place (e.g. an attention module's projections)."""
    from transformers.pytorch_utils import Conv1D

    for child_name, child in list(module.named_children()):
        if isinstance(child, (nn.Linear, Conv1D)):
            module._modules[child_name] = lora_wrap(child, trunk, name)
