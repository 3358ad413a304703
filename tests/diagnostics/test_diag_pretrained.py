"""The three diagnostics on a pretrained Hugging Face trunk (a tiny random Llama, upcycled): the data is read
with the trunk's tokenizer, the model fits one batch and its saved copy agrees, and diagnose probes what it
knows (the trunk's norms and the expert blocks) without a fault."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import tiny_checkpoint

from mtl_decoder.diagnostics.data import debug_data
from mtl_decoder.diagnostics.findings import codes
from mtl_decoder.diagnostics.model import diagnose
from mtl_decoder.diagnostics.overfit import overfit
from mtl_decoder.training import train


@pytest.mark.slow
def test_diagnostics_on_an_upcycled_llama(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "llama", "llama")
    cfg = tiny_config(
        tmp_path / "run",
        [f"model.trunk.pretrained={checkpoint}", "model.trunk.mode=upcycle", "training.max_steps=6"],
    )
    data = debug_data(cfg)
    assert data.ok and data.settings["tokenizer"].startswith("the pretrained trunk's")
    fitted = overfit(cfg)
    assert fitted.passed, fitted.summary_lines()
    result = diagnose(train(cfg).best_dir, output_dir=tmp_path / "diagnose", profile=False)
    assert codes(result.findings) == set()
    assert any(name.endswith("norm") for name in result.report["norms"])  # LlamaRMSNorm, found by its name
    assert result.report["gates"]["utilisation"] and result.report["padding"]["max_relative_change"]
