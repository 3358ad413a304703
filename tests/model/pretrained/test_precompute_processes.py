"""The frozen trunk's state precompute split between two processes (torchrun, gloo): together they fill the shared
cache with exactly the sequences one process computes, each sequence once, each process its share."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from safetensors import safe_open

pytest.importorskip("transformers")

from helpers import needs_torchrun, tiny_config, torchrun_cli
from hf_testkit import assert_fp16_rounded, tiny_checkpoint
from trunk_runs import overrides

from mtl_decoder.training.trainer import Trainer


def shard_keys(cache: Path) -> dict[Path, list[str]]:
    """Every shard file of the cache folder (one trunk: one folder under ``cache``) -> the keys it holds."""
    out = {}
    for shard in sorted(cache.glob("*/shard-*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            out[shard] = list(f.keys())
    return out


def one_process_cache(config) -> None:
    """The precompute of one process (the trainer's setup runs it), without training."""
    trainer = Trainer(config)
    try:
        trainer.setup()
    finally:
        trainer.cleanup()


@needs_torchrun
def test_two_processes_fill_the_cache_once_between_them(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "llama")
    single = tiny_config(tmp_path / "one", overrides(checkpoint, tmp_path / "one", "frozen", "training.max_steps=1"))
    one_process_cache(single)
    two = tiny_config(tmp_path / "two", overrides(checkpoint, tmp_path / "two", "frozen", "training.max_steps=1"))
    two.save(tmp_path / "two.yaml")
    done = torchrun_cli("train", "--config", str(tmp_path / "two.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]

    reference, shared = shard_keys(tmp_path / "one" / "state-cache"), shard_keys(tmp_path / "two" / "state-cache")
    expected = {k for keys in reference.values() for k in keys}
    written = [k for keys in shared.values() for k in keys]
    assert len(expected) > 20
    assert sorted(written) == sorted(expected)  # every sequence, and none twice
    pids = {int(re.search(r"-(\d+)\.safetensors$", p.name).group(1)) for p in shared}
    assert len(pids) == 2  # each process wrote its share
    share = [sum(len(keys) for p, keys in shared.items() if p.name.endswith(f"-{pid}.safetensors")) for pid in pids]
    assert abs(share[0] - share[1]) <= 1  # every other sequence, longest first
    log = done.stdout + done.stderr
    assert re.search(rf"trunk states .*: {len(expected)} computed in [0-9.]+ min by 2 processes", log), log[-2000:]

    where = {k: p for p, keys in reference.items() for k in keys}
    for shard, keys in shared.items():  # the same states (both stored in float16), whichever process computed them
        with safe_open(str(shard), framework="pt") as f, safe_open(str(where[keys[0]]), framework="pt") as g:
            a, b = f.get_tensor(keys[0]), g.get_tensor(keys[0])
        # both float16 roundings of float32 states that differ by float32 noise at most: one float16 ulp apart at most
        assert_fp16_rounded(a.float(), b.float(), ulps=2)
