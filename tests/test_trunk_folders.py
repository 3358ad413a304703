"""Model folders saved before the trunk interface (tests/fixtures/trunk_folders, written by its make.py) load and
predict as they did then: every label, tag and span equal, every probability equal to float32 noise (the folders
were written on one CPU; another's matrix products sum in another order, which moves the last bits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mtl_decoder import predict_texts

FOLDERS = Path(__file__).parent / "fixtures" / "trunk_folders"
FLOAT32_NOISE = 1e-5
"""The largest probability change allowed: summation order across CPUs (AVX2 against AVX-512) moved them by ~1e-7."""


def assert_same_predictions(got: Any, want: Any, where: str = "predictions") -> None:
    """``got`` equals ``want`` (JSON values) exactly, except floats, which may differ by float32 noise."""
    if isinstance(want, float):
        assert isinstance(got, float) and abs(got - want) <= FLOAT32_NOISE, f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_same_predictions(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_predictions(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("name", ["native", "frozen"])
def test_a_folder_saved_before_predicts_the_same(tmp_path, name):
    pytest.importorskip("transformers")
    expected = json.loads((FOLDERS / f"{name}.expected.json").read_text(encoding="utf-8"))
    got = list(predict_texts(FOLDERS / name, expected["texts"], workers=1, cache_dir=tmp_path / "cache"))
    assert_same_predictions(json.loads(json.dumps(got)), expected["predictions"])


def test_the_comparison_has_teeth():
    want = [{"tags": ["B-LOC"], "probs": {"negative": 0.48703715}}]
    assert_same_predictions([{"tags": ["B-LOC"], "probs": {"negative": 0.48703703}}], want)  # AVX2 against AVX-512
    for changed in (
        [{"tags": ["O"], "probs": {"negative": 0.48703715}}],
        [{"tags": ["B-LOC"], "probs": {"negative": 0.4871}}],
    ):
        with pytest.raises(AssertionError):
            assert_same_predictions(changed, want)
