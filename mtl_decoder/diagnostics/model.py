"""``diagnose``: what a trained model does inside.

``diagnose``: what a trained model does inside, on a few examples of a split, and how that moved over a run's
checkpoints.

    mtl-decoder diagnose --model RUN/best [--split validation] [--data TASK=PATH ...] [--output DIR]
    mtl-decoder diagnose --checkpoints RUN [...]          (each checkpoint in RUN/checkpoints, oldest first)

Per layer and sub-layer the output norm; attention entropy per head and diagonal-stuck heads; the share of
saturated expert units; gate balance verdicts from the utilisation statistics; a padding-leak check; a profile of
one forward pass. Writes DIR/diagnose.json, DIR/diagnose.md and PNG plots beside them (DIR defaults to
MODEL/diagnose, or RUN/diagnose). Error-level findings (padding leak, collapsed norm, NaN) make the CLI exit 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from mtl_decoder.config import SPLITS
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.data.tasks import load_split, source_key
from mtl_decoder.diagnostics import checks
from mtl_decoder.diagnostics.defaults import DIAGNOSE_EXAMPLES
from mtl_decoder.diagnostics.findings import Finding, codes, count, finding_lines, ranked
from mtl_decoder.diagnostics.probes import SATURATION, Probes
from mtl_decoder.diagnostics.profile import profile_forward
from mtl_decoder.errors import UserError, did_you_mean
from mtl_decoder.evaluation.evaluate import parse_data, with_overrides
from mtl_decoder.evaluation.utilisation import UtilisationTracker
from mtl_decoder.files import atomic_write_text, check_writable_parent
from mtl_decoder.paths import check_outside_model
from mtl_decoder.saved import SavedModel, load_model
from mtl_decoder.training.checkpoints import checkpoint_dirs
from mtl_decoder.training.run_dir import RunDirectory

JSON_FILE = "diagnose.json"
REPORT_FILE = "diagnose.md"
OUTPUT_DIR = "diagnose"
WEIGHTS_FILE = "model.safetensors"

Batch = tuple[list[str], dict[str, Any]]
"""The tasks a batch runs, and the collated batch (on the model's device)."""


@dataclass
class DiagnoseResult:
    report: dict[str, Any]
    """The content of diagnose.json."""
    findings: list[Finding]
    output_dir: Path

    @property
    def ok(self) -> bool:
        return count(self.findings, "error") == 0

    def summary_lines(self) -> list[str]:
        lines = finding_lines(self.findings) or ["no problems found"]
        faults = count(self.findings, "error"), count(self.findings, "warning")
        lines.append(f"{faults[0]} error(s), {faults[1]} warning(s)")
        lines.append(f"wrote {self.output_dir / REPORT_FILE}, {JSON_FILE} and plots")
        return lines


def diagnose(
    model_dir: str | Path,
    data: Mapping[str, str | Path] | Iterable[str] | None = None,
    split: str = "validation",
    output_dir: str | Path | None = None,
    examples: int = DIAGNOSE_EXAMPLES,
    device: str | torch.device | None = None,
    profile: bool = True,
) -> DiagnoseResult:
    """Diagnose a saved model on a few examples per task.

    Diagnose the model in ``model_dir`` on the first ``examples`` examples per task of ``split`` (or of the
    files ``data`` names, as in ``evaluate``); writes the report to ``output_dir`` (default MODEL/diagnose).
    ``profile``: also profile one forward pass (a few seconds on a CPU)."""
    out_dir = _output_dir(output_dir, Path(model_dir) / OUTPUT_DIR, model_dir)
    saved = load_model(model_dir, device)
    batches, counts = diagnostic_batches(saved, split, data, examples)
    sections, findings = inspect_model(saved, batches)
    if profile:
        sections["profile"] = profile_forward(saved.model, batches[0][1], batches[0][0])
    report = _report(str(model_dir), split, counts, sections, findings)
    return _write(report, findings, out_dir)


def diagnose_checkpoints(
    run_dir: str | Path,
    data: Mapping[str, str | Path] | Iterable[str] | None = None,
    split: str = "validation",
    output_dir: str | Path | None = None,
    examples: int = DIAGNOSE_EXAMPLES,
    device: str | torch.device | None = None,
    profile: bool = True,
) -> DiagnoseResult:
    """``diagnose`` on every checkpoint of a run.

    ``diagnose`` on every checkpoint of a run, oldest first: a timeline of the main numbers, and the full
    report of the latest checkpoint. The run's config, tokenizer and labels come from RUN/best."""
    run = RunDirectory(run_dir)
    found = checkpoint_dirs(run.checkpoints)
    if not found:
        raise UserError(f"{run.checkpoints}: no complete checkpoints to diagnose")
    out_dir = _output_dir(output_dir, run.path / OUTPUT_DIR, run.best)
    saved = load_model(run.best, device)
    batches, counts = diagnostic_batches(saved, split, data, examples)
    timeline = []
    for checkpoint in found:
        load_weights(saved.model, checkpoint / WEIGHTS_FILE)
        sections, findings = inspect_model(saved, batches)
        timeline.append(timeline_row(checkpoint, sections, findings))
    if profile:
        sections["profile"] = profile_forward(saved.model, batches[0][1], batches[0][0])
    report = _report(str(found[-1]), split, counts, sections, findings)
    report["over_time"] = timeline
    return _write(report, findings, out_dir)


def _output_dir(given: str | Path | None, default: Path, model_dir: str | Path) -> Path:
    """The report folder: ``given`` or ``default``; never another folder inside the model folder."""
    out_dir = Path(given) if given is not None else default
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--output {out_dir}: exists and is not a directory")
    check_outside_model(out_dir, model_dir, own=default)
    check_writable_parent(out_dir / JSON_FILE, "--output")
    return out_dir


# ------------------------------------------------------------------------------------------------ inputs


def diagnostic_batches(
    saved: SavedModel, split: str, data: Mapping[str, str | Path] | Iterable[str] | None, examples: int
) -> tuple[list[Batch], dict[str, tuple[int, str]]]:
    """The batches ``diagnose`` runs.

    The first ``examples`` examples of each source of ``split`` (each task's own file, or --data's), collated
    without labels in the run's eval batch size, and per task (examples, source); tasks with no such split are
    left out."""
    if split not in SPLITS:
        raise UserError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)}){did_you_mean(split, SPLITS)}")
    if examples < 1:
        raise UserError(f"--examples must be at least 1, got {examples}")
    cfg = saved.config
    overrides = parse_data(data, list(cfg.tasks))
    tasks = with_overrides(cfg, split, overrides)
    names = [n for n in cfg.tasks if source_key(tasks[n], split) is not None]
    if not names:
        raise UserError(f"no task has '{split}' data: choose another --split or pass --data TASK=PATH")
    collate = collator_for(saved.model.cfg, saved.encoder.pad_id, {})
    device = next(saved.model.parameters()).device
    batches: list[Batch] = []
    counts: dict[str, tuple[int, str]] = {}
    size = cfg.data.eval_batch_size
    for source in load_split(tasks, split, names, repair_iob=cfg.data.repair_iob):
        chosen = source.examples[:examples]
        encoded = saved.encoder.encode_batch([ex.words if ex.words is not None else ex.text for ex in chosen])
        rows = [EncodedExample.unlabelled(e) for e in encoded]
        run = [t.name for t in source.tasks]
        for start in range(0, len(rows), size):
            batch = {k: v.to(device) for k, v in collate(rows[start : start + size]).items()}
            batches.append((run, batch))
        counts.update({name: (len(chosen), source.key) for name in run})
    return batches, counts


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """A checkpoint's weights into ``model`` (same architecture); a UserError naming the file otherwise."""
    try:
        state = load_file(str(path))
        model.load_state_dict(state)
    except (SafetensorError, OSError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0]
        raise UserError(f"{path}: cannot load these weights into the run's model ({first})") from None


