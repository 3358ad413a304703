"""ONNX Runtime as the engine of a Predictor: the exported graph stands where the torch model's forward is called.

A folder written by ``mtl-decoder export --format onnx`` is a complete saved model (config, weights, tokenizer,
labels) plus ``model.onnx``, the native model's graph (``onnx_graph.DenseGraph``), and ``onnx.json``, the export's
record: the SHA-256 of the weights the graph was made from and the parity measured at export. ``OnnxForward`` takes
the collator's batch and returns the ``MTLOutput`` the torch model would (each task's logits for every example,
each expert layer's gate weights over the real tokens, the route layout), so the Predictor's tokenisation, windows,
CRF or softmax decoding and writing are the same code whichever engine runs.

onnxruntime is an optional dependency (``pip install 'mtl-decoder[onnx]'``), imported only when an ONNX engine is
made. The session runs on the CPU with one intra-op thread: the Predictor's workers run batches side by side.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mtl_decoder.errors import UserError
from mtl_decoder.inference.options import ENGINES
from mtl_decoder.model.heads import MTLOutput

ONNX_FILE = "model.onnx"
ONNX_INFO = "onnx.json"
INSTALL = "pip install 'mtl-decoder[onnx]'"


def require(module: str, what: str) -> Any:
    """``import module``, or a one-line UserError saying how to install the optional ONNX dependencies."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{what} needs the optional package {module}: {INSTALL}") from None


def engine_forward(saved: Any, engine: str, precision: str) -> Callable[..., MTLOutput] | None:
    """What a Predictor calls in place of the model for an engine.

    What a Predictor calls in place of the model for ``engine``: None for torch (the model itself), an
    ``OnnxForward`` of the saved folder's exported graph for onnx."""
    if engine not in ENGINES:
        raise UserError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "torch":
        return None
    if precision != "fp32":
        raise UserError(f"--engine onnx runs the exported fp32 graph: leave --precision at fp32 (got {precision})")
    if any(b is not None and "forward" in b.__dict__ for b in saved.model.expert_blocks()):
        raise UserError("--engine onnx runs the exported graph with its exact gates: leave out --gate-table")
    return OnnxForward.from_folder(saved.model, Path(saved.directory))


class OnnxForward:
    """The exported graph of ``model`` on an ONNX Runtime CPU session, called as the model's forward is."""

    def __init__(self, model: torch.nn.Module, path: Path):
        from mtl_decoder.inference.onnx_graph import gate_names

        ort = require("onnxruntime", "--engine onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own exception types for unreadable files
            raise UserError(f"{path}: not a graph ONNX Runtime can load ({str(err).splitlines()[0]})") from None
        self.model = model
        self.inputs = {i.name: i.type for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        expected = [f"logits.{t}" for t in model.task_names] + [f"gates.{i}.{r}" for i, r in gate_names(model)]
        if self.outputs != expected:
            raise UserError(
                f"{path}: its outputs are not this model's ({', '.join(self.outputs[:4])}...): export again"
            )

    @classmethod
    def from_folder(cls, model: torch.nn.Module, directory: Path) -> OnnxForward:
        """The engine of an exported folder, checked to be the graph of the folder's own weights."""
        from mtl_decoder.hashing import sha256_file
        from mtl_decoder.saved import WEIGHTS_FILE

        path, info_path = directory / ONNX_FILE, directory / ONNX_INFO
        if not path.is_file() or not info_path.is_file():
            raise UserError(
                f"{directory}: no {ONNX_FILE} and {ONNX_INFO} (--engine onnx): write them with "
                f"'mtl-decoder export --format onnx --model {directory} --output DIR' and predict with --model DIR"
            )
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            weights = info["weights_sha256"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise UserError(f"{info_path}: not an export record (no weights_sha256): export again") from None
        if sha256_file(directory / WEIGHTS_FILE) != weights:
            raise UserError(
                f"{path}: made from other weights than {directory / WEIGHTS_FILE} (weights_sha256 in {ONNX_INFO} "
                "differs): export the model again"
            )
        return cls(model, path)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        tasks: list[str] | None = None,
        **batch: Any,
    ) -> MTLOutput:
        """Run the exported graph as ``MultiTaskModel.forward`` without labels.

        ``MultiTaskModel.forward`` without labels: ``tasks``' logits for every example, and the gates of the
        routes the torch model would run for them (over the real tokens, in its packed order)."""
        device = input_ids.device
        given = {"input_ids": input_ids, "attention_mask": attention_mask, **batch}
        feeds = {name: _numpy(given[name], kind) for name, kind in self.inputs.items()}
        values = dict(zip(self.outputs, self.session.run(None, feeds), strict=True))
        tasks = list(tasks or self.model.task_names)
        mask = attention_mask.bool()
        layout = self.model.route_layout(mask, tasks, None)
        examples = torch.arange(input_ids.shape[0], device=device)
        out = MTLOutput(
            logits={t: torch.from_numpy(values[f"logits.{t}"]).to(device) for t in tasks},
            examples=dict.fromkeys(tasks, examples),
            gates=[{} for _ in self.model.expert_blocks()],
            layout=layout,
        )
        real = mask.reshape(-1).cpu().numpy()  # the dense graph's gate rows are every position, row-major
        for name, value in values.items():
            if name.startswith("gates."):
                _, layer, route = name.split(".", 2)
                if route in layout.names:
                    out.gates[int(layer)][route] = torch.from_numpy(value[real]).to(device)
        return out


def _numpy(tensor: torch.Tensor, kind: str) -> Any:
    """A batch tensor as the graph input of ONNX type ``kind`` (tensor(bool), tensor(int64), ...)."""
    if kind == "tensor(bool)":
        tensor = tensor.bool()
    elif kind == "tensor(int64)":
        tensor = tensor.long()
    return tensor.detach().cpu().numpy()
