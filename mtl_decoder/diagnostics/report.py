"""diagnose.md: the readable view of a diagnose.json.

diagnose.md: the readable view of a diagnose.json, rendered from its content alone (so the report can be
rebuilt from the JSON and always shows the same numbers)."""

from __future__ import annotations

from typing import Any


def render_markdown(report: dict[str, Any], plots: list[str]) -> str:
    """The whole report: verdict and findings first, then a section per check, then the timeline (if any)."""
    lines = [f"# Diagnosis of `{report['model']}`", ""]
    examples = ", ".join(f"{t} {n}" for t, n in report["examples"].items())
    lines += [f"Examples from the {report['split']} split: {examples}.", ""]
    lines += _findings(report)
    lines += _norms(report["norms"])
    lines += _attention(report["attention"])
    lines += _saturation(report["saturation"], report["settings"]["saturation"])
    lines += _gates(report["gates"])
    lines += _padding(report["padding"])
    if "profile" in report:
        lines += _profile(report["profile"])
    if "over_time" in report:
        lines += _over_time(report["over_time"])
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _findings(report: dict[str, Any]) -> list[str]:
    s = report["summary"]
    lines = ["## Verdict", "", f"{s['errors']} error(s), {s['warnings']} warning(s).", ""]
    shown = [f for f in report["findings"] if f["severity"] != "info"]
    if not shown:
        return [*lines, "No problems found.", ""]
    rows = [[f["severity"], f["code"], f"`{f['where']}`", f["message"]] for f in shown]
    return lines + _table(["severity", "code", "where", "finding"], rows)


def _norms(norms: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "## Sub-layer output norms",
        "",
        "Root mean square of each real token's output vector (mean and spread over tokens). A norm's input is the "
        "residual stream it reads; its token variance is the mean over channels of the variance over tokens, and "
        "constant channels are those with none.",
        "",
    ]
    rows = [
        [
            f"`{name}`",
            s.get("input_rms_mean"),
            s.get("input_rms_std"),
            s.get("output_rms_mean"),
            s.get("output_rms_std"),
            s.get("token_variance"),
            s.get("constant_channels"),
        ]
        for name, s in norms.items()
    ]
    header = ["module", "input RMS", "± std", "output RMS", "± std", "token variance", "constant channels"]
    return lines + _table(header, rows)


def _attention(attention: dict[str, list[dict[str, float]]]) -> list[str]:
    lines = [
        "## Attention entropy per head",
        "",
        "Entropy of softmax(QK^T/sqrt(D)) recomputed from each attention module's input with its mask, normalised by "
        "log(keys the query may see): 1 is uniform, 0 is one key. Diagonal: weight on the query's own position.",
        "",
    ]
    rows = [
        [f"`{name}`", h["head"], h["entropy"], h["normalised_entropy"], h["diagonal"]]
        for name, heads in attention.items()
        for h in heads
    ]
    if not rows:
        return [*lines, "No native attention modules in this model (a pretrained trunk's attention is not probed).", ""]
    return lines + _table(["module", "head", "entropy (nats)", "normalised", "diagonal"], rows)


def _saturation(saturation: dict[str, dict[str, Any]], rule: str) -> list[str]:
    lines = [
        "## Expert saturation",
        "",
        f"Saturated: a (token, unit) pair with {rule} (SiLU's flat tail: output and slope near 0). A dead unit is "
        "saturated on every token.",
        "",
    ]
    rows = [
        [f"`{name}`", e, s["tokens"], sat, dead]
        for name, s in saturation.items()
        for e, (sat, dead) in enumerate(zip(s["saturated_share"], s["dead_units_share"], strict=True))
    ]
    return lines + _table(["experts", "expert", "tokens", "saturated share", "dead units"], rows)


def _gates(gates: dict[str, Any]) -> list[str]:
    lines = ["## Gate balance", ""]
    if not gates["utilisation"]:
        return [*lines, *gates["notes"], ""]
    rows = []
    for layer, by_gate in gates["utilisation"].items():
        for gate, s in by_gate.items():
            top, weight = max(s["mean"].items(), key=lambda kv: kv[1])
            verdict = gates["verdicts"][layer][gate]
            rows.append([layer, gate, verdict, s["shared_share"], s["normalised_entropy"], f"{top} {weight:.2f}"])
    header = ["layer", "gate", "verdict", "shared share", "normalised entropy", "top expert"]
    return lines + _table(header, rows)


def _padding(padding: dict[str, Any]) -> list[str]:
    lines = [
        "## Padding leak",
        "",
        "Each batch is run twice, with random token ids instead of padding in the padded positions (and 4 padded "
        "positions added to every row): the largest change of a real token's logits, relative to their scale. "
        f"Above {padding['tolerance']:g}, padding leaks.",
        "",
    ]
    rows = [[task, diff] for task, diff in padding["max_relative_change"].items()]
    return lines + _table(["task", "largest relative change"], rows)


def _profile(profile: dict[str, Any]) -> list[str]:
    forward = profile["forward_ms"] or 1.0
    lines = [
        "## One forward pass",
        "",
        f"Wall time {profile['wall_ms']:.1f} ms (median of 5, on {profile['profiled_on']}); under the profiler "
        f"(mean of 3) {profile['forward_ms']:.1f} ms, of which Python and dispatch between operators "
        f"{profile['python_overhead_ms']:.1f} ms ({profile['python_overhead_share']:.0%}).",
        "",
    ]
    rows = [[part, ms, f"{ms / forward:.0%}"] for part, ms in profile["breakdown_ms"].items()]
    return lines + _table(["part", "ms", "share"], rows)


def _over_time(timeline: list[dict[str, Any]]) -> list[str]:
    lines = ["## Over the run's checkpoints", ""]
    rows = [
        [
            row["step"],
            _mean(row["residual_rms"].values()),
            _mean(row["attention_entropy"].values()),
            row["max_saturated_share"],
            row["min_gate_entropy"],
            row["padding_leak"],
            ", ".join(row["faults"]) or "none",
        ]
        for row in timeline
    ]
    header = ["step", "mean residual RMS", "mean head entropy", "max saturated", "min gate entropy", "padding"]
    header.append("faults")
    return lines + _table(header, rows)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
