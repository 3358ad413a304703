"""benchmarks/frontier_plot.py: which systems become points and with which figures, on a tiny fake results folder;
the picture is written; the stored frontier.json is what the real result files give, each source naming its value."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import doc_sources
import frontier_plot
import pytest

XEON = "Intel(R) Xeon(R) Processor (family 6, model 207), 2 cores"


def _write(folder: Path, name: str, data: dict) -> None:
    (folder / name).write_text(json.dumps(data))


def _run(speed: float | None, conll: float | None, sst2: float | None) -> dict:
    test = {}
    if conll is not None:
        test["conll2003"] = {"f1": conll}
    if sst2 is not None:
        test["sst2"] = {"accuracy": sst2}
    run = {"metrics": {"validation": test, "test": test}, "cpu": "Intel(R) Xeon(R) Processor"}
    return run if speed is None else {**run, "words_per_cpu_s": speed}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """Two students of ours (one scored on CoNLL alone), one without a speed, spaCy with both figures, a CRF with
    no speed, and a pretrained file holding only an untrained, speed-only entry."""
    runs = {
        "distill_a": _run(5000.0, 0.80, 0.85),
        "distill_b": _run(9000.0, 0.78, None),
        "distill_c": _run(None, 0.82, 0.86),
        "ple": _run(None, 0.70, 0.70),  # not a student: not read from quality.json
    }
    _write(tmp_path, "quality.json", {"runs": runs})
    peers = {"spacy": {"conll2003": {"test_f1": 0.81}, "sst2": {"test_accuracy": 0.82}}}
    peers["crf"] = {"conll2003": {"test_f1": 0.83}}
    _write(tmp_path, "peers.json", {"peers": peers})
    untrained = {"name": "smollm2 1 blocks untrained fp32", "blocks": 1, "precision": "fp32", "words_per_cpu_s": 2500.0}
    beside = {"cpu": XEON, "spacy_words_per_cpu_s": 16000.0, "entries": [untrained]}
    _write(tmp_path, "pretrained_throughput.json", beside)
    return tmp_path


def test_a_point_needs_a_speed_and_a_score(results):
    points = {p.name: p for p in frontier_plot.gather(results)}
    assert sorted(points) == ["a", "b", "spaCy CNN"]
    a, b, spacy = points["a"], points["b"], points["spaCy CNN"]
    assert (a.kind, a.words_per_cpu_s, a.conll_f1, a.sst2_acc) == ("ours", 5000.0, 0.80, 0.85)
    assert (b.kind, b.words_per_cpu_s, b.conll_f1, b.sst2_acc) == ("ours", 9000.0, 0.78, None)
    assert (spacy.kind, spacy.words_per_cpu_s, spacy.conll_f1, spacy.sst2_acc) == ("peer", 16000.0, 0.81, 0.82)
    assert spacy.sources == {
        "words_per_cpu_s": "pretrained_throughput.json spacy_words_per_cpu_s",
        "conll_f1": "peers.json peers.spacy.conll2003.test_f1",
        "sst2_acc": "peers.json peers.spacy.sst2.test_accuracy",
    }
    assert set(b.sources) == {"words_per_cpu_s", "conll_f1"}
    lacks = {entry["name"]: entry["lacks"] for entry in frontier_plot.left_out(results)}
    assert lacks == {"c": "speed", "feature CRF": "speed", "1 blocks fp32 (untrained)": "quality"}


def test_a_point_scored_on_conll_alone_shows_on_that_panel_alone(results):
    points = frontier_plot.gather(results)
    reference = frontier_plot.reference_cpu(points)
    assert reference == "Intel Xeon Processor"
    on_conll = [m.text for m in frontier_plot._marks(points, "conll_f1", reference)]
    on_sst2 = [m.text for m in frontier_plot._marks(points, "sst2_acc", reference)]
    assert sorted(on_conll) == ["a", "b", "spaCy CNN"]
    assert sorted(on_sst2) == ["a", "spaCy CNN"]


def test_only_the_frontier_and_the_recipe_rows_of_the_students_are_labelled(results):
    """spaCy beats both students on CoNLL (faster and better): there only the featured row is labelled; on SST-2
    student a is on the frontier and labelled without being featured. Peers are always labelled."""
    points = frontier_plot.gather(results)
    reference = frontier_plot.reference_cpu(points)
    on_conll = {
        m.text: m.labelled for m in frontier_plot._marks(points, "conll_f1", reference, featured=("distill_a",))
    }
    assert on_conll == {"a": True, "b": False, "spaCy CNN": True}
    on_conll = {m.text: m.labelled for m in frontier_plot._marks(points, "conll_f1", reference, featured=())}
    assert on_conll == {"a": False, "b": False, "spaCy CNN": True}
    on_sst2 = {m.text: m.labelled for m in frontier_plot._marks(points, "sst2_acc", reference, featured=())}
    assert on_sst2 == {"a": True, "spaCy CNN": True}


def test_the_frontier_keeps_what_nothing_beats_on_both():
    points = [(100.0, 0.9), (200.0, 0.85), (150.0, 0.8), (300.0, 0.85), (400.0, 0.7)]
    assert frontier_plot.frontier(points) == [(400.0, 0.7), (300.0, 0.85), (100.0, 0.9)]


def test_the_script_writes_the_picture_and_the_points(results):
    assert frontier_plot.main(["--results", str(results)]) == 0
    png = results / "plots" / "frontier.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    written = json.loads((results / "frontier.json").read_text())
    assert [p["name"] for p in written["points"]] == ["a", "b", "spaCy CNN"]
    assert {e["name"] for e in written["left_out"]} == {"c", "feature CRF", "1 blocks fp32 (untrained)"}


def test_the_stored_points_are_what_the_result_files_say():
    """frontier.json (and so the PNG drawn with it) is not stale, and every source names the value it holds."""
    stored = json.loads((doc_sources.RESULTS / "frontier.json").read_text())["points"]
    points = frontier_plot.gather()
    assert stored == [dataclasses.asdict(p) for p in points], "python benchmarks/frontier_plot.py"
    for p in points:
        for figure, source in p.sources.items():
            file, path = source.split(" ", 1)
            assert doc_sources.lookup(file, path) == getattr(p, figure), source
