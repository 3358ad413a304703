"""The expert-block variants (``model.ffn``): what each one has and how it routes, in one table.

A batch row is one (example, route) pair. A route is a residual stream: one per task, and the shared one
(named ``SHARED``), which the shared gate of ``ple`` writes and every head of ``mlp`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED = "shared"
"""The name of the shared route (and the prefix of shared experts' names, ``shared/0``)."""


@dataclass(frozen=True)
class Variant:
    name: str
    gated: bool
    """The layer holds experts mixed by gates; False: a plain SwiGLU MLP on the one shared route."""
    task_experts: bool
    """Each task owns experts of its own, besides the shared experts."""
    shared_route: bool
    """Every example runs the shared route beside every task's route; the shared gate mixes all experts into it
    (False for gated variants: an example runs only the routes of the tasks it is asked for)."""
    description: str

    def head_route(self, task: str) -> str:
        """The route a task's head reads: its own, or the shared stream when there is no other."""
        return task if self.gated else SHARED


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("ple", True, True, True, "paper-faithful PLE: task routes, a shared route and a shared gate"),
        Variant("cgc", True, True, False, "task experts + shared experts mixed by task gates, no shared route"),
        Variant("mmoe", True, False, False, "shared experts only, one gate per task"),
        Variant("mlp", False, False, True, "hard sharing: a plain SwiGLU MLP, one stream for all heads"),
    )
}
