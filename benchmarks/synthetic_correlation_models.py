"""The models of ``synthetic_correlation.py`` (its docstring describes them), built from mtl_decoder's blocks."""

from __future__ import annotations

import argparse

import torch
from torch import nn

# ------------------------------------------------------------------------------------------------------------------
# Adapter: every use of mtl_decoder's API is in this section (ExpertGroup, ExpertBlock, RouteLayout, SHARED).
# ------------------------------------------------------------------------------------------------------------------
from mtl_decoder.model import SHARED, ExpertBlock, ExpertGroup, RouteLayout

TASKS = ["t1", "t2"]


def make_expert_group(n_experts: int, d_model: int, hidden: int) -> nn.Module:
    return ExpertGroup(n_experts, d_model, hidden)


def run_expert_group(group: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(M, C) -> (M, C): the group's single expert."""
    return group(x)[0]


def make_block(
    variant: str, d_model: int, n_shared: int, n_task: int, hidden: int, initial_shared_weight: float, last: bool
) -> nn.Module:
    return ExpertBlock(
        variant,
        TASKS,
        d_model,
        n_shared,
        n_task,
        hidden,
        initial_shared_weight,
        shared_gate=not last,
    )


def build_layout(variant: str, batch: int) -> RouteLayout:
    """Every example on every task's route (+ the shared route for ple), one token per example."""
    everyone = torch.arange(batch)
    routes = {t: everyone for t in TASKS}
    if variant == "ple":
        routes[SHARED] = everyone
    return RouteLayout.build(routes, torch.ones(batch, 1, dtype=torch.bool))


def pack(x: torch.Tensor, layout: RouteLayout) -> torch.Tensor:
    """(B, C) examples -> (M, C) packed tokens, grouped by route."""
    return x.unsqueeze(1)[layout.row_example].flatten(0, 1)[layout.token_index]


def run_block(block: nn.Module, x: torch.Tensor, layout: RouteLayout) -> torch.Tensor:
    out, _gates = block(x, layout)
    return out


def task_tokens(layout: RouteLayout, task: str) -> slice:
    return layout.tokens(task)


def init_experts(model: nn.Module, how: str) -> None:
    """'project': the project's own (w_in ~ N(0, 0.02), w_out = 0); 'nonzero-wout': the project's w_in, w_out ~
    N(0, 1/hidden); 'fanin': w_in ~ N(0, 1/d_model), w_out ~ N(0, 1/hidden)."""
    for m in model.modules():
        if isinstance(m, ExpertGroup):
            m.reset_parameters()
            if how == "project":
                continue
            with torch.no_grad():
                if how == "fanin":
                    m.w_in.normal_(0.0, m.w_in.shape[0] ** -0.5)
                m.w_out.normal_(0.0, m.hidden**-0.5)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------


def tower(d_model: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_model, width), nn.ReLU(), nn.Linear(width, 1))


class Level(nn.Module):
    """One level: ``f(h)``, or with --residual the decoder's ``h + f(RMSNorm(h))``."""

    def __init__(self, f, d: int, residual: bool):
        super().__init__()
        self.f, self.norm = f, nn.RMSNorm(d) if residual else None

    def forward(self, h: torch.Tensor, *extra) -> torch.Tensor:
        return self.f(h, *extra) if self.norm is None else h + self.f(self.norm(h), *extra)


class HardSharing(nn.Module):
    def __init__(self, d: int, hidden: int, tower_width: int, residual: bool):
        super().__init__()
        self.bottom = make_expert_group(1, d, hidden)
        self.level = Level(lambda h: run_expert_group(self.bottom, h), d, residual)
        self.towers = nn.ModuleList(tower(d, tower_width) for _ in TASKS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.level(x)
        return torch.cat([t(h) for t in self.towers], dim=1)


class SingleTask(nn.Module):
    def __init__(self, d: int, hidden: int, tower_width: int, residual: bool):
        super().__init__()
        self.bottoms = nn.ModuleList(make_expert_group(1, d, hidden) for _ in TASKS)
        self.levels = nn.ModuleList(Level(lambda h, b=b: run_expert_group(b, h), d, residual) for b in self.bottoms)
        self.towers = nn.ModuleList(tower(d, tower_width) for _ in TASKS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([t(lv(x)) for lv, t in zip(self.levels, self.towers, strict=True)], dim=1)


class Gated(nn.Module):
    """One or more expert blocks (mmoe, cgc: one level; ple: two), then per-task towers."""

    def __init__(self, variant: str, levels: int, d: int, n_shared: int, n_task: int, hidden: int, args):
        super().__init__()
        self.variant = variant
        self.blocks = nn.ModuleList(
            make_block(variant, d, n_shared, n_task, hidden, args.initial_shared_weight, last=i == levels - 1)
            for i in range(levels)
        )
        self.levels = [Level(lambda h, lay, b=b: run_block(b, h, lay), d, args.residual) for b in self.blocks]
        self.norms = nn.ModuleList(lv.norm for lv in self.levels if lv.norm is not None)
        self.towers = nn.ModuleList(tower(d, args.tower) for _ in TASKS)
        self._layouts: dict[int, RouteLayout] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        if B not in self._layouts:
            self._layouts[B] = build_layout(self.variant, B)
        layout = self._layouts[B]
        h = pack(x, layout)
        for level in self.levels:
            h = level(h, layout)
        return torch.cat([t(h[task_tokens(layout, name)]) for t, name in zip(self.towers, TASKS, strict=True)], dim=1)


def build_model(name: str, args: argparse.Namespace) -> nn.Module:
    d, H, tw = args.dim, args.hidden, args.tower
    if name == "mlp":
        model = HardSharing(d, 8 * H, tw, args.residual)
    elif name == "stl":
        model = SingleTask(d, 4 * H, tw, args.residual)
    elif name == "mmoe":
        model = Gated("mmoe", 1, d, 8, 0, H, args)
    elif name == "cgc":
        model = Gated("cgc", 1, d, 4, 2, H, args)
    elif name == "ple":
        model = Gated("ple", 2, d, 2, 1, H, args)
    else:
        raise SystemExit(f"unknown model {name!r} (choose from mlp, mmoe, cgc, ple, stl)")
    init_experts(model, args.init)
    return model


def n_params(name: str, args: argparse.Namespace) -> dict:
    model = build_model(name, args)
    experts = sum(p.numel() for m in model.modules() if isinstance(m, ExpertGroup) for p in m.parameters())
    towers = sum(p.numel() for p in model.towers.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"experts": experts, "towers": towers, "gates": total - experts - towers, "total": total}
