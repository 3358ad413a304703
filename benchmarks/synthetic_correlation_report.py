"""Summaries and markdown tables of ``synthetic_correlation.py``'s results: every figure is computed from the per-seed
numbers, so ``python benchmarks/synthetic_correlation.py --table`` regenerates docs/synthetic_correlation.md's
tables from the stored JSON alone.

The design is paired: within a seed every model and every correlation sees the same data, the same training stream
and (per model) the same initialisation, so models are compared seed by seed (``paired``) and a claim is made only
where a stated share of the seeds (by default every one) orders the same way.
"""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
from itertools import combinations
from pathlib import Path

import torch


def machine() -> dict:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return {
        "cpu": models[0] if models else platform.processor() or platform.machine(),
        "avx512": sorted(f for f in flags if f.startswith("avx512")) or False,
        "logical_cpus": len(models) or None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def summarise(runs: dict, models: list[str], corrs: list[float], seeds: list[int]) -> list[dict]:
    """One row per (model, correlation): the spread over seeds of the held-out loss, and every seed's run."""
    rows = []
    for name in models:
        for p in corrs:
            per_seed = {str(s): runs[name, p, s] for s in seeds}
            loss = [r["loss"] for r in per_seed.values()]
            rows.append(
                {
                    "model": name,
                    "correlation": p,
                    "seeds": len(seeds),
                    "loss_mean": statistics.fmean(loss),
                    "loss_median": statistics.median(loss),
                    "loss_min": min(loss),
                    "loss_max": max(loss),
                    "loss_task1_mean": statistics.fmean(r["test_mse"][0] for r in per_seed.values()),
                    "loss_task2_mean": statistics.fmean(r["test_mse"][1] for r in per_seed.values()),
                    "capped": sum(r["capped"] for r in per_seed.values()),
                    "per_seed": per_seed,
                }
            )
    return rows


def merge(parts: list[dict]) -> dict:
    """One results file from runs of disjoint seeds with the same settings (apart from the seeds): the per-seed runs
    are pooled and the summary and comparisons recomputed; CPU seconds add up, wall seconds are the longest part's."""
    first = parts[0]
    ignore = ("seeds", "first_seed")
    same = {k: v for k, v in first["settings"].items() if k not in ignore}
    for part in parts[1:]:
        other = {k: v for k, v in part["settings"].items() if k not in ignore}
        if other != same:
            diff = sorted(k for k in same.keys() | other.keys() if same.get(k) != other.get(k))
            raise SystemExit(f"cannot merge results with different settings: {', '.join(diff)}")
    models = [m.strip() for m in same["models"].split(",")]
    corrs = [float(c) for c in same["correlations"].split(",")]
    runs = {}
    for part in parts:
        for row in part["results"]:
            for seed, run in row["per_seed"].items():
                if (row["model"], row["correlation"], int(seed)) in runs:
                    raise SystemExit(f"seed {seed} is in more than one of the merged files")
                runs[row["model"], row["correlation"], int(seed)] = run
    seeds = sorted({s for _, _, s in runs})
    pearson = {p: {} for p in first["label_pearson"]}
    for part, seeds_of in (
        (q, range(q["settings"]["first_seed"], q["settings"]["first_seed"] + q["settings"]["seeds"])) for q in parts
    ):
        for p, values in part["label_pearson"].items():
            pearson[p].update(zip(seeds_of, values, strict=True))
    rows = summarise(runs, models, corrs, seeds)
    return {
        **first,
        "results": rows,
        "label_pearson": {p: [v[s] for s in seeds] for p, v in pearson.items()},
        "label_variance": sum(q["label_variance"] * q["settings"]["seeds"] for q in parts) / len(seeds),
        "settings": {**first["settings"], "seeds": len(seeds), "first_seed": seeds[0]},
        "wall_s": max(q["wall_s"] for q in parts),
        "cpu_s": round(sum(q["cpu_s"] for q in parts), 1),
        "merged_from": [
            {
                "first_seed": q["settings"]["first_seed"],
                "seeds": q["settings"]["seeds"],
                "wall_s": q["wall_s"],
                "cpu_s": q["cpu_s"],
                "commit": q["commit"],
                "date": q["date"],
            }
            for q in parts
        ],
        "comparisons": compare(rows, models, corrs, first["settings"]["agree"]),
    }


# ------------------------------------------------------------------------------------------------------------------
# Paired comparisons
# ------------------------------------------------------------------------------------------------------------------


def sign_test_p(k: int, n: int) -> float:
    """Exact two-sided sign-test p-value of ``k`` successes in ``n`` fair coin flips (ties dropped beforehand)."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(a: list[float], b: list[float], share: float = 1.0) -> dict:
    """Seed-by-seed comparison of two lists of losses (lower is better), aligned by seed.

    ``verdict`` is 'a' when at least ``share`` of the seeds have a < b, 'b' when at least that share have b < a, and
    None (the seeds disagree) otherwise; ties count for neither side. ``diffs`` are a - b per seed."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired comparison needs two equally long, non-empty lists (got {len(a)} and {len(b)})")
    if not 0.5 < share <= 1.0:
        raise ValueError(f"share must be in (0.5, 1] (got {share})")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    a_lower, b_lower = sum(d < 0 for d in diffs), sum(d > 0 for d in diffs)
    n = len(diffs)
    need = math.ceil(share * n - 1e-9)
    verdict = "a" if a_lower >= need else "b" if b_lower >= need else None
    return {
        "n": n,
        "a_lower": a_lower,
        "b_lower": b_lower,
        "verdict": verdict,
        "diffs": diffs,
        "mean_diff": statistics.fmean(diffs),
        "sign_p": sign_test_p(a_lower, a_lower + b_lower),
    }


