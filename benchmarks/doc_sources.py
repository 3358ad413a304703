"""Values of benchmarks/results/*.json for the docs: looked up by path, formatted as printed, combined by a source
expression, and compared with a printed figure.

A source expression (what follows a prose figure in ``<!-- ... -->``, see ``doc_check.py``) combines ``{FILE PATH}``
references, numbers, ``+ - * /``, ``min``, ``max`` and ``abs``. A reference is a value in ``benchmarks/results/FILE``;
PATH is keys joined by dots, ``[k=v]`` picks the list element whose ``k`` is ``v`` and ``[N]`` the N-th, e.g.
``{quality.json runs.ple.metrics.test.conll2003.f1}`` or ``{pretrained_throughput.json entries[name=x].blocks}``.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
DASH = "–"
REF = re.compile(r"\{(?P<file>[\w.-]+\.json) (?P<path>[^{}]+)\}")
BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
FUNCS = {"min": min, "max": max, "abs": abs}


@cache
def load(name: str) -> Any:
    path = RESULTS / name
    if not path.is_file():
        raise LookupError(f"benchmarks/results/{name}: no such result file")
    return json.loads(path.read_text())


def lookup(name: str, path: str) -> Any:
    """The value at PATH (``a.b[k=v].c``) in benchmarks/results/NAME."""
    value = load(name)
    for seg in re.findall(r"\[[^\]]*\]|[^.\[]+", path):
        if seg.startswith("[") and seg[1:-1].isdigit():
            if not isinstance(value, list) or int(seg[1:-1]) >= len(value):
                raise LookupError(f"{name}: {path}: no element {seg}")
            value = value[int(seg[1:-1])]
        elif seg.startswith("["):
            key, _, want = seg[1:-1].partition("=")
            hits = [v for v in value if isinstance(v, dict) and str(v.get(key)) == want]
            if len(hits) != 1:
                raise LookupError(f"{name}: {path}: {len(hits)} elements with {key} = {want!r}")
            value = hits[0]
        elif isinstance(value, dict) and seg in value:
            value = value[seg]
        else:
            raise LookupError(f"{name}: {path}: no key {seg!r}")
    return value


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure as the docs print it: thousands separated by commas, DASH for a missing value."""
    return DASH if value is None else f"{value:,.{digits}f}"


def evaluate_source(expr: str) -> float:
    """The value of a figure's source expression (see the module docstring)."""
    values: list[float] = []

    def ref(m: re.Match) -> str:
        values.append(float(lookup(m["file"], m["path"].strip())))
        return f"_v{len(values) - 1}"

    code = REF.sub(ref, expr.strip())
    if not values:
        raise LookupError(f"source {expr.strip()!r} names no {{FILE PATH}} value")

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name) and node.id.startswith("_v"):
            return values[int(node.id[2:])]
        if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
            return BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCS:
            return FUNCS[node.func.id](*(ev(a) for a in node.args))
        raise ValueError(f"source {expr.strip()!r}: only numbers, + - * /, min, max, abs and {{FILE PATH}} values")

    return ev(ast.parse(code, mode="eval"))


def printed_matches(printed: str, value: float) -> bool:
    """Whether PRINTED (as the doc shows it) is VALUE rounded to the digits printed."""
    digits = printed.replace(",", "").replace("−", "-")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    shown = f"{value:+.{decimals}f}" if digits[0] in "+-" else f"{abs(value):.{decimals}f}"
    if digits[0] not in "+-" and value < 0:
        return False
    return shown == digits or (shown.lstrip("+-") == digits.lstrip("+-") and float(digits) == 0)
