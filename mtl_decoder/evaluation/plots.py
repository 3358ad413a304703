"""PNG plots of expert utilisation, drawn from the metrics dict (so they always match metrics.json).

matplotlib is imported inside ``write_plots`` with the Agg backend: importing the package stays fast and
never needs a display.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from mtl_decoder.config import SHARED


def _safe(name: str) -> str:
    """A file-name form of a task or layer name.

    The name itself when it is letters, digits, '_', '.' and '-'; else
    those kept, the rest '_', and 8 hex digits of the name's SHA-256, so that two names never share a file
    ('实体' and '情感' would both be '_') and a name always gets the same one."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    if safe == name:
        return name
    return f"{safe}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def write_plots(metrics: dict[str, Any], plots_dir: Path) -> list[Path]:
    """A heat map per layer (gates x experts, mean weight) and, per task, its gate's shared share by layer.

    Returns the files written; none when the model has no gates (ffn=mlp). Old PNGs in ``plots_dir`` are
    removed first so the folder only shows this evaluation.
    """
    experts = metrics["experts"]
    plots_dir.mkdir(parents=True, exist_ok=True)
    for old in plots_dir.glob("*.png"):
        old.unlink()
    if not experts:
        return []
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    written = [_heatmap(plt, layer, gates, plots_dir) for layer, gates in experts.items()]
    tasks = [t for t in metrics["tasks"] if any(t in gates for gates in experts.values())]
    initial = metrics["settings"].get("initial_shared_weight")
    written += [_shared_share(plt, task, experts, initial, plots_dir) for task in tasks]
    return written


def _heatmap(plt, layer: str, gates: dict[str, dict[str, Any]], plots_dir: Path) -> Path:
    """Draw and save the heat map of one layer.

    Rows: gates; columns: every expert of the layer (task experts, then shared); blank where a gate does
    not see an expert."""
    fig = heatmap_figure(plt, layer, gates)
    path = plots_dir / f"experts_{_safe(layer)}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.05)
    plt.close(fig)
    return path


def heatmap_figure(plt, layer: str, gates: dict[str, dict[str, Any]]):
    """The heat map of one layer as a figure.

    The heat map of one layer as a figure, sized to what it holds: its height has room for the title, the
    expert names (slanted) and the axis label however few gates the layer has (the last PLE layer has no shared
    gate), its width for the gate names and the colour bar."""
    import numpy as np

    columns: list[str] = []
    for stats in gates.values():
        columns += [e for e in stats["experts"] if e not in columns]
    columns = [c for c in columns if not c.startswith(f"{SHARED}/")] + [
        c for c in columns if c.startswith(f"{SHARED}/")
    ]
    grid = np.full((len(gates), len(columns)), np.nan)
    for r, stats in enumerate(gates.values()):
        for e, value in stats["mean"].items():
            grid[r, columns.index(e)] = value
    longest_expert = max(len(c) for c in columns)
    longest_gate = max(len(g) for g in gates)
    width = 1.8 + 0.8 * len(columns) + 0.07 * longest_gate
    height = 1.8 + 0.5 * len(gates) + 0.07 * longest_expert  # title and x label + rows + slanted names
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")  # places the colour bar too
    vmax = max(1e-9, float(np.nanmax(grid)))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(columns)), columns, rotation=45, ha="right")
    ax.set_yticks(range(len(gates)), list(gates))
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            if not np.isnan(grid[r, c]):
                ax.text(c, r, f"{grid[r, c]:.2f}", ha="center", va="center", color="white", fontsize=7)
    ax.set_xlabel("expert")
    ax.set_ylabel("gate")
    ax.set_title(f"{layer}: mean gate weight")
    fig.colorbar(image, ax=ax)
    return fig


def _shared_share(plt, task: str, experts: dict[str, Any], initial: float | None, plots_dir: Path) -> Path:
    """Task gate k's weight on the shared experts, layer by layer (dashed: the initialisation value)."""
    layers = [
        (int(layer.rsplit("_", 1)[1]), gates[task]["shared_share"]) for layer, gates in experts.items() if task in gates
    ]
    fig, ax = plt.subplots(figsize=(4.5, 3.0))
    ax.plot([x for x, _ in layers], [y for _, y in layers], marker="o", label=f"gate {task}")
    if initial is not None:
        ax.axhline(initial, linestyle="--", color="grey", linewidth=1, label="at initialisation")
    ax.set_xticks([x for x, _ in layers])
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel("share of weight on shared experts")
    ax.set_title(f"{task}: shared share by layer")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = plots_dir / f"shared_share_{_safe(task)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
