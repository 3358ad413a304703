"""README.md and docs/ against the repository: every figure against benchmarks/results, every config key against
the schema, every command against the CLI's parser.

The figures: results tables sit between ``<!-- table: NAME -->`` markers and must equal what
``benchmarks/doc_tables.py`` renders from the result files; prose figures carry their source expression in a comment
(``benchmarks/doc_check.py`` describes both). The key and command checks read the docs directly.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import json
import re
import shlex
import types
import typing
from pathlib import Path

import pytest

from mtl_decoder.cli import build_parser
from mtl_decoder.config import ExperimentConfig, TaskConfig
from mtl_decoder.config.schema import DistillConfig

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]


doc_check = importlib.import_module("doc_check")
doc_sources = importlib.import_module("doc_sources")
doc_tables = importlib.import_module("doc_tables")


def doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


# ------------------------------------------------------------------------------------------ (a) the figures


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_results_tables_are_what_the_result_files_say(path):
    assert doc_check.block_errors(path) == []


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_prose_figures_match_their_sources(path):
    assert doc_check.figure_errors(path) == []


def test_every_marked_table_is_rendered_somewhere():
    used = {name for path in DOCS for name, _ in doc_check.tables_in(path.read_text())}
    assert used == set(doc_tables.TABLES), "a table the renderer knows is in no doc, or a doc names an unknown one"


def cells(text: str, name: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a marked table, split into cells."""
    body = dict(doc_check.tables_in(text))[name]
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines()]
    return lines[0], lines[2:]


@pytest.mark.parametrize(
    ("page", "table", "file"),
    [
        ("docs/benchmarks.md", "scratch", "quality.json"),
        ("docs/benchmarks.md", "rerun", "quality_rerun.json"),
        ("docs/benchmarks.md", "pretrained", "quality.json"),
    ],
)
def test_quality_cells_read_straight_from_the_json(page, table, file):
    """An independent reading of the quality tables: each metric cell is the run's metric to three decimals."""
    runs = json.loads((REPO / "benchmarks" / "results" / file).read_text())["runs"]
    header, rows = cells((REPO / page).read_text(), table)
    columns = {
        "CoNLL F1 val": ("validation", "conll2003", "f1"),
        "CoNLL F1 test": ("test", "conll2003", "f1"),
        "SST-2 acc val": ("validation", "sst2", "accuracy"),
        "SST-2 acc test": ("test", "sst2", "accuracy"),
    }
    assert rows
    for row in rows:
        name = row[0].strip("`†")
        for column, (split, task, key) in columns.items():
            metrics = runs[name]["metrics"][split]
            want = f"{metrics[task][key]:.3f}" if task in metrics else "–"
            assert row[header.index(column)] == want, (page, table, name, column)


def test_readme_summary_reads_straight_from_the_json():
    _, rows = cells((REPO / "README.md").read_text(), "summary")
    quality = json.loads((REPO / "benchmarks" / "results" / "quality.json").read_text())["runs"]
    test = quality["smollm2_frozen_ple"]["metrics"]["test"]
    assert rows[0][1:3] == [f"{test['conll2003']['f1']:.3f}", f"{test['sst2']['accuracy']:.3f}"]
    distilled = [r for r in rows if "distill_" in r[0]]
    at_defaults = [  # the sweeps of temperature or alpha stay in docs/distillation.md's table
        n
        for n, r in quality.items()
        if n.startswith("distill_")
        and (r["temperature"], r["alpha"]) == (DistillConfig().temperature, DistillConfig().alpha)
    ]
    states = json.loads((REPO / "benchmarks" / "results" / "quality_states.json").read_text())["runs"]
    recipes = ("distill_small_states_long_sent", "distill_small_states_sent_bidirteacher_lex_learned_6pass")
    featured = [n for n in recipes if n in states]  # the recipe files' rows, after them
    assert [r[0].split("`")[1] for r in distilled] == at_defaults + featured
    for row in distilled:
        name = row[0].split("`")[1]
        # the recipe's row is the mean over its seeds (NAME, NAME_seed1, ...); the others are one run each
        runs = [quality[name]] if name in quality else [r for n, r in states.items() if n.split("_seed")[0] == name]
        assert ("mean of" in row[0]) == (len(runs) > 1)
        assert row[1:4] == [
            f"{sum(r['metrics']['test']['conll2003']['f1'] for r in runs) / len(runs):.3f}",
            f"{sum(r['metrics']['test']['sst2']['accuracy'] for r in runs) / len(runs):.3f}",
            f"{sum(r['words_per_cpu_s'] for r in runs) / len(runs):,.0f}",
        ]


