"""``quantize``: SmoothQuant scales for a pretrained trunk, made once and kept in the model folder.

    mtl-decoder quantize --model RUN/best [--calibration-texts 512] [--check-texts 0] [--alpha 0.8]

Calibration: the largest activation of every smoothed channel over ``calibration_texts`` of the model's training
texts (spread over its sources), the trunk's cached blocks in float32 (inference/smoothquant.py), and in mode hybrid
its trained top blocks with their experts, the whole model run in float32 (inference/smoothquant_top.py). Check, before
anything is written: the model's validation texts predicted in float32 and in W8A8 int8 through the same
Predictor path; per task the share of texts whose tags (tagging) or label (classification) are identical. Under
``min_tags`` / ``min_labels``, int8's close texts are predicted again in float32 (inference/refine.py): the smallest
margin that reaches the bars is stored with the scales; where none does, nothing is written and the numbers are
the error. Otherwise the scales go to
RUN/best/smoothquant.safetensors (listed in the folder's manifest) with the agreement measured, and
``predict``/``evaluate --precision int8`` run every Linear of the cached blocks in int8 with them.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtl_decoder.config import CLASSIFICATION
from mtl_decoder.errors import UserError
from mtl_decoder.export_onnx import validation_texts
from mtl_decoder.inference import refine
from mtl_decoder.inference.options import InferenceOptions
from mtl_decoder.inference.predictor import Predictor
from mtl_decoder.inference.quantize import use_smoothing
from mtl_decoder.inference.smoothquant import (
    SCALES_FILE,
    SmoothQuantSettings,
    calibrate,
    int8_products_are_fast,
    save_scales,
    smoothing_scales,
)
from mtl_decoder.inference.smoothquant_top import calibrate_top, top_blocks, top_scales
from mtl_decoder.saved import SavedModel, add_to_manifest, load_model

MIN_TAGS = 0.98
"""Share of validation texts whose tags must all be identical to float32's (each tagging task)."""
MIN_LABELS = 0.99
"""Share of validation texts whose label must be identical to float32's (each classification task)."""
CALIBRATION_BATCH = 16


@dataclass
class QuantizeResult:
    directory: Path
    agreement: dict[str, float]
    """Task -> share of checked validation texts whose tags / label are float32's."""
    texts: int
    """Validation texts checked."""
    record: dict[str, Any] = field(default_factory=dict)

    def report(self) -> str:
        same = ", ".join(f"{task} {share:.2%}" for task, share in self.agreement.items())
        alone = ", ".join(f"{task} {share:.2%}" for task, share in self.record.get("int8_alone_agreement", {}).items())
        margin = self.record.get("refine_margin", 0.0)
        refined = (
            f" with the {self.record['refined_share']:.1%} of texts whose int8 label is within {margin} of a tie "
            f"predicted again in float32 (int8 alone: {alone}; --no-refine)"
            if margin
            else ""
        )
        slow = (
            "; this CPU has no fast int8 x int8 products (no VNNI or AMX): activations quantised per token run as "
            "float32 sums here, slower than float32 alone, while --per-token down_proj quantises the others per "
            "tensor (faster, further from float32)"
            if self.record.get("all_per_token") and not self.record.get("int8_products_fast", True)
            else ""
        )
        return (
            f"wrote {self.directory / SCALES_FILE}: --precision int8 (predict, evaluate) is W8A8 with these scales; "
            f"identical to float32 on {self.texts} validation texts: {same}{refined}{slow}"
        )


def quantize_model(
    model_dir: str | Path,
    calibration_texts: int = 512,
    check_texts: int = 0,
    settings: SmoothQuantSettings | None = None,
    min_tags: float = MIN_TAGS,
    min_labels: float = MIN_LABELS,
    cache_dir: str | Path | None = None,
    refine_margin: float | None = None,
) -> QuantizeResult:
    """Make, check and store the SmoothQuant scales of a saved model's cached trunk blocks (see the module doc).

    ``check_texts``: validation texts compared (0: all); ``cache_dir``: the state cache folder (default the model's);
    ``refine_margin``: the margin within which int8 classifications are predicted again in float32
    (inference/refine.py; None: the smallest of refine.MARGINS that reaches the bars; 0: int8 alone)."""
    settings = settings or SmoothQuantSettings()
    if refine_margin is not None and not 0.0 <= refine_margin <= 1.0:
        raise UserError(f"quantize --refine-margin: must be in [0, 1], got {refine_margin}")
    start = time.perf_counter()
    saved = load_model(model_dir, device="cpu")
    states = saved.model.trunk_kind.cached_states()
    if states is None:
        raise UserError(
            f"{model_dir}: quantize makes smoothing scales for a pretrained trunk's cached blocks (modes frozen, "
            "hybrid, echo, layer mixes); this model has none: --precision int8 quantises it as it is"
        )
    scales = make_scales(saved, calibration_texts, settings, cache_dir)
    n_top = len(top_blocks(saved.model))
    texts = validation_texts(saved)
    texts = texts if check_texts <= 0 else _spread(texts, check_texts)
    exact, fast = _predictions(saved, Path(model_dir), scales, settings, texts, cache_dir)
    bars = _bars(saved, min_tags, min_labels)
    alone = refine.agreement(exact, fast, 0.0, bars)["agreement"]
    chosen = refine.choose_margin(exact, fast, bars) if refine_margin is None else None
    margin = refine_margin if chosen is None else chosen[0]
    if margin is None:  # no margin tried reaches the bars: the largest one's shortfall is the error
        margin = refine.MARGINS[-1]
    measured = refine.agreement(exact, fast, margin, bars)
    below = _below(saved, measured["agreement"], min_tags, min_labels)
    if below:
        raise UserError(
            f"quantize {model_dir}: W8A8 int8 disagrees with float32 on its validation texts even with the texts "
            f"within {margin} of a tie predicted again in float32 ({'; '.join(below)}); nothing written: keep "
            "--precision fp32 (or int8 without scales), or try another --alpha"
        )
    record = {"calibration_texts": calibration_texts, "checked_texts": len(texts), "agreement": measured["agreement"],
              "trained_top_blocks": n_top, "int8_alone_agreement": alone, "refine_margin": margin,
              "refined_share": measured["refined"],
              "min_tags": min_tags, "min_labels": min_labels, "seconds": round(time.perf_counter() - start, 1),
              "machine": platform.machine(), "torch": torch.__version__, "all_per_token": settings.all_per_token,
              "int8_products_fast": int8_products_are_fast()}  # fmt: skip
    path = Path(model_dir) / SCALES_FILE
    save_scales(path, scales, settings, record)
    add_to_manifest(model_dir, SCALES_FILE)
    return QuantizeResult(Path(model_dir), measured["agreement"], len(texts), record)


