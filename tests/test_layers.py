"""The package's layers only look down: a module imports (at module level or inside a function) only modules of its
own package or of a package below it in LAYERS, and never a private name of another package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mtl_decoder"

LAYERS = [
    "errors",  # user errors
    "paths",  # what a path is and may be
    "runtime",  # the default device
    "locks",
    "hashing",  # file, tensor and config fingerprints; cache roots
    "termination",  # SIGTERM as an exception, clean-ups shielded from it
    "files",  # atomic writes, staged folders
    "tensorstore",  # sharded safetensors stores (state cache, distillation targets)
    "processes",  # launcher processes
    "config",
    "data",
    "model",
    "model_card",
    "saved",  # model folders
    "export",
    "inference",  # the engine that runs a model on words and texts
    "export_onnx",  # export --format onnx: the graph, checked against the engine
    "quantize",  # quantize: W8A8 scales, checked against float32 through the engine
    "evaluation",
    "prediction",  # file-level jobs over the engine
    "training",
    "distill",
    "diagnostics",
    "commands",
    "cli",
    "__main__",
]
"""Bottom to top: the first unit of each module path below mtl_decoder (a sub-package or a top-level module)."""


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) of every import of the package in ``path``, lazy ones included."""
    out = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("mtl_decoder")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base == "mtl_decoder":  # from mtl_decoder import paths: the names are the modules
                out += [(f"mtl_decoder.{a.name}", [], node.lineno) for a in node.names]
            elif base.startswith("mtl_decoder"):
                out.append((base, [a.name for a in node.names], node.lineno))
    return out


def test_every_unit_has_a_layer():
    assert {unit(m) for m in modules()} - {"__init__"} <= set(LAYERS)


def test_modules_import_only_their_own_package_or_below_and_no_private_name_of_another():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward, private = [], []
    for module, path in modules().items():
        here = unit(module)
        if here == "__init__":  # the public API re-exports from every layer
            continue
        for target, names, line in imports(module, path):
            there = unit(target)
            if there == here:
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{line}"
            if there == "__init__" or rank[there] > rank[here]:
                upward.append(f"{where}: {here} imports {target}")
            private += [f"{where}: {n} from {target}" for n in names if n.startswith("_")]
    assert upward == []
    assert private == []
