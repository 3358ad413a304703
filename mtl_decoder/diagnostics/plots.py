"""PNG plots of a diagnose report, drawn from its JSON content (so they always match diagnose.json).

matplotlib is imported inside ``write_plots`` with the Agg backend: importing the package stays fast and never
needs a display. Every file name starts with ``diagnose_``; older ones in the folder are replaced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PREFIX = "diagnose_"


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """The plots that apply to ``report``: norms, attention entropy, saturation, gates, profile, timeline."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    for old in out_dir.glob(f"{PREFIX}*.png"):
        old.unlink()
    drawers = [
        ("norms", _norms, report["norms"]),
        ("attention", _attention, report["attention"]),
        ("saturation", _saturation, report["saturation"]),
        ("gates", _gates, report["gates"]["utilisation"]),
        ("profile", _profile, report.get("profile")),
        ("over_time", _over_time, report.get("over_time")),
    ]
    written = []
    for name, draw, data in drawers:
        if not data:
            continue
        fig = draw(plt, data)
        path = out_dir / f"{PREFIX}{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _norms(plt, norms: dict[str, dict[str, Any]]):
    """Output RMS (mean ± std) of every hooked module in forward order; the residual stream read by each norm."""
    names = list(norms)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(names)), 3.6))
    means = [_nan(norms[n].get("output_rms_mean")) for n in names]
    stds = [_nan(norms[n].get("output_rms_std")) for n in names]
    lower = [min(m, sd) for m, sd in zip(means, stds, strict=True)]  # an RMS is never negative
    ax.errorbar(x, means, yerr=[lower, stds], fmt="o", capsize=3, label="output RMS (± std)")
    residual = [_nan(norms[n].get("input_rms_mean")) for n in names]
    ax.plot(x, residual, "s", color="grey", label="residual stream into a norm")
    ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0.0)
    ax.set_ylabel("RMS per token")
    ax.set_title("sub-layer output norms")
    ax.legend(fontsize=7)
    return fig


def _attention(plt, attention: dict[str, list[dict[str, float]]]):
    """Normalised entropy per (attention module, head); diagonal-stuck heads marked with their diagonal share."""
    import numpy as np

    names = list(attention)
    heads = max(len(h) for h in attention.values())
    grid = np.full((len(names), heads), np.nan)
    for r, name in enumerate(names):
        for h in attention[name]:
            grid[r, h["head"]] = h["normalised_entropy"]
    fig, ax = plt.subplots(figsize=(1.5 + 0.9 * heads, 1.0 + 0.5 * len(names)))
    image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for r, name in enumerate(names):
        for h in attention[name]:
            label = f"{h['normalised_entropy']:.2f}" + (f"\ndiag {h['diagonal']:.0%}" if h["diagonal"] >= 0.5 else "")
            ax.text(h["head"], r, label, ha="center", va="center", color="white", fontsize=7)
    ax.set_xticks(range(heads), [f"head {i}" for i in range(heads)])
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_title("attention entropy (1 = uniform)")
    fig.colorbar(image, ax=ax)
    return fig


def _saturation(plt, saturation: dict[str, dict[str, Any]]):
    labels, saturated, dead = [], [], []
    for name, s in saturation.items():
        for e, (sat, d) in enumerate(zip(s["saturated_share"], s["dead_units_share"], strict=True)):
            labels.append(f"{name}[{e}]" if s["experts"] > 1 else name)
            saturated.append(sat)
            dead.append(d)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(labels)), 3.4))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], saturated, width=0.4, label="saturated (token, unit) share")
    ax.bar([i + 0.2 for i in x], dead, width=0.4, label="dead units")
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylim(0.0, 1.0)
    ax.set_title("expert saturation (SwiGLU gate input < -4)")
    ax.legend(fontsize=7)
    return fig


def _gates(plt, utilisation: dict[str, dict[str, Any]]):
    """Largest mean expert weight of every gate, per layer (1 = collapsed onto one expert)."""
    import numpy as np

    layers = list(utilisation)
    gates = list(dict.fromkeys(g for by_gate in utilisation.values() for g in by_gate))
    grid = np.full((len(gates), len(layers)), np.nan)
    for c, layer in enumerate(layers):
        for gate, s in utilisation[layer].items():
            grid[gates.index(gate), c] = max(s["mean"].values())
    fig, ax = plt.subplots(figsize=(1.5 + 1.0 * len(layers), 1.0 + 0.5 * len(gates)))
    image = ax.imshow(grid, cmap="magma", vmin=0.0, vmax=1.0, aspect="auto")
    for r in range(grid.shape[0]):
        for c in range(grid.shape[1]):
            if not np.isnan(grid[r, c]):
                ax.text(c, r, f"{grid[r, c]:.2f}", ha="center", va="center", color="white", fontsize=7)
    ax.set_xticks(range(len(layers)), layers)
    ax.set_yticks(range(len(gates)), gates)
    ax.set_title("largest mean expert weight per gate")
    fig.colorbar(image, ax=ax)
    return fig


def _profile(plt, profile: dict[str, Any]):
    parts = profile["breakdown_ms"]
    fig, ax = plt.subplots(figsize=(5.0, 3.0))
    ax.barh(list(parts), list(parts.values()))
    ax.axvline(profile["python_overhead_ms"], color="grey", linestyle="--", label="Python/dispatch overhead")
    ax.invert_yaxis()
    ax.set_xlabel("ms (one forward, under the profiler)")
    ax.set_title(f"forward pass: {profile['forward_ms']:.1f} ms")
    ax.legend(fontsize=7)
    return fig


def _over_time(plt, timeline: list[dict[str, Any]]):
    steps = [row["step"] for row in timeline]
    fig, axes = plt.subplots(1, 3, figsize=(11.0, 3.2))
    for name in timeline[-1]["residual_rms"]:
        axes[0].plot(steps, [_nan(row["residual_rms"].get(name)) for row in timeline], marker="o", label=name)
    axes[0].set_title("residual RMS into each norm")
    axes[0].legend(fontsize=5)
    for name in timeline[-1]["attention_entropy"]:
        axes[1].plot(steps, [_nan(row["attention_entropy"].get(name)) for row in timeline], marker="o", label=name)
    axes[1].set_title("mean head entropy (normalised)")
    axes[1].legend(fontsize=6)
    axes[2].plot(steps, [row["max_saturated_share"] for row in timeline], marker="o", label="max saturated share")
    axes[2].plot(steps, [_nan(row["min_gate_entropy"]) for row in timeline], marker="s", label="min gate entropy")
    axes[2].set_title("experts and gates")
    axes[2].legend(fontsize=6)
    for ax in axes:
        ax.set_xlabel("step")
    return fig


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
