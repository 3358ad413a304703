"""configs/demo_pretrained.yaml through the command line, as the README and the issue give it:
``mtl-decoder train --config configs/demo_pretrained.yaml model.trunk.pretrained=DIR model.trunk.mode=MODE`` for a
small Llama-style checkpoint folder DIR (config, safetensors weights, tokenizer) and each mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import FIXTURES  # tests/ is on sys.path (pytest's rootdir conftest)
from hf_testkit import tiny_checkpoint

from mtl_decoder.cli import main
from mtl_decoder.saved import load_model

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "demo_pretrained.yaml"
FIXTURE_DATA = [
    f"tasks.{task}.data.{split}={FIXTURES / f'{task}_{split}.jsonl'}"
    for task in ("ner", "sentiment")
    for split in ("train", "validation", "test")
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama")


@pytest.mark.parametrize("mode", ["frozen", "lora", "upcycle"])
def test_the_pretrained_demo_config_trains_on_any_small_checkpoint_in_each_mode(checkpoint, tmp_path, mode):
    """The tasks' files are the test fixtures (the same tasks, 60 sentences each instead of 2,000 and 500: a
    validation of the bundled samples alone takes ~15 s here), everything else as shipped."""
    run = tmp_path / "run"
    args = ["train", "--config", str(CONFIG), f"model.trunk.pretrained={checkpoint}", f"model.trunk.mode={mode}"]
    args += ["training.max_steps=3", "training.progress=false", f"model.trunk.cache_dir={tmp_path / 'cache'}"]
    assert main([*args, *FIXTURE_DATA, "--output-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    saved = load_model(run / "best", device="cpu")
    assert saved.config.model.trunk.mode == mode and saved.model.identity.layers == 2  # layers: 8 keeps all 2
    assert set(saved.label_sets) == {"ner", "sentiment"}
