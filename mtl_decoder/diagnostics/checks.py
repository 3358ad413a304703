"""The checks of ``diagnose`` that turn numbers into verdicts.

Collapsed norms, diagonal-stuck heads, saturated
experts, gate balance (from the utilisation report), and the padding-leak test.

| code                 | severity | what it means                                                              |
| -------------------- | -------- | -------------------------------------------------------------------------- |
| non_finite           | error    | NaN or infinity inside the model                                           |
| padding_leak         | error    | real tokens' outputs change when only the padding's content changes        |
| collapsed_norm       | error    | most of a norm's output channels are the same for every token              |
| diagonal_attention   | warning  | a head puts almost all its weight on each token's own position             |
| uniform_attention    | info     | a head spreads its weight almost evenly (normal early in training)         |
| saturated_experts    | warning  | most SwiGLU units of an expert sit in SiLU's flat negative tail            |
| dead_units           | warning  | most SwiGLU units of an expert never leave that tail                       |
| collapsed_gate       | warning  | a gate sends (almost) all its weight to one expert                         |
| dead_expert          | warning  | no gate that can use an expert gives it a fair share (it stops learning)   |
| ignores_own_experts  | warning  | a task's gate gives its own experts far less than a fair share             |
"""

from __future__ import annotations

from typing import Any

import torch

from mtl_decoder.config import SHARED
from mtl_decoder.diagnostics.findings import Finding

COLLAPSED_CHANNELS = 0.5
"""A norm is collapsed when this share of its output channels has zero variance over tokens."""
DIAGONAL = 0.8
"""A head is diagonal-stuck when its mean weight on the query's own position is at least this."""
UNIFORM = 0.98
"""A head is near-uniform (a note, normal early in training) when its normalised entropy is at least this."""
SATURATED = 0.5
"""An expert is saturated when this share of its (token, unit) pairs is in SiLU's flat tail."""
COLLAPSED_GATE = 0.9
"""A gate is collapsed when one expert's mean weight is at least this."""
PADDING_TOLERANCE = 1e-4
"""Largest change of a real token's output (relative to the output's scale) that is not a leak."""
EXTRA_PADDING = 4
"""Padded positions added to every row of the padding-leak batch, so every row has padding."""


# ---------------------------------------------------------------------------------------------- norms, heads, units


def norm_findings(norms: dict[str, dict[str, Any]]) -> list[Finding]:
    out = []
    for name, stats in norms.items():
        if stats.get("non_finite"):
            msg = f"{stats['non_finite']} token output(s) are NaN or infinite"
            out.append(Finding("error", "non_finite", msg, name, 1.0))
        constant = stats.get("constant_channels")
        if constant is not None and constant >= COLLAPSED_CHANNELS:
            msg = (
                f"{constant:.0%} of its output channels are the same for every token (token variance "
                f"{stats['token_variance']:.2e}): what reads it cannot tell tokens apart; check the norm's weight"
            )
            out.append(Finding("error", "collapsed_norm", msg, name, 0.5 + 0.5 * constant))
    return out


def attention_findings(attention: dict[str, list[dict[str, float]]]) -> list[Finding]:
    out = []
    for name, heads in attention.items():
        stuck = [h for h in heads if h["queries"] and h["diagonal"] >= DIAGONAL]
        if stuck:
            which = ", ".join(f"head {h['head']} ({h['diagonal']:.0%})" for h in stuck)
            msg = f"{which} attend to each token's own position: no information moves between positions"
            out.append(Finding("warning", "diagonal_attention", msg, name, 0.5 * len(stuck) / len(heads)))
        uniform = [h for h in heads if h["queries"] and h["normalised_entropy"] >= UNIFORM]
        if uniform:
            which = ", ".join(str(h["head"]) for h in uniform)
            msg = f"heads {which} spread their weight almost uniformly: they average the sentence (normal early on)"
            out.append(Finding("info", "uniform_attention", msg, name, 0.05))
    return out


def saturation_findings(saturation: dict[str, dict[str, Any]]) -> list[Finding]:
    out = []
    for name, stats in saturation.items():
        for e, (sat, dead) in enumerate(zip(stats["saturated_share"], stats["dead_units_share"], strict=True)):
            where = f"{name}[{e}]" if stats["experts"] > 1 else name
            if dead >= SATURATED:
                msg = f"{dead:.0%} of the expert's units never leave SiLU's flat tail (gate input < -4) on any token"
                out.append(Finding("warning", "dead_units", msg, where, 0.4 * dead))
            elif sat >= SATURATED:
                msg = f"{sat:.0%} of (token, unit) activations sit in SiLU's flat tail: little signal or gradient"
                out.append(Finding("warning", "saturated_experts", msg, where, 0.3 * sat))
    return out


# ---------------------------------------------------------------------------------------------- gates


