"""The gate table: cached gate weights read instead of running the gates.

The gate table: an opt-in inference mode that reads cached gate weights instead of running the gates, and skips
the experts those weights leave under a threshold.

``build_gate_table`` (in ``gate_build.py``: it runs a Predictor, which this module's readers must not import)
runs a trained model over a sample of inputs and records, for every layer and gate, the norm
of each token's gate input (the normed residual stream the gate reads) and the gate's weights. Tokens are put in
``buckets`` buckets of equal count by that norm; each bucket keeps its mean weights. ``apply_gate_table``
(``gate_apply.py``) then makes every expert block, per token:

1. look its gate input's norm up in the buckets and take the bucket's mean weights, except near a bucket edge
   (within ``edge_margin`` of the bucket's width from an inner edge) or outside the norms seen in the sample, where
   the real gate runs (``edge_margin`` 0.5: every token's real gate, so that only step 2 approximates);
2. drop the experts whose weight is under ``threshold`` (the token's top expert always stays) and renormalise;
3. run each expert only on the tokens that still read it.

A gate is one small linear layer and a softmax over a handful of experts, so replacing it saves next to nothing:
any saving comes from step 3. Whether it is worth it depends on how peaked the gates are; see benchmarks/gate_table.py
and docs/diagnostics.md for what it gave here. It is off unless asked for (``predict --gate-table``).

A table is two files: TABLE.safetensors (edges, means, counts and norm range of every gate) and TABLE.json (the
settings, the expert names, the sample, and the SHA-256 of the model's weights it was built from, checked when it is
applied). Neither is ever unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mtl_decoder.config import SHARED
from mtl_decoder.errors import UserError
from mtl_decoder.files import atomic_write_json, atomic_write_safetensors
from mtl_decoder.hashing import sha256_file
from mtl_decoder.model import ExpertBlock, Gate
from mtl_decoder.saved import WEIGHTS_FILE, SavedModel

FORMAT = 1
KIND = "mtl-decoder gate table"
DEFAULT_BUCKETS = 16
DEFAULT_THRESHOLD = 0.1
DEFAULT_EDGE_MARGIN = 0.1


@dataclass
class GateEntry:
    """One gate of one layer: buckets of its input norm and each bucket's mean weights."""

    edges: torch.Tensor
    """(K-1,) inner bucket edges, ascending (bucket b holds norms in (edges[b-1], edges[b]])."""
    low: float
    """The smallest and largest norm seen in the sample: outside them the real gate runs."""
    high: float
    means: torch.Tensor
    """(K, E) each bucket's mean gate weights."""
    counts: torch.Tensor
    """(K,) sample tokens per bucket."""
    experts: list[str]


@dataclass
class GateStats:
    """What a table did at inference (counted since ``apply_gate_table``)."""

    tokens: int = 0
    """Gate rows looked up (a token counts once per gate that reads it)."""
    full_gates: int = 0
    """Of those, rows whose real gate ran (near a bucket edge or outside the sample's norms)."""
    expert_rows: int = 0
    """(token, expert) evaluations the exact block would run."""
    expert_rows_run: int = 0
    """Of those, the ones run."""

    @property
    def skipped_share(self) -> float:
        return 1 - self.expert_rows_run / self.expert_rows if self.expert_rows else 0.0

    @property
    def full_gate_share(self) -> float:
        return self.full_gates / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "full_gates": self.full_gates,
            "full_gate_share": self.full_gate_share,
            "expert_rows": self.expert_rows,
            "expert_rows_run": self.expert_rows_run,
            "skipped_share": self.skipped_share,
        }