def test_a_changed_figure_or_result_is_caught(tmp_path, monkeypatch):
    text = (REPO / "docs" / "benchmarks.md").read_text()
    body = dict(doc_check.tables_in(text))["scratch"]
    assert "| 0.769 |" in body
    block = f"<!-- table: scratch -->\n{body}\n<!-- /table -->\n"
    monkeypatch.setattr(doc_check, "REPO", tmp_path)
    copy = tmp_path / "page.md"
    copy.write_text(block.replace("| 0.769 |", "| 0.768 |", 1))
    assert doc_check.block_errors(copy), "a figure changed in a table went unnoticed"
    copy.write_text(block)
    assert doc_check.block_errors(copy) == []

    original = doc_sources.load

    def changed(name: str):
        value = original(name)
        if name == "quality.json":
            value = json.loads(json.dumps(value))
            value["runs"]["ple"]["metrics"]["test"]["conll2003"]["f1"] += 0.01
        return value

    monkeypatch.setattr(doc_sources, "load", changed)
    assert doc_check.block_errors(copy), "a changed result file went unnoticed"


def test_a_generated_block_must_equal_its_generator(tmp_path, monkeypatch):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "toy_report.py").write_text(
        "def records(result):\n    return f\"| records |\\n| {result['records']:,} |\"\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "benchmarks"))
    monkeypatch.setattr(doc_check, "REPO", tmp_path)
    records = json.loads((REPO / "benchmarks" / "results" / "predict_scale.json").read_text())["records"]
    page = tmp_path / "page.md"
    block = "<!-- generated: toy_report.records predict_scale.json -->\n| records |\n| {} |\n<!-- /generated -->\n"
    page.write_text(block.format(f"{records:,}"))
    assert doc_check.block_errors(page) == []
    assert doc_check.figure_errors(page) == []  # a generated block is not prose
    page.write_text(block.format(f"{records + 1:,}"))
    assert doc_check.block_errors(page)
    page.write_text(block.replace("toy_report", "no_report").format(f"{records:,}"))
    assert "no benchmarks/no_report.py" in doc_check.block_errors(page)[0]


def test_prose_figures_need_the_right_source(tmp_path, monkeypatch):
    monkeypatch.setattr(doc_check, "REPO", tmp_path)
    page = tmp_path / "page.md"
    src = "{predict_scale.json speedup_2_processes_over_1_thread}"
    page.write_text(f"Two processes are 1.69x<!-- {src} --> faster; `0.5` is code.\n")
    assert doc_check.figure_errors(page) == []
    page.write_text(f"Two processes are 1.70x<!-- {src} --> faster.\n")
    assert "the source gives" in doc_check.figure_errors(page)[0]
    page.write_text("spaCy 3.8 (section 5.2 of the paper) is not a figure.\n")
    assert doc_check.figure_errors(page) == []
    page.write_text("Two processes are 1.69x faster and 98.0% agree.\n")
    assert len(doc_check.figure_errors(page)) == 2
    page.write_text("It is 1.7<!-- {predict_scale.json no_such_key} --> faster.\n")
    assert "no key" in doc_check.figure_errors(page)[0]


# ------------------------------------------------------------------------------------------ (b) config keys

SECTIONS = ("model", "tokenizer", "data", "training", "balancing", "evaluation", "distill")
KEY = re.compile(
    rf"(?<![\w./'-])(?:(?P<section>{'|'.join(SECTIONS)})|tasks\.[\w-]+\.(?P<task>[a-z_]+))"
    r"(?P<rest>(?:\.[a-z_][a-z0-9_]*)*)"
)
FILE_SUFFIXES = {"json", "jsonl", "yaml", "safetensors", "md", "py", "txt", "csv", "tsv", "onnx"}


def dataclass_of(tp) -> type | None:
    """The dataclass a field's type names, through ``X | None``."""
    if dataclasses.is_dataclass(tp):
        return tp
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        found = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        return found[0] if found else None
    return None


def key_exists(root: type, parts: list[str]) -> bool:
    cls: type | None = root
    for part in parts:
        if cls is None:
            return False  # a leaf (int, str, list) has no sub-keys
        hints = typing.get_type_hints(cls)
        if part not in {f.name for f in dataclasses.fields(cls)}:
            return False
        cls = dataclass_of(hints[part])
    return True


def config_keys(text: str) -> list[tuple[type, list[str], str]]:
    """(root dataclass, key path, as written) of every config key the text names."""
    found = []
    for m in KEY.finditer(text):
        rest = [p for p in m["rest"].split(".") if p]
        if rest and rest[-1] in FILE_SUFFIXES:
            continue  # a file name (data.json, model.safetensors)
        if m["section"]:
            if not rest:
                continue  # the section alone ("model.trunk." prefixes, prose)
            found.append((ExperimentConfig, [m["section"], *rest], m[0]))
        else:
            found.append((TaskConfig, [m["task"], *rest], m[0]))
    return found


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_config_keys_exist_in_the_schema(path):
    keys = config_keys(path.read_text())
    wrong = sorted({written for root, parts, written in keys if not key_exists(root, parts)})
    assert wrong == []


def test_the_key_check_catches_a_misspelled_key():
    keys = config_keys(
        "Set `model.trunk.read_layer` or `model.mlp_width`, `training.max_steps`, tasks.ner.data.train=x"
    )
    verdicts = {written: key_exists(root, parts) for root, parts, written in keys}
    assert verdicts == {
        "model.trunk.read_layer": False,
        "model.mlp_width": False,
        "training.max_steps": True,
        "tasks.ner.data.train": True,
    }


def test_the_docs_name_config_keys():
    assert sum(len(config_keys(p.read_text())) for p in DOCS) > 100


# ------------------------------------------------------------------------------------------ (c) commands

FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```", re.S | re.M)
SHELL = {"bash", "sh", "shell", "console"}


def shell_lines(text: str) -> list[str]:
    """The logical lines (continuations joined) of every shell code block."""
    lines = []
    for m in FENCE.finditer(text):
        if m["lang"] in SHELL:
            lines += m["body"].replace("\\\n", " ").splitlines()
    return lines


def placeholders_filled(line: str) -> str:
    """A usage line as a user would type it: each ``[--flag a|b]`` with its first choice, shell variables set."""

    def option(m: re.Match) -> str:
        return re.sub(r"(\S+?)\|\S+", r"\1", m[1])

    line = re.sub(r"\[([^\[\]]*)\]", option, line)
    line = re.sub(r"\$\{?\w+\}?", "0", line)
    return line


def cli_invocations(text: str) -> list[tuple[str, list[str]]]:
    """(the line, the arguments after the program) of every mtl-decoder command in the text's shell blocks."""
    found = []
    for line in shell_lines(text):
        try:
            words = shlex.split(placeholders_filled(line), comments=True)
        except ValueError as exc:
            raise AssertionError(f"unparsable shell line: {line}") from exc
        commands, current = [], []
        for w in words:  # split on the shell's command separators
            if w in ("|", "&&", ";", "||"):
                commands.append(current)
                current = []
            else:
                current.append(w)
        commands.append(current)
        for cmd in commands:
            cmd = [w for w in cmd if w != "..."]
            if "mtl-decoder" in cmd:
                found.append((line, cmd[cmd.index("mtl-decoder") + 1 :]))
            elif any(cmd[i : i + 2] == ["-m", "mtl_decoder"] for i in range(len(cmd))):
                at = next(i for i in range(len(cmd)) if cmd[i : i + 2] == ["-m", "mtl_decoder"])
                found.append((line, cmd[at + 2 :]))
    return found


def parse_error(argv: list[str]) -> str | None:
    """None when the CLI's parser accepts ARGV, else the error it prints."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        return err.getvalue().strip().splitlines()[-1] if exc.code else None
    return None


def subcommands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_documented_commands_parse(path):
    invocations = cli_invocations(path.read_text())
    bad = [(line, parse_error(argv)) for line, argv in invocations if parse_error(argv)]
    assert bad == []


def test_every_subcommand_is_documented():
    documented = {argv[0] for p in DOCS for _, argv in cli_invocations(p.read_text()) if argv}
    assert documented == subcommands()


def test_the_command_check_catches_a_bad_flag():
    text = "```bash\nmtl-decoder predict --model M --input x.txt --output o.jsonl --bogus 3   # a comment\n```\n"
    ((_, argv),) = cli_invocations(text)
    assert "--bogus" in parse_error(argv)
    text = (
        "```bash\naccelerate launch --num_processes 2 -m mtl_decoder evaluate --model M [--precision bf16|int8] \\\n"
        "    --split test\ntail -f x | mtl-decoder predict --model M --stream --input - --output -\n```\n"
    )
    assert [parse_error(argv) for _, argv in cli_invocations(text)] == [None, None]
    assert parse_error(["evaluate", "--model", "M", "--precision", "int4"])


def test_the_readme_holds_the_commands_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    for command in ("pip install torch==2.13.0", "pip install -e '.[dev]'", "python -m pytest"):
        assert command in ci and command in readme


def test_readme_is_a_guide():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


# ------------------------------------------------------------------------------------------ links

LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(m[1]) for m in re.finditer(r"^#+ (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_links_reach_a_file_and_heading(path):
    broken = []
    for m in LINK.finditer(path.read_text()):
        target = m["target"]
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)):
            broken.append(target)
    assert broken == []