def gate_verdicts(experts: dict[str, dict[str, dict[str, Any]]]) -> tuple[dict[str, dict[str, str]], list[Finding]]:
    """From the utilisation summary (layer -> gate -> statistics): a verdict per gate and the findings."""
    verdicts: dict[str, dict[str, str]] = {}
    findings: list[Finding] = []
    for layer, gates in experts.items():
        verdicts[layer] = {}
        for gate, stats in gates.items():
            verdict, finding = _gate_verdict(layer, gate, stats)
            verdicts[layer][gate] = verdict
            if finding is not None:
                findings.append(finding)
        findings += _dead_experts(layer, gates)
    return verdicts, findings


def _gate_verdict(layer: str, gate: str, stats: dict[str, Any]) -> tuple[str, Finding | None]:
    where = f"{layer}.{gate}"
    mean = stats["mean"]
    if len(mean) < 2:
        return "single expert", None
    top, weight = max(mean.items(), key=lambda kv: kv[1])
    if weight >= COLLAPSED_GATE:
        msg = f"{weight:.0%} of the gate's weight goes to {top}: the other experts get no signal through it"
        return "collapsed", Finding("warning", "collapsed_gate", msg, where, 0.6 * weight)
    own = [e for e in mean if not e.startswith(f"{SHARED}/")]
    if gate != SHARED and own:
        fair = len(own) / len(mean)
        share = 1.0 - stats["shared_share"]
        if share < stats["dead_threshold"] * len(own):
            msg = (
                f"task '{gate}' gives its own experts {share:.1%} of its weight (a fair share is {fair:.0%}): "
                "they are trained by nothing else"
            )
            return "ignores own experts", Finding("warning", "ignores_own_experts", msg, where, 0.4)
    return "balanced", None


def _dead_experts(layer: str, gates: dict[str, dict[str, Any]]) -> list[Finding]:
    """Experts that every gate able to use them gives less than its dead threshold."""
    readers: dict[str, list[tuple[str, float, float]]] = {}
    for gate, stats in gates.items():
        for expert, weight in stats["mean"].items():
            readers.setdefault(expert, []).append((gate, weight, stats["dead_threshold"]))
    out = []
    for expert, seen in readers.items():
        if all(weight < threshold for _, weight, threshold in seen):
            shares = ", ".join(f"{gate} {weight:.1%}" for gate, weight, _ in seen)
            msg = f"{expert} gets less than a quarter of a fair share from every gate that can use it ({shares})"
            out.append(Finding("warning", "dead_expert", msg, f"{layer}.{expert}", 0.4))
    return out


# ---------------------------------------------------------------------------------------------- padding


def widen(batch: dict[str, Any], extra: int, pad_id: int) -> dict[str, Any]:
    """The batch with ``extra`` more padded positions on every row (ids pad_id, mask False, word ids -1)."""
    out = dict(batch)
    fill = {"input_ids": pad_id, "attention_mask": False, "word_index": -1, "token_word": -1}
    for key, value in fill.items():
        if key in batch:
            tensor = batch[key]
            pad = torch.full((tensor.shape[0], extra), value, dtype=tensor.dtype, device=tensor.device)
            out[key] = torch.cat([tensor, pad], dim=1)
    return out


@torch.no_grad()
def padding_leak(
    model: torch.nn.Module, batch: dict[str, Any], tasks: list[str], vocab_size: int, pad_id: int, seed: int = 0
) -> dict[str, float]:
    """How much padded positions leak into each task's outputs.

    Largest change, per task, of a real token's (or an example's) output when the padded positions hold
    random token ids instead of padding; the batch is first widened so every row has padding."""
    padded = widen(batch, EXTRA_PADDING, pad_id)
    real = padded["attention_mask"].bool()
    noisy = dict(padded)
    generator = torch.Generator().manual_seed(seed)
    garbage = torch.randint(0, vocab_size, real.shape, generator=generator).to(real.device)
    noisy["input_ids"] = torch.where(real, padded["input_ids"], garbage)
    a, b = model(**padded, tasks=tasks), model(**noisy, tasks=tasks)
    out = {}
    for task, logits in a.logits.items():
        diff = (logits.float() - b.logits[task].float()).abs()
        if diff.dim() == 3:  # tagging: real positions of the task's rows only
            diff = diff[real[a.examples[task]]]
        scale = max(1.0, float(logits.float().abs().max()))
        out[task] = float(diff.max()) / scale if diff.numel() else 0.0
    return out


def padding_findings(leaks: dict[str, float]) -> list[Finding]:
    bad = {t: d for t, d in leaks.items() if not d <= PADDING_TOLERANCE}
    if not bad:
        return []
    worst = max(bad.values())
    detail = ", ".join(f"{t} {d:.2e}" for t, d in bad.items())
    msg = (
        f"real tokens' outputs change when only the padding's content changes ({detail}, relative to the logits' "
        "scale): padding leaks into attention; the loss falls, then jumps and oscillates as batch shapes vary"
    )
    return [Finding("error", "padding_leak", msg, ", ".join(bad), min(1.0, 0.7 + worst))]
