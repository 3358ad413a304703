"""Model folders saved before the trunk interface (tests/fixtures/trunk_folders, written by its make.py) load and
predict exactly as they did then: every label, tag, span and probability equal, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtl_decoder import predict_texts

FOLDERS = Path(__file__).parent / "fixtures" / "trunk_folders"


@pytest.mark.parametrize("name", ["native", "frozen"])
def test_a_folder_saved_before_predicts_the_same(tmp_path, name):
    pytest.importorskip("transformers")
    expected = json.loads((FOLDERS / f"{name}.expected.json").read_text(encoding="utf-8"))
    got = list(predict_texts(FOLDERS / name, expected["texts"], workers=1, cache_dir=tmp_path / "cache"))
    assert json.dumps(got) == json.dumps(expected["predictions"])
