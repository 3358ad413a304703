"""A saved native model as an ONNX graph that ``predict`` and ``evaluate`` run with ``--engine onnx``:

    mtl-decoder export --format onnx --model RUN/best --output DIR [--force]

writes DIR as a copy of the model folder's files plus ``model.onnx`` (``inference/onnx_graph.DenseGraph`` through
``torch.onnx.export``, dynamic batch, length and word axes) and ``onnx.json`` (the weights' SHA-256 and the parity).

Parity, before anything is written: the model's validation texts are predicted twice by the same Predictor path,
once with the torch model and once with the graph on ONNX Runtime; per task, the share of texts whose tags (or
label) are identical and the largest difference of a probability (classification: the label probabilities;
tagging: each real token's tag softmax). Below ``min_agreement`` identical or above ``max_prob_diff`` the export is
refused with the numbers.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mtl_decoder.config import CLASSIFICATION
from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_json, replace_dir, temporary_sibling
from mtl_decoder.hashing import sha256_file
from mtl_decoder.inference.onnx_engine import ONNX_FILE, ONNX_INFO, OnnxForward, require
from mtl_decoder.inference.onnx_graph import DenseGraph, check_exportable, example_inputs, gate_names
from mtl_decoder.inference.predictor import Predictor
from mtl_decoder.saved import TRUNK_FILE, WEIGHTS_FILE, SavedModel, load_model
from mtl_decoder.termination import shielded

MIN_AGREEMENT = 0.99
"""Share of validation texts per task whose tags / label must be identical to the torch model's."""
MAX_PROB_DIFF = 1e-4
"""Largest difference of a probability from the torch model's that the export accepts."""
OPSET = 18
DYNAMIC = {"input_ids": ("batch", "length"), "attention_mask": ("batch", "length"), "token_word": ("batch", "length")}
"""Dynamic axes of each graph input; the per-word features' first axis is the batch's distinct words."""


@dataclass
class TaskParity:
    task: str
    texts: int
    """Validation texts compared."""
    identical: float
    """Share of them whose tags (tagging) or label (classification) are those of the torch model."""
    max_prob_diff: float
    """Largest |p_onnx - p_torch| over every probability compared."""

    def describe(self) -> str:
        same = f"{self.identical:.2%} of {self.texts} texts identical"
        return f"{self.task}: {same}, max probability diff {self.max_prob_diff:.2e}"


@dataclass
class OnnxExportResult:
    directory: Path
    parity: list[TaskParity]

    def report(self) -> str:
        lines = [
            f"wrote {self.directory} ({ONNX_FILE}: predict or evaluate with --model {self.directory} --engine onnx)"
        ]
        return "\n".join(lines + [f"parity {p.describe()}" for p in self.parity])


def export_onnx(
    model_dir: str | Path,
    output: str | Path,
    force: bool = False,
    min_agreement: float = MIN_AGREEMENT,
    max_prob_diff: float = MAX_PROB_DIFF,
) -> OnnxExportResult:
    """Export a native model and its ONNX graph.

    Write the native model of ``model_dir`` and its ONNX graph to ``output`` after a parity check on its validation
    texts (refused with the numbers when it fails); an existing ``output`` is replaced only with ``force``."""
    from mtl_decoder.export import MARKER, check_export_output

    output = Path(output)
    check_export_output(output, model_dir, force)
    require("onnxscript", "export --format onnx")
    require("onnx", "export --format onnx")
    require("onnxruntime", "export --format onnx")
    if (Path(model_dir) / TRUNK_FILE).exists():  # before loading it: a pretrained trunk can be large
        check_exportable(None, str(model_dir))
    saved = load_model(model_dir, device="cpu")
    check_exportable(saved.model, str(model_dir))
    texts = validation_texts(saved)
    tmp = temporary_sibling(output)
    tmp.mkdir(parents=True)
    try:
        for path in Path(model_dir).iterdir():  # the saved model's own files: the folder loads as a model too
            if path.is_file() and path.name not in (ONNX_FILE, ONNX_INFO):
                shutil.copy2(path, tmp / path.name)
        write_graph(saved, tmp / ONNX_FILE)
        parity = measure_parity(saved, OnnxForward(saved.model, tmp / ONNX_FILE), texts)
        failed = [p for p in parity if p.identical < min_agreement or p.max_prob_diff > max_prob_diff]
        if failed:
            raise UserError(
                f"export --format onnx: the ONNX graph of {model_dir} disagrees with the torch model on its validation "
                f"texts ({'; '.join(p.describe() for p in failed)}; needed: at least {min_agreement:.0%} identical and "
                f"probabilities within {max_prob_diff:g}); nothing written"
            )
        info = {
            "weights_sha256": sha256_file(tmp / WEIGHTS_FILE),
            "opset": OPSET,
            "torch": torch.__version__,
            "parity": {
                "min_agreement": min_agreement,
                "max_prob_diff": max_prob_diff,
                "tasks": [asdict(p) for p in parity],
            },
        }
        atomic_write_json(tmp / ONNX_INFO, info)
        atomic_write_json(tmp / MARKER, {"created_by": "mtl-decoder export --format onnx", "model": str(model_dir)})
        replace_dir(tmp, output)
    finally:
        with shielded():
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return OnnxExportResult(output, parity)