# ------------------------------------------------------------------------------------------------ the checks


@torch.no_grad()
def inspect_model(saved: SavedModel, batches: list[Batch]) -> tuple[dict[str, Any], list[Finding]]:
    """Every check but the profile, over ``batches``: the report's sections and the findings (unranked)."""
    model, cfg = saved.model, saved.config
    was_training = model.training
    model.eval()
    tracker = UtilisationTracker(model, cfg.evaluation.position_buckets, cfg.evaluation.dead_expert_fraction)
    non_finite: dict[str, int] = {}
    with Probes(model) as probes:
        for tasks, batch in batches:
            out = model(**batch, tasks=tasks)
            probes.finish(batch["attention_mask"], out)
            tracker(out, batch)
            for task, logits in out.logits.items():
                non_finite[task] = non_finite.get(task, 0) + int((~torch.isfinite(logits)).sum())
    leaks: dict[str, float] = {}
    vocab, pad = saved.encoder.vocab_size, saved.encoder.pad_id
    for tasks, batch in batches:
        for task, diff in checks.padding_leak(model, batch, tasks, vocab, pad).items():
            leaks[task] = max(leaks.get(task, 0.0), diff)
    model.train(was_training)

    probed = probes.summary()
    experts = tracker.summary()
    verdicts, gate_findings = checks.gate_verdicts(experts)
    findings = [
        *checks.norm_findings(probed["norms"]),
        *checks.attention_findings(probed["attention"]),
        *checks.saturation_findings(probed["saturation"]),
        *gate_findings,
        *checks.padding_findings(leaks),
    ]
    findings += [
        Finding("error", "non_finite", f"{n} logit(s) are NaN or infinite", f"heads.{task}", 1.0)
        for task, n in non_finite.items()
        if n
    ]
    sections = {
        **probed,
        "gates": {"verdicts": verdicts, "utilisation": experts, "notes": tracker.notes()},
        "padding": {"max_relative_change": leaks, "tolerance": checks.PADDING_TOLERANCE},
    }
    if probes.unmapped:
        findings.append(
            Finding("info", "unmapped_rows", f"{probes.unmapped} hooked output(s) had rows not matched to examples")
        )
    return sections, findings


