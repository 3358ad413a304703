"""What every peer script shares: the data it reads, the scorer it is judged by, and the results file it writes.

The peers are scored by the project's own metric functions (mtl_decoder.evaluation.metrics: seqeval's default,
conlleval-compatible entity F1 as ``f1``, strict IOB2 as ``f1_strict``; scikit-learn accuracy and macro-F1), so a
peer's figure and a model's figure in benchmarks/results/quality.json are the same number computed the same way.
SemEval-2014 has no validation split: the peers carve it from train with benchmarks/quality.py's carve_semeval (the
same 10% and seed as the project's semeval rows), train on the other 90% and report test.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtl_decoder.errors import DataError
from mtl_decoder.files import atomic_write_text

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results" / "peers.json"
if str(BENCHMARKS) not in sys.path:  # quality.py and spacy_throughput.py live beside this folder
    sys.path.insert(0, str(BENCHMARKS))

Tagged = tuple[list[list[str]], list[list[str]]]
"""(token lists, IOB2 tag lists) of one split."""
Labelled = tuple[list[str], list[str]]
"""(texts, labels) of one split."""


def default_data_root() -> Path:
    """../shared/data beside the checkout, or beside the folder of worktrees that holds it."""
    for root in (REPO.parent, REPO.parent.parent):
        if (root / "shared" / "data").is_dir():
            return root / "shared" / "data"
    return REPO.parent / "shared" / "data"


# ---------------------------------------------------------------------------------------------- reading


def _is_words(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def read_jsonl(path: Path, fields: dict[str, str]) -> list[dict[str, Any]]:
    """The records of a JSON Lines file with ``fields`` ({name: "text" | "words"}) checked on every line: a bad
    line is a DataError naming the file, the line and the field (nothing is skipped). Blank lines are allowed."""
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DataError(str(path), None, f"cannot read: {e.strerror or e}") from e
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(str(path), number, f"not JSON ({e.msg})") from e
        if not isinstance(record, dict):
            raise DataError(str(path), number, "not a JSON object")
        for name, kind in fields.items():
            if name not in record:
                raise DataError(str(path), number, "missing", field=name)
            ok = isinstance(record[name], str) if kind == "text" else _is_words(record[name])
            if not ok:
                raise DataError(
                    str(path), number, f"expected {'a string' if kind == 'text' else 'a list of strings'}", field=name
                )
        records.append(record)
    return records


def read_tagged(path: Path, tokens: str = "tokens", tags: str = "ner_tags") -> Tagged:
    """Token and tag lists of a tagging file; a line whose tags do not match its tokens one to one is an error."""
    records = read_jsonl(path, {tokens: "words", tags: "words"})
    for number, record in enumerate(records, 1):
        if len(record[tokens]) != len(record[tags]):
            raise DataError(str(path), number, f"{len(record[tags])} tags for {len(record[tokens])} tokens", tags)
    return [r[tokens] for r in records], [r[tags] for r in records]


def read_labelled(path: Path, text: str = "text", label: str = "label") -> Labelled:
    """Texts and labels of a classification file."""
    records = read_jsonl(path, {text: "text", label: "text"})
    return [r[text] for r in records], [r[label] for r in records]


def conll2003(root: Path, split: str) -> Tagged:
    return read_tagged(root / "conll2003" / f"{split}.jsonl")


def sst2(root: Path, split: str) -> Labelled:
    return read_labelled(root / "sst2" / f"{split}.jsonl")


def semeval_splits(root: Path) -> dict[str, list[dict[str, Any]]]:
    """SemEval-2014 restaurants as the project's semeval rows see it: train and validation carved from the official
    train by benchmarks/quality.py's carve_semeval (10%, seed 0), and the official test."""
    from quality import carve_semeval  # benchmarks/quality.py: one carving rule for models and peers

    fields = {"tokens": "words", "aspect_tags": "words", "label": "text"}
    with tempfile.TemporaryDirectory(prefix="peers-semeval-") as folder:
        train, validation = carve_semeval(root, Path(folder))
        return {
            "train": read_jsonl(train, fields),
            "validation": read_jsonl(validation, fields),
            "test": read_jsonl(root / "semeval14_restaurants" / "test.jsonl", fields),
        }


SEMEVAL_POLARITY_LABELS = ["positive", "negative", "neutral", "conflict"]
"""tasks/semeval14_polarity.yaml's label set (its macro-F1 averages over these four)."""


# ---------------------------------------------------------------------------------------------- scoring


def entity_scores(gold: list[list[str]], pred: list[list[str]]) -> dict[str, float]:
    """The project's entity metrics (seqeval, IOB2): ``f1`` is the figure its results report, beside strict F1."""
    from mtl_decoder.evaluation.metrics import tagging_metrics

    m = tagging_metrics(gold, pred)
    return {k: m[k] for k in ("f1", "f1_strict", "precision", "recall")}


def class_scores(gold: list[str], pred: list[str], labels: list[str]) -> dict[str, float]:
    """The project's classification metrics: accuracy and macro-F1 over ``labels``."""
    from mtl_decoder.evaluation.metrics import classification_metrics

    m = classification_metrics(gold, pred, labels)
    return {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}


def cpu_timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """``fn()``, the CPU seconds this process spent in it and its wall seconds (the machine is shared: CPU time is
    what the peer took, whatever else ran)."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


# ---------------------------------------------------------------------------------------------- results

PEER_ORDER = ("crf", "tfidf_lr", "spacy")


def this_command() -> str:
    """The command line that ran this script, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    name = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    return shlex.join(["python", str(name), *sys.argv[1:]])


def run_facts() -> dict[str, Any]:
    """The command, machine, date and commit of this run, taken when it starts (a long run may end after a later
    commit): benchmarks/quality.py's machine description, stored with every one of its runs."""
    from quality import machine

    return {"command": this_command(), **machine()}


def save_peer(name: str, entry: dict[str, Any], run: dict[str, Any], path: Path = RESULTS) -> dict[str, Any]:
    """Merge one peer's entry and its ``run`` (run_facts()) into ``path`` (read again just before writing, written
    whole and renamed into place). Each peer keeps the machine, date, commit and command of its own run; the top
    level names the latest run's machine and the commands that make the whole file."""
    results = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    peers = results.get("peers", {})
    peers[name] = {**entry, "run": run}
    ordered = {k: peers[k] for k in (*PEER_ORDER, *sorted(set(peers) - set(PEER_ORDER))) if k in peers}
    out = {
        "benchmark": "peers",
        "cpu": run["cpu"],
        "cpu_cores": run["cpu_cores"],
        "avx512": run["avx512"],
        "date": run["date"],
        "commit": run["commit"],
        "command": " && ".join(p["run"]["command"] for p in ordered.values()),
        "peers": ordered,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out, indent=1) + "\n")
    return out