def seed_losses(rows: list[dict], model: str, p: float) -> list[float]:
    """The held-out test MSE (mean of the two tasks) of each seed, in seed order."""
    row = next(r for r in rows if r["model"] == model and r["correlation"] == p)
    return [row["per_seed"][s]["loss"] for s in sorted(row["per_seed"], key=int)]


def compare(rows: list[dict], models: list[str], corrs: list[float], share: float) -> dict:
    """Every pair of models at every correlation ('loss'), and every pair's rise from the highest correlation
    ('rise': the change of each seed's loss from p = max to p, compared between the two models)."""
    top = max(corrs)
    out = {"loss": [], "rise": [], "rise_per_model": []}
    for p in corrs:
        for a, b in combinations(models, 2):
            out["loss"].append(
                {"a": a, "b": b, "correlation": p, **paired(seed_losses(rows, a, p), seed_losses(rows, b, p), share)}
            )
        if p == top:
            continue
        rise = {
            m: [x - y for x, y in zip(seed_losses(rows, m, p), seed_losses(rows, m, top), strict=True)] for m in models
        }
        for m in models:  # a < b here means the loss rose less than zero, i.e. fell
            out["rise_per_model"].append({"model": m, "correlation": p, **paired(rise[m], [0.0] * len(rise[m]), share)})
        for a, b in combinations(models, 2):
            out["rise"].append({"a": a, "b": b, "correlation": p, **paired(rise[a], rise[b], share)})
    return out


# ------------------------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------------------------


def _range(values: list[float], signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(min(values))} to {f.format(max(values))}"