def make_scales(
    saved: SavedModel,
    calibration_texts: int,
    settings: SmoothQuantSettings,
    cache_dir: str | Path | None = None,
    top: bool = True,
) -> dict[str, torch.Tensor]:
    """The smoothing scales of a saved model's cached blocks, calibrated on ``calibration_texts`` of its training texts,
    and (``top``, mode hybrid) of its trained top blocks."""
    states = saved.model.trunk_kind.cached_states()
    items = _calibration_items(saved, calibration_texts)
    scales = smoothing_scales(states.base, calibrate(states.base, _calibration_batches(saved, items)), settings)
    if top and top_blocks(saved.model):  # mode hybrid: its trained top blocks too (inference/smoothquant_top.py)
        scales |= top_scales(saved.model, _calibrate_top(saved, items, cache_dir), settings)
    return scales


def _spread(items: list, n: int) -> list:
    """``n`` items spread evenly over ``items`` (all of them when there are fewer)."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def _calibration_items(saved: SavedModel, n: int) -> list[list[str] | str]:
    """``n`` training texts spread over the model's training sources."""
    from mtl_decoder.data.tasks import load_split

    if n <= 0:
        raise UserError(f"quantize --calibration-texts: must be positive, got {n}")
    cfg = saved.config
    sources = load_split(dict(cfg.tasks), "train", None, repair_iob=cfg.data.repair_iob)
    items = []
    for source in sources:
        texts = [ex.words if ex.words is not None else ex.text for ex in source.examples]
        items += _spread(texts, max(1, n // len(sources)))
    return items


def _calibration_batches(saved: SavedModel, items: list[list[str] | str]):
    """(ids, mask) batches of ``items`` as the trunk reads them."""
    encoded = saved.encoder.encode_batch(items)
    for i in range(0, len(encoded), CALIBRATION_BATCH):
        rows = [e.ids for e in encoded[i : i + CALIBRATION_BATCH]]
        longest = max(len(r) for r in rows)
        ids = torch.full((len(rows), longest), saved.encoder.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, : len(r)], mask[j, : len(r)] = torch.tensor(r), 1
        yield ids, mask


def _calibrate_top(saved: SavedModel, items: list, cache_dir: str | Path | None) -> dict[str, torch.Tensor]:
    """The top blocks' activation ranges over ``items``, the whole model run in float32 as prediction runs it."""
    options = InferenceOptions(precision="fp32", workers=1, cache_dir=cache_dir, refine=False)
    predictor = Predictor.from_saved(saved, options)
    return calibrate_top(saved.model, lambda: list(predictor.predict(items)))


def _predictions(
    saved: SavedModel,
    model_dir: Path,
    scales: dict[str, torch.Tensor],
    settings: SmoothQuantSettings,
    texts: list,
    cache_dir: str | Path | None,
) -> tuple[list, list]:
    """``texts`` predicted in float32 and in W8A8 int8 (alone: no texts predicted again), through the same path."""
    runs = []
    for precision in ("fp32", "int8"):
        model = saved if precision == "fp32" else load_model(model_dir, device="cpu")
        if precision == "int8":
            use_smoothing(model.model, scales, settings)
        options = InferenceOptions(precision=precision, workers=1, cache_dir=cache_dir, refine=False)
        runs.append(list(Predictor.from_saved(model, options).predict(texts)))
    return runs[0], runs[1]


def _bars(saved: SavedModel, min_tags: float, min_labels: float) -> dict[str, float]:
    """Task -> the share of texts that must keep float32's label (classification) or tags (tagging)."""
    kinds = {task: saved.model.task(task).kind for task in saved.model.task_names}
    return {task: min_labels if kind == CLASSIFICATION else min_tags for task, kind in kinds.items()}


def _below(saved: SavedModel, agreement: dict[str, float], min_tags: float, min_labels: float) -> list[str]:
    """The tasks under their bar, each with its numbers."""
    out = []
    for task, share in agreement.items():
        bar = min_labels if saved.model.task(task).kind == CLASSIFICATION else min_tags
        if share < bar:
            what = "labels" if saved.model.task(task).kind == CLASSIFICATION else "tag sequences"
            out.append(f"{task}: {share:.2%} of {what} identical, under {bar:.0%}")
    return out