@dataclass
class GateTable:
    entries: dict[tuple[int, str], GateEntry]
    buckets: int
    threshold: float
    edge_margin: float
    weights_sha256: str | None = None
    sample: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ files

    def save(self, path: str | Path) -> tuple[Path, Path]:
        tensors_path, meta_path = table_paths(path)
        tensors: dict[str, torch.Tensor] = {}
        gates = []
        for (layer, gate), entry in sorted(self.entries.items()):
            key = f"layer{layer}.{gate}"
            tensors[f"{key}.edges"] = entry.edges.float().contiguous()
            tensors[f"{key}.means"] = entry.means.float().contiguous()
            tensors[f"{key}.counts"] = entry.counts.to(torch.int64).contiguous()
            tensors[f"{key}.range"] = torch.tensor([entry.low, entry.high], dtype=torch.float32)
            gates.append({"layer": layer, "gate": gate, "experts": entry.experts, "tokens": int(entry.counts.sum())})
        tensors_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_safetensors(tensors_path, tensors, metadata={"format": str(FORMAT), "kind": KIND})
        meta = {
            "kind": KIND,
            "format": FORMAT,
            "buckets": self.buckets,
            "threshold": self.threshold,
            "edge_margin": self.edge_margin,
            "weights_sha256": self.weights_sha256,
            "sample": self.sample,
            "gates": gates,
        }
        atomic_write_json(meta_path, meta)
        return tensors_path, meta_path

    @classmethod
    def load(cls, path: str | Path) -> GateTable:
        tensors_path, meta_path = table_paths(path)
        for p in (tensors_path, meta_path):
            if not p.is_file():
                raise UserError(
                    f"{p}: no such file (a gate table is TABLE.safetensors + TABLE.json, written by "
                    "mtl-decoder build-gate-table)"
                )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            tensors = load_file(str(tensors_path))
        except (OSError, ValueError, json.JSONDecodeError) as err:
            raise UserError(f"{path}: not a readable gate table ({err}); build it again") from None
        if not isinstance(meta, dict) or meta.get("kind") != KIND or meta.get("format") != FORMAT:
            raise UserError(f"{meta_path}: not a gate table of format {FORMAT}; build it again")
        entries = {}
        try:
            for gate in meta["gates"]:
                key = f"layer{gate['layer']}.{gate['gate']}"
                low, high = tensors[f"{key}.range"].tolist()
                entries[(int(gate["layer"]), str(gate["gate"]))] = GateEntry(
                    tensors[f"{key}.edges"],
                    low,
                    high,
                    tensors[f"{key}.means"],
                    tensors[f"{key}.counts"],
                    list(gate["experts"]),
                )
            return cls(
                entries,
                int(meta["buckets"]),
                float(meta["threshold"]),
                float(meta["edge_margin"]),
                meta.get("weights_sha256"),
                dict(meta.get("sample") or {}),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(
                f"{path}: the gate table is incomplete ({err!r} missing or wrong); build it again"
            ) from None


def table_paths(path: str | Path) -> tuple[Path, Path]:
    """TABLE.safetensors and TABLE.json for TABLE given with either suffix or none."""
    path = Path(path)
    if path.suffix in (".safetensors", ".json"):
        path = path.with_suffix("")
    return path.with_name(path.name + ".safetensors"), path.with_name(path.name + ".json")


def weights_sha256(saved: SavedModel) -> str | None:
    """The SHA-256 of the saved model's weights file (None: a model not loaded from a folder with one)."""
    path = Path(saved.directory) / WEIGHTS_FILE
    return sha256_file(path) if path.is_file() else None


# ------------------------------------------------------------------------------------------ building


def gates_of(model) -> list[tuple[int, str, Gate, ExpertBlock]]:
    out = []
    for layer, block in enumerate(model.expert_blocks()):
        if block is None:
            continue
        for name, gate in block.task_gates.items():
            out.append((layer, name, gate, block))
        if block.shared_gate is not None:
            out.append((layer, SHARED, block.shared_gate, block))
    return out


def check_settings(buckets: int, threshold: float, edge_margin: float) -> None:
    if not isinstance(buckets, int) or buckets < 1:
        raise UserError(f"--buckets must be a positive integer, got {buckets!r}")
    if not 0.0 <= threshold < 1.0:
        raise UserError(f"--threshold must lie in [0, 1) (a gate weight), got {threshold}")
    if not 0.0 <= edge_margin <= 0.5:
        raise UserError(f"--edge-margin must lie in [0, 0.5] (a share of a bucket's width), got {edge_margin}")