def _span(seeds: list[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def _grid(title: str, rows: list[str], corrs: list[float], cell, first: str = "model") -> list[str]:
    lines = [f"**{title}**", "", f"| {first} | " + " | ".join(f"p = {p}" for p in corrs) + " |"]
    lines.append("| --- " * (len(corrs) + 1) + "|")
    for r in rows:
        lines.append(f"| {r} | " + " | ".join(cell(r, p) for p in corrs) + " |")
    return [*lines, ""]


def _winner(c: dict) -> tuple[str, int]:
    """The side the verdict names (a model) and how many seeds have it lower."""
    return (c["a"], c["a_lower"]) if c["verdict"] == "a" else (c["b"], c["b_lower"])


def _verdict(c: dict, what: str = "lower") -> str:
    if c["verdict"] is None:
        return f"seeds disagree ({c['a']} {what} in {c['a_lower']}/{c['n']})"
    name, k = _winner(c)
    return f"{name} {what} in {k}/{c['n']}"


def tables(result: dict) -> str:
    """The markdown tables and the list of claims of one results file (``synthetic_correlation.json``)."""
    rows, s = result["results"], result["settings"]
    models = [m.strip() for m in s["models"].split(",")]
    corrs = [float(c) for c in s["correlations"].split(",")]
    share, top = s["agree"], max(corrs)
    by = {(r["model"], r["correlation"]): r for r in rows}
    cmp = compare(rows, models, corrs, share)
    seeds = sorted(int(k) for k in by[models[0], corrs[0]]["per_seed"])
    n, parts = len(seeds), result.get("merged_from")
    out = [
        f"One run: seeds {_span(seeds)}, correlations {', '.join(map(str, corrs))}, models {', '.join(models)}; "
        f"{result['date']}, commit {result['commit']}, {result['machine']['cpu']}, "
        f"{result['machine']['torch_threads']} thread per process, {result['cpu_s'] / 60:.0f} CPU-minutes"
        + (f" in {len(parts)} processes side by side (--merge)" if parts else "")
        + f". Every range below spans these {n} seeds. Held-out MSE: the test set's ({s['test_size']:,} examples "
        f"per seed), mean of the two tasks, at the checkpoint with the lowest validation MSE; label variance "
        f"{result['label_variance']:.2f}, noise floor {s['noise_var']}. A verdict needs {share:.0%} of the seeds.",
        "",
    ]

    def loss_cell(m: str, p: float) -> str:
        v = seed_losses(rows, m, p)
        capped = by[m, p]["capped"]
        return f"{statistics.fmean(v):.3f} ({_range(v)})" + (f", {capped} capped" if capped else "")

    out += _grid("Held-out MSE: mean over seeds (lowest to highest)", models, corrs, loss_cell)

    def conv_cell(m: str, p: float) -> str:
        r = by[m, p]
        stops = [r["per_seed"][k]["stopped_at"] for k in sorted(r["per_seed"], key=int)]
        dropped = sum(bool(run["lr_drops"]) for run in r["per_seed"].values())
        return (
            f"{statistics.median(stops):,.0f} ({min(stops):,}-{max(stops):,}), {r['capped']}/{len(stops)} capped, "
            f"lr dropped in {dropped}/{len(stops)}"
        )

    out += _grid(
        f"Steps to the stop (median, range), seeds that hit the {s['max_steps']:,}-step cap, seeds whose first stage "
        "flattened (lr dropped)",
        models,
        corrs,
        conv_cell,
    )

    pair_names = [f"{a} vs {b}" for a, b in combinations(models, 2)]
    loss_by = {(f"{c['a']} vs {c['b']}", c["correlation"]): c for c in cmp["loss"]}

    def pair_cell(name: str, p: float) -> str:
        c = loss_by[name, p]
        return f"{_verdict(c)}; {c['mean_diff']:+.3f} ({_range(c['diffs'], True)})"

    out += _grid(
        "Pairs, seed by seed: who is lower; paired difference a - b, mean (range)",
        pair_names,
        corrs,
        pair_cell,
        "a vs b",
    )

    rest = [p for p in corrs if p != top]
    rise_m = {(c["model"], c["correlation"]): c for c in cmp["rise_per_model"]}

    def rise_cell(m: str, p: float) -> str:
        c = rise_m[m, p]
        word = "rose" if c["verdict"] == "b" else "fell" if c["verdict"] == "a" else "mixed"
        return f"{c['mean_diff']:+.3f} ({_range(c['diffs'], True)}); {word}, up in {c['b_lower']}/{c['n']}"

    out += _grid(f"Change of each seed's loss from p = {top} (paired, mean (range))", models, rest, rise_cell)
    rise_by = {(f"{c['a']} vs {c['b']}", c["correlation"]): c for c in cmp["rise"]}

    def rise_pair_cell(name: str, p: float) -> str:
        c = rise_by[name, p]
        return f"{_verdict(c, 'rises less')}; {c['mean_diff']:+.3f} ({_range(c['diffs'], True)})"

    out += _grid(
        f"Pairs: whose loss rises less from p = {top}; difference of the rises a - b, mean (range)",
        pair_names,
        rest,
        rise_pair_cell,
        "a vs b",
    )
    out += ["**Claims (where the seeds agree)**", ""]
    out += [f"- {line}" for line in claims(cmp, models, corrs)] + [""]
    return "\n".join(out)


def claims(cmp: dict, models: list[str], corrs: list[float]) -> list[str]:
    """One line per model pair: at which correlations the seeds agree on the order, and which way."""
    lines = []
    for a, b in combinations(models, 2):
        cs = [c for c in cmp["loss"] if c["a"] == a and c["b"] == b]
        agreed = [c for c in cs if c["verdict"] is not None]
        if not agreed:
            lines.append(f"{a} vs {b}: no claim; the seeds disagree at every correlation.")
            continue
        parts = []
        for c in agreed:
            name, k = _winner(c)
            parts.append(f"{name} lower at p = {c['correlation']} ({k}/{c['n']}, sign test p = {c['sign_p']:.2f})")
        none = [str(c["correlation"]) for c in cs if c["verdict"] is None]
        tail = f"; the seeds disagree at p = {', '.join(none)}" if none else ""
        lines.append(f"{a} vs {b}: " + "; ".join(parts) + tail + ".")
    return lines
