"""benchmarks/pretrained_memory.py at a small size, as a user runs it: a frozen trunk of SmolLM2's width predicting
more distinct records than the inference state cache holds keeps that cache at its bound, writes nothing to the
on-disk cache folder and runs the trunk once per record (issue 22 item 2's invariants, which its 1M run measures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mtl_decoder.model.pretrained.state_cache import INFERENCE_ENTRIES

REPO = Path(__file__).resolve().parents[2]

from pretrained_memory import sentence  # noqa: E402


def test_generated_records_are_distinct_and_keep_their_lengths():
    records = [sentence(i, (3, 5)) for i in range(500)]
    assert len(set(records)) == len(records)
    assert all(3 <= len(r.split()) <= 5 for r in records) and str(123) in records[123].split()


def test_more_records_than_the_state_cache_holds_keep_it_bounded_and_off_disk(tmp_path):
    records = INFERENCE_ENTRIES + 400
    out = tmp_path / "memory.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(REPO / "benchmarks" / "pretrained_memory.py"), "--sizes", f"200,{records}",
            "--blocks", "1", "--words", "3-6", "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    last = result["rows"][-1]
    assert last["records"] == records and last["trunk_runs"] == records  # every distinct record computed, once
    assert last["states_in_memory"] == INFERENCE_ENTRIES  # full, and no further
    assert all(row["cache_folder_mb"] == 0 for row in result["rows"])  # predict never writes the shared cache
    assert result["precision"] == "fp32" and "3-6 words" in result["input"]
