"""Which systems the speed/quality frontier (frontier_plot.py) draws, and with which figures: every model of ours
and every peer whose speed and quality both sit in benchmarks/results/.

    python benchmarks/frontier_plot.py    # writes results/plots/frontier.png and results/frontier.json

A point is drawn only when a results file holds its speed (words per CPU-second, one thread) and at least one of
its test metrics; each record names the file and path of every figure (``FILE PATH``, the syntax of
``doc_sources.py``). Where the figures come from:

- the pretrained-trunk models: ``pretrained_throughput.json``, ``pretrained_throughput_hybrid.json`` and
  ``pretrained_throughput_hybrid_bidir.json`` (its int8 entry has no quality of its own: left out), whose
  entries carry the speed and the test metrics of the same weights (``_previous`` and ``_second`` are other runs
  of the same models, not drawn twice; the untrained entries have no quality);
- the distilled students: their rows in ``quality.json``, ``quality_lexicon.json`` and ``quality_states.json`` (the
  last with another training of the teacher: "(teacher retrained)"; ``words_per_cpu_s`` timed after training);
- the students on a frozen trunk's first blocks in W8A8: the int8 entries of ``pretrained_throughput_b4_student.json``
  and ``pretrained_throughput_b1_student.json`` (speed and test metrics of the quantized weights);
- ``ple`` from scratch: ``quality_rerun.json`` for its quality, ``spacy_throughput.json`` for its speed (the pairing
  of the README's summary table; speed does not depend on the weights);
- spaCy's CNN pipeline: ``peers.json`` for its quality, and the speed timed beside our pretrained models in
  ``pretrained_throughput.json`` (the CPU of most points; ``spacy_throughput.json`` times it on another);
- the feature CRF and TF-IDF + logistic regression have no prediction speed, and the untrained models timed for
  speed alone (the SmolLM2 entries of ``pretrained_throughput.json``, the size variants and the wide spaCy CNN of
  ``spacy_throughput.json``) no quality: listed as left out in frontier.json, not drawn. Not read at all:
  ``student_speed.json`` (distill_small's untrained architecture on another CPU; its trained row in quality.json
  has its own speed), ``predict_throughput*.json`` (the untrained demo model) and ``pretrained_profile.json`` (the
  same models timed under the profiler).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doc_cells import cpu
from doc_sources import RESULTS

W8A8_FILE = "pretrained_throughput_w8a8.json"
"""The 16-block model trained again and timed in fp32 and W8A8 (after mtl-decoder quantize)."""
PRETRAINED_FILES = (
    "pretrained_throughput.json",
    "pretrained_throughput_hybrid.json",
    W8A8_FILE,
    "pretrained_throughput_hybrid_bidir.json",
)
DISTILL_FILES = ("quality.json", "quality_lexicon.json", "quality_states.json")
STUDENT_TRUNK_FILES = (
    "pretrained_throughput_b4_student.json",
    "pretrained_throughput_b1_student.json",
    "pretrained_throughput_b1_6pass_student.json",
)
"""Students on a frozen trunk's first blocks (distill_bN_*), timed in fp32 and in W8A8 after mtl-decoder quantize:
their int8 entries are drawn as distilled points (their fp32 speed is the row's own, in quality_states.json)."""
RETAUGHT = {"quality_states.json": " (teacher retrained)"}
"""A suffix for the rows of a file whose teacher is another training of the same recipe (the same row names): only
those taught by it (RETAUGHT_TEACHER); a row naming its own teacher (``bidirteacher``, ``echoteacher``) has none."""
RETAUGHT_TEACHER = "smollm2_frozen_ple/best"

OURS, PEER = "ours", "peer"
FAMILIES = {
    "pretrained": "ours: PLE on the SmolLM2-135M trunk (blocks, precision)",
    "distilled": "ours: distilled student (distill_*)",
    "scratch": "ours: from scratch",
    "peer": "peer",
}


@dataclasses.dataclass(frozen=True)
class Point:
    """One system: its speed and test metrics, and the ``FILE PATH`` each came from."""

    name: str
    kind: str  # OURS or PEER
    family: str  # a key of FAMILIES
    words_per_cpu_s: float | None
    conll_f1: float | None
    sst2_acc: float | None
    cpu: str | None  # the CPU its speed was measured on, as the results file names it
    sources: dict[str, str]

    @property
    def drawn(self) -> bool:
        """Whether it has a speed and a quality: what a point needs to appear."""
        return self.words_per_cpu_s is not None and (self.conll_f1 is not None or self.sst2_acc is not None)


def _load(results: Path, name: str) -> Any:
    """A results file, None when the folder has none of that name."""
    path = results / name
    return json.loads(path.read_text()) if path.is_file() else None


Figure = tuple[float | None, str]
"""A value and its ``FILE PATH``; MISSING where the results hold none."""
MISSING: Figure = (None, "")


def _point(name: str, family: str, cpu: str | None, speed: Figure, conll: Figure, sst2: Figure) -> Point:
    """A Point whose sources name the figures it has."""
    figures = {"words_per_cpu_s": speed, "conll_f1": conll, "sst2_acc": sst2}
    return Point(
        name=name,
        kind=PEER if family == "peer" else OURS,
        family=family,
        words_per_cpu_s=speed[0],
        conll_f1=conll[0],
        sst2_acc=sst2[0],
        cpu=cpu,
        sources={figure: path for figure, (value, path) in figures.items() if value is not None},
    )


def _test_metric(file: str, name: str, run: dict[str, Any], task: str, key: str) -> Figure:
    """A run's test metric in a quality file, MISSING when the run has no such task."""
    value = run["metrics"]["test"].get(task, {}).get(key)
    return value, f"{file} runs.{name}.metrics.test.{task}.{key}"


def _pretrained_label(entry: dict[str, Any], file: str = "") -> str:
    """'4 blocks int8', '16+2 blocks fp32' for the hybrid (two blocks trained over sixteen cached; 'bidirectional':
    their causal mask lifted), 'W8A8' for int8 with SmoothQuant scales."""
    hybrid = re.search(r"hybrid(\d+)_on(\d+)", entry["name"])
    blocks = f"{hybrid[2]}+{hybrid[1]}" if hybrid else str(entry["blocks"])
    blocks += " bidirectional" if "_bidir" in entry["name"] else ""
    untrained = " (untrained)" if "untrained" in entry["name"] else ""
    if file == W8A8_FILE:
        return f"{blocks} blocks {'W8A8' if entry['precision'] == 'int8' else 'fp32'} (retrained)"
    return f"{blocks} blocks {entry['precision']}{untrained}"


def _throughput_points(
    results: Path,
    files: tuple[str, ...],
    family: str,
    keep: Callable[[dict[str, Any]], bool],
    label: Callable[[dict[str, Any], str], str],
) -> list[Point]:
    """A Point per entry of pretrained_throughput.py's ``files`` that ``keep(entry)`` takes, named ``label(entry,
    file)``: the speed and test metrics of the same weights, side by side."""
    points = []
    for file in files:
        data = _load(results, file) or {"entries": []}
        for entry in filter(keep, data["entries"]):
            at = f"{file} entries[name={entry['name']}]"
            points.append(
                _point(
                    label(entry, file),
                    family,
                    entry.get("cpu", data.get("cpu")),
                    speed=(entry["words_per_cpu_s"], f"{at}.words_per_cpu_s"),
                    conll=(entry.get("conll2003_test_f1"), f"{at}.conll2003_test_f1"),
                    sst2=(entry.get("sst2_test_accuracy"), f"{at}.sst2_test_accuracy"),
                )
            )
    return points


def pretrained_points(results: Path) -> list[Point]:
    """Every entry of the pretrained-throughput files."""
    return _throughput_points(results, PRETRAINED_FILES, "pretrained", lambda entry: True, _pretrained_label)


def _retaught(file: str, run: dict) -> str:
    """The file's suffix where the row was taught by the retrained teacher, else nothing."""
    return RETAUGHT.get(file, "") if str(run.get("teacher", "")).endswith(RETAUGHT_TEACHER) else ""


def distilled_points(results: Path) -> list[Point]:
    """The distill_* rows of the quality files, each timed after its training."""
    points = []
    for file in DISTILL_FILES:
        runs = (_load(results, file) or {"runs": {}})["runs"]
        points += [
            _point(
                name.removeprefix("distill_").replace("_", " ") + _retaught(file, run),
                "distilled",
                run.get("cpu"),
                speed=(run.get("words_per_cpu_s"), f"{file} runs.{name}.words_per_cpu_s"),
                conll=_test_metric(file, name, run, "conll2003", "f1"),
                sst2=_test_metric(file, name, run, "sst2", "accuracy"),
            )
            for name, run in runs.items()
            if name.startswith("distill_")
        ]
    return points


def student_w8a8_points(results: Path) -> list[Point]:
    """The int8 entries of STUDENT_TRUNK_FILES: a frozen-trunk student's W8A8 speed and test metrics."""

    def label(entry: dict[str, Any], file: str) -> str:
        return entry["name"].split("/")[0].removeprefix("distill_").replace("_", " ") + " W8A8"

    return _throughput_points(
        results, STUDENT_TRUNK_FILES, "distilled", lambda entry: entry["precision"] == "int8", label
    )


def scratch_points(results: Path) -> list[Point]:
    """``ple`` from scratch (quality_rerun.json's quality, spacy_throughput.json's speed) and the size variants timed
    beside it (untrained, speed alone)."""
    timed = _load(results, "spacy_throughput.json") or {}
    ple = (_load(results, "quality_rerun.json") or {"runs": {}})["runs"].get("ple")
    points = []
    if ple or timed:
        speed = timed.get("summary", {}).get("ours_1_thread", {}).get("words_per_cpu_s")
        points.append(
            _point(
                "ple from scratch",
                "scratch",
                timed.get("cpu"),
                speed=(speed, "spacy_throughput.json summary.ours_1_thread.words_per_cpu_s"),
                conll=_test_metric("quality_rerun.json", "ple", ple, "conll2003", "f1") if ple else MISSING,
                sst2=_test_metric("quality_rerun.json", "ple", ple, "sst2", "accuracy") if ple else MISSING,
            )
        )
    for i, model in enumerate(timed.get("size_variants", {}).get("models", [])[1:], start=1):
        at = f"spacy_throughput.json size_variants.models[{i}].words_per_cpu_s"
        points.append(
            _point(
                f"{model['model']} (untrained)",
                "scratch",
                timed["cpu"],
                (model["words_per_cpu_s"], at),
                MISSING,
                MISSING,
            )
        )
    return points


def peer_points(results: Path) -> list[Point]:
    """The peers of peers.json, spaCy's speed the one timed beside our pretrained models; and spaCy's wide CNN,
    timed alone (no such pipeline was trained)."""
    peers = (_load(results, "peers.json") or {"peers": {}})["peers"]
    beside = _load(results, PRETRAINED_FILES[0]) or {}
    labels = {"spacy": "spaCy CNN", "crf": "feature CRF", "tfidf_lr": "TF-IDF + LR"}
    points = []
    for key, peer in peers.items():
        speed = beside.get("spacy_words_per_cpu_s") if key == "spacy" else None
        points.append(
            _point(
                labels.get(key, key),
                "peer",
                beside.get("cpu") if speed is not None else None,
                speed=(speed, f"{PRETRAINED_FILES[0]} spacy_words_per_cpu_s"),
                conll=(peer.get("conll2003", {}).get("test_f1"), f"peers.json peers.{key}.conll2003.test_f1"),
                sst2=(peer.get("sst2", {}).get("test_accuracy"), f"peers.json peers.{key}.sst2.test_accuracy"),
            )
        )
    timed = _load(results, "spacy_throughput.json") or {}
    if "spacy_wide_cnn" in timed:
        at = "spacy_throughput.json spacy_wide_cnn.summary.spacy_1_process.words_per_cpu_s"
        speed = (timed["spacy_wide_cnn"]["summary"]["spacy_1_process"]["words_per_cpu_s"], at)
        points.append(_point("spaCy CNN width 256, depth 8 (untrained)", "peer", timed["cpu"], speed, MISSING, MISSING))
    return points


def candidates(results: Path = RESULTS) -> list[Point]:
    """Every system the results folder names with a speed or a test metric, drawable or not."""
    ours = pretrained_points(results) + distilled_points(results) + student_w8a8_points(results)
    return ours + scratch_points(results) + peer_points(results)


def gather(results: Path = RESULTS) -> list[Point]:
    """The points of the plot: the systems with a speed and at least one test metric."""
    return [p for p in candidates(results) if p.drawn]


def left_out(results: Path = RESULTS) -> list[dict[str, Any]]:
    """The systems with only a speed or only a quality, each with what it lacks."""
    return [
        {"name": p.name, "kind": p.kind, "lacks": "speed" if p.words_per_cpu_s is None else "quality", **p.sources}
        for p in candidates(results)
        if not p.drawn
    ]


def reference_cpu(points: list[Point]) -> str | None:
    """The CPU most of the points' speeds were measured on (the title's), as the table cell names it."""
    counts = Counter(cpu(p.cpu) for p in points if p.cpu)
    return counts.most_common(1)[0][0] if counts else None


def frontier(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The Pareto frontier (no other point both faster and better), from the fastest to the best."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(xy, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front