def timeline_row(checkpoint: Path, sections: dict[str, Any], findings: list[Finding]) -> dict[str, Any]:
    """One checkpoint's headline numbers.

    Residual-stream RMS per norm, mean attention entropy per module, the
    most saturated expert, the least balanced gate, the padding leak and the fault codes."""
    gate_entropy = [
        s["normalised_entropy"]
        for gates in sections["gates"]["utilisation"].values()
        for s in gates.values()
        if s["normalised_entropy"] is not None
    ]
    saturated = [x for s in sections["saturation"].values() for x in s["saturated_share"]]
    return {
        "step": int(checkpoint.name.split("-")[-1]),
        "checkpoint": str(checkpoint),
        "residual_rms": {n: s.get("input_rms_mean") for n, s in sections["norms"].items() if "input_rms_mean" in s},
        "attention_entropy": {
            n: sum(h["normalised_entropy"] for h in heads) / len(heads) for n, heads in sections["attention"].items()
        },
        "max_saturated_share": max(saturated, default=0.0),
        "min_gate_entropy": min(gate_entropy, default=None),
        "padding_leak": max(sections["padding"]["max_relative_change"].values(), default=0.0),
        "faults": sorted(codes(findings)),
    }


# ------------------------------------------------------------------------------------------------ outputs


def _report(
    model: str, split: str, counts: dict[str, tuple[int, str]], sections: dict[str, Any], findings: list[Finding]
) -> dict[str, Any]:
    findings = ranked(findings)
    return {
        "model": model,
        "split": split,
        "examples": {task: n for task, (n, _) in counts.items()},
        "sources": {task: source for task, (_, source) in counts.items()},
        "summary": {
            "ok": count(findings, "error") == 0,
            "errors": count(findings, "error"),
            "warnings": count(findings, "warning"),
            "faults": sorted(codes(findings)),
        },
        "findings": [f.to_dict() for f in findings],
        **sections,
        "settings": {
            "saturation": f"SwiGLU gate input < -{SATURATION}",
            "collapsed_norm_channels": checks.COLLAPSED_CHANNELS,
            "diagonal_head": checks.DIAGONAL,
            "saturated_expert": checks.SATURATED,
            "collapsed_gate": checks.COLLAPSED_GATE,
            "padding_tolerance": checks.PADDING_TOLERANCE,
        },
    }


def _write(report: dict[str, Any], findings: list[Finding], out_dir: Path) -> DiagnoseResult:
    from mtl_decoder.diagnostics.plots import write_plots
    from mtl_decoder.diagnostics.report import render_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(report, out_dir)
    atomic_write_text(out_dir / JSON_FILE, json.dumps(finite(report), indent=2, allow_nan=False) + "\n")
    atomic_write_text(out_dir / REPORT_FILE, render_markdown(report, [p.name for p in plots]))
    return DiagnoseResult(report, ranked(findings), out_dir)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