def validation_texts(saved: SavedModel) -> list[list[str] | str]:
    """Every input of the model's validation split, each task's file in turn (a UserError when there is none)."""
    from mtl_decoder.data.tasks import load_split

    cfg = saved.config
    sources = load_split(dict(cfg.tasks), "validation", None, repair_iob=cfg.data.repair_iob)
    texts = [ex.words if ex.words is not None else ex.text for s in sources for ex in s.examples]
    if not texts:
        raise UserError(
            f"{saved.directory}: its tasks have no validation data to check the ONNX graph against (data.validation)"
        )
    return texts


def write_graph(saved: SavedModel, path: Path) -> None:
    """``DenseGraph`` of the saved model as an ONNX file with dynamic batch, length and word axes."""
    from mtl_decoder.data.batching import collator_for

    model = saved.model.eval()
    graph = DenseGraph(model).eval()
    inputs = example_inputs(graph, saved.encoder, collator_for(model.cfg, saved.encoder.pad_id, {}))
    dims = {"batch": torch.export.Dim.AUTO, "length": torch.export.Dim.AUTO, "words": torch.export.Dim.AUTO}
    shapes = {name: {axis: dims[d] for axis, d in enumerate(DYNAMIC.get(name, ("words",)))} for name in inputs}
    outputs = [f"logits.{t}" for t in model.task_names] + [f"gates.{i}.{r}" for i, r in gate_names(model)]
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the exporter's notes on torchvision's operators and its own deprecations
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                graph,
                (),
                kwargs=inputs,
                input_names=list(inputs),
                output_names=outputs,
                dynamic_shapes=shapes,
                opset_version=OPSET,
                dynamo=True,
                verbose=False,
            )
    finally:
        logger.setLevel(level)
    program.save(str(path))


def measure_parity(saved: SavedModel, engine: OnnxForward, texts: list[list[str] | str]) -> list[TaskParity]:
    """Per task: ``texts`` predicted by the torch model and by ``engine`` through the same Predictor path, compared."""
    batch_size = saved.config.data.eval_batch_size
    runs = []
    for forward in (None, engine):
        predictor = Predictor(saved.model, saved.encoder, saved.label_sets, batch_size, workers=1, forward=forward)
        probs: dict[str, list[torch.Tensor]] = {t: [] for t in saved.model.task_names}

        def keep(out, batch, probs=probs) -> None:
            for task, logits in out.logits.items():
                p = logits.float().softmax(-1)
                if p.dim() == 3:  # tagging: the real tokens' tag distributions
                    p = p[batch["attention_mask"][out.examples[task]].bool()]
                probs[task].append(p.reshape(-1).cpu())

        preds = list(predictor.predict(texts, on_batch=keep))
        runs.append((preds, {t: torch.cat(v) if v else torch.zeros(0) for t, v in probs.items()}))
    (torch_preds, torch_probs), (onnx_preds, onnx_probs) = runs
    out = []
    for task in saved.model.task_names:
        classify = saved.model.task(task).kind == CLASSIFICATION
        same = [
            (a.labels.get(task) == b.labels.get(task)) if classify else (a.tags.get(task) == b.tags.get(task))
            for a, b in zip(torch_preds, onnx_preds, strict=True)
        ]
        diff = (torch_probs[task] - onnx_probs[task]).abs().max().item() if len(torch_probs[task]) else 0.0
        out.append(TaskParity(task, len(same), sum(same) / len(same), diff))
    return out
