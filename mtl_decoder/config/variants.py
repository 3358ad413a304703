"""The expert-block variants (``model.ffn``): what each one has, where it sits and how it routes, in one table.

A batch row is one (example, route) pair. A route is a residual stream: one per task, and the shared one (named
``SHARED``). Every model starts on the shared stream, one row per example (the *shared bottom*: layers without
experts, a plain SwiGLU MLP each); the first layer that holds an expert block *forks* it: its task gates write one
route per task, read by that task's later layers and head.

    ffn           expert layers   routes after the fork                  model
    ple           all             every task + shared, every example     PLE (Tang et al., RecSys 2020), multi-level
    cgc           the top one     each task asked for                    single-level CGC (PLE paper, Tang et al. 2020)
    mmoe          the top one     each task asked for                    MMoE over a shared bottom (Ma et al., KDD 2018)
    cgc_stacked   all             each task asked for                    CGC in every layer: PLE without a shared route
    mmoe_stacked  all             each task asked for                    MMoE in every layer, task streams from layer 0
    mlp           none            none: one shared stream for all heads  hard sharing

The stacked forms are not the papers' models (each task has a private stream from layer 0, and nothing carries
another task's experts forward); they are kept as ablations, and models saved before the single-level forms
existed (ffn 'cgc' / 'mmoe' then meant the stacked form) load as them.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED = "shared"
"""The name of the shared route (and the prefix of shared experts' names, ``shared/0``)."""


@dataclass(frozen=True)
class Variant:
    name: str
    gated: bool
    """Some layers hold experts mixed by gates; False: a plain SwiGLU MLP in every layer, on the one shared route."""
    task_experts: bool
    """Each task owns experts of its own, besides the shared experts."""
    shared_route: bool
    """Every example runs the shared route beside every task's route in every expert layer; the shared gate mixes
    all experts into it (False for the other gated variants: an example runs only the routes of the tasks it is
    asked for)."""
    expert_layers: int | None
    """How many of the top layers hold an expert block (None: every layer; ignored when not gated). The layers below
    them are the shared bottom, each a plain SwiGLU MLP of width ``model.mlp_hidden`` on one row per example."""
    description: str

    def head_route(self, task: str) -> str:
        """The route a task's head reads: its own, or the shared stream when there is no other."""
        return task if self.gated else SHARED

    def first_expert_layer(self, n_layers: int) -> int:
        """Index of the layer whose expert block forks the shared bottom into task routes (``n_layers``: none)."""
        if not self.gated:
            return n_layers
        if self.expert_layers is None:
            return 0
        return max(0, n_layers - self.expert_layers)

    def has_experts(self, layer: int, n_layers: int) -> bool:
        return layer >= self.first_expert_layer(n_layers)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("ple", True, True, True, None, "PLE: task routes, a shared route and a shared gate in every layer"),
        Variant("cgc", True, True, False, 1, "single-level CGC: task + shared experts, task gates, top layer only"),
        Variant("mmoe", True, False, False, 1, "MMoE over a shared bottom: shared experts, task gates, top layer"),
        Variant("cgc_stacked", True, True, False, None, "CGC in every layer, task routes from layer 0 (ablation)"),
        Variant("mmoe_stacked", True, False, False, None, "MMoE in every layer, task routes from layer 0 (ablation)"),
        Variant("mlp", False, False, True, None, "hard sharing: a plain SwiGLU MLP, one stream for all heads"),
    )
}

STACKED_BEFORE_FORMAT_2 = {"cgc": "cgc_stacked", "mmoe": "mmoe_stacked"}
"""What ``model.ffn`` meant in a model saved before saved-model format 2, where it differs from today."""
