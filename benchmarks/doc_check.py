"""Check README.md and docs/ against benchmarks/results, or render their tables again.

    python benchmarks/doc_check.py            # say which tables or figures differ from the result files
    python benchmarks/doc_check.py --write    # re-render every marked table in place (after a result file changed)

Three markers, explicit in the markdown source and invisible when it is rendered:

- **Tables** sit between ``<!-- table: NAME -->`` and ``<!-- /table -->`` and must equal ``doc_tables.TABLES[NAME]``'s
  rendering.
- **Generated blocks** sit between ``<!-- generated: MODULE.FUNCTION [FILE] -->`` and ``<!-- /generated -->`` and must
  equal what ``benchmarks/MODULE.py``'s FUNCTION returns, given the loaded ``benchmarks/results/FILE`` if named (for a
  page whose tables a benchmark's own report renders).
- **Figures in prose** are followed by their source expression (``doc_sources.py``), e.g.
  ``0.855<!-- {quality.json runs.smollm2_frozen_ple.metrics.test.conll2003.f1} -->`` or
  ``1.7<!-- 100 * ({quality.json runs.a.x} - {quality.json runs.b.x}) -->``, and must equal its value rounded to the
  digits printed. A decimal, ``Nx`` or ``N%`` outside code, backticks, tables and generated blocks that carries no
  source is an error.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import doc_sources
from doc_tables import TABLES, render

REPO = doc_sources.REPO


def doc_files() -> list[Path]:
    """README.md, every page of docs/ and benchmarks/README.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]


BLOCK = re.compile(
    r"(?P<open><!-- (?P<kind>table|generated): (?P<spec>[^\n]*?) -->)\n(?P<body>.*?)(?P<close><!-- /(?P=kind) -->)",
    re.S,
)
# A figure with its source: the number (sign, thousands commas, decimals), an optional x or %, the comment.
SOURCED = re.compile(r"(?P<num>[+\-−]?\d[\d,]*(?:\.\d+)?)(?P<unit>x|%)?<!--(?P<expr>.*?)-->", re.S)
# What counts as a measured figure in prose: a decimal, a ratio (Nx) or a share (N%).
FIGURE = re.compile(r"(?<![\w.\-/])[+\-−]?\d[\d,]*(?:\.\d+(?:x|%)?|x|%)(?![\w])")
# Numbers that are names, not measurements: versions, and sections of a paper.
NOT_A_FIGURE = re.compile(r"(spaCy|PyTorch|torch|Python|CUDA|transformers|Accelerate|peft|[Ss]ections?|§) ?=*$")


def blocks_in(text: str) -> Iterator[tuple[str, str, str]]:
    """(kind, spec, body) of every marked table and generated block of a doc."""
    for m in BLOCK.finditer(text):
        yield m["kind"], m["spec"], m["body"].removesuffix("\n")


def tables_in(text: str) -> Iterator[tuple[str, str]]:
    """(name, body) of every marked table of a doc."""
    for kind, spec, body in blocks_in(text):
        if kind == "table":
            yield spec, body


def expected(kind: str, spec: str) -> str:
    """What a block must hold: the table rendered, or what the generating function returns (LookupError if unknown)."""
    if kind == "table":
        if spec not in TABLES:
            raise LookupError(f"table {spec!r} is not one of {sorted(TABLES)}")
        return render(TABLES[spec]())
    function, *file = spec.split()
    module, _, name = function.rpartition(".")
    if not (REPO / "benchmarks" / f"{module}.py").is_file():
        raise LookupError(f"generated block {spec!r}: no benchmarks/{module}.py")
    make = getattr(importlib.import_module(module), name)
    try:
        return str(make(*(doc_sources.load(f) for f in file))).strip("\n")
    except Exception as exc:  # the generator's own failure, reported with the block it renders
        raise LookupError(f"generated block {spec!r}: {type(exc).__name__}: {exc}") from exc


def rewrite(text: str) -> str:
    """The doc with every block rendered again (one whose result file is missing is left as it is)."""

    def again(m: re.Match) -> str:
        try:
            return f"{m['open']}\n{expected(m['kind'], m['spec'])}\n{m['close']}"
        except LookupError:  # reported by block_errors
            return m[0]

    return BLOCK.sub(again, text)


def block_errors(path: Path) -> list[str]:
    """Every marked table or generated block of a doc that differs from what the result files give."""
    errors = []
    for kind, spec, body in blocks_in(path.read_text()):
        try:
            want = expected(kind, spec)
        except LookupError as exc:
            errors.append(f"{path.relative_to(REPO)}: {exc}")
            continue
        if body != want:
            errors.append(
                f"{path.relative_to(REPO)}: {kind} {spec!r} differs from the result files "
                "(python benchmarks/doc_check.py --write)"
            )
    return errors


def prose(text: str) -> str:
    """TEXT with code blocks, marked blocks and inline code blanked (same length, lines kept)."""

    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m[0])

    text = re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)
    text = BLOCK.sub(blank, text)
    return re.sub(r"`[^`\n]*`", blank, text)


def figure_errors(path: Path) -> list[str]:
    """Every prose figure of a doc whose source disagrees with it, names nothing, or is missing."""
    text = path.read_text()

    def where(pos: int) -> str:
        return f"{path.relative_to(REPO)}:{text.count(chr(10), 0, pos) + 1}"

    errors = []
    visible = prose(text)
    sourced_at = set()
    for m in SOURCED.finditer(text):
        if visible[m.start("num")] == " ":  # inside code or a block: not prose
            continue
        sourced_at.add(m.start("num"))
        try:
            value = doc_sources.evaluate_source(m["expr"])
        except (LookupError, ValueError, SyntaxError, TypeError, ZeroDivisionError) as exc:
            errors.append(f"{where(m.start())}: {m['num']}{m['unit'] or ''}: {exc}")
            continue
        if not doc_sources.printed_matches(m["num"], value):
            errors.append(f"{where(m.start())}: {m['num']}{m['unit'] or ''} printed, the source gives {value!r}")
    uncommented = re.sub(r"<!--.*?-->", lambda c: " " * len(c[0]), visible, flags=re.S)
    for m in FIGURE.finditer(uncommented):
        if m.start() in sourced_at or NOT_A_FIGURE.search(visible[max(0, m.start() - 16) : m.start()]):
            continue
        errors.append(f"{where(m.start())}: {m[0]} has no source (follow it with <!-- {{FILE PATH}} -->)")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="render every marked table and block again, in place")
    args = parser.parse_args(argv)
    errors = []
    for path in doc_files():
        if args.write:
            text = path.read_text()
            new = rewrite(text)
            if new != text:
                path.write_text(new)
                print(f"rendered the tables of {path.relative_to(REPO)}")
        errors += block_errors(path) + figure_errors(path)
    print("\n".join(errors) or "every table and figure matches benchmarks/results")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
