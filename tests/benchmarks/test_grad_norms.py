"""benchmarks/grad_norms.py: the logged gradient norms summarised by phase, checked against sums done by hand."""

from __future__ import annotations

import json

import pytest
from grad_norms import phases, windows


def test_phases_split_the_run_into_its_first_tenth_middle_and_last_third(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    norms = {10: 40.0, 20: 8.0, 30: 3.0, 40: 2.0, 50: 1.5, 60: 1.2, 70: 0.9, 80: 0.8, 90: 0.7, 100: 0.6}
    lines = [json.dumps({"type": "validation", "step": 50, "score": 0.5})]
    lines += [
        json.dumps({"type": "train", "step": s, "grad_norm": n, "clipped_share": float(n > 1)})
        for s, n in norms.items()
    ]
    (run / "metrics.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    got = phases(windows(run))
    assert got["steps"] == 100 and got["windows"] == 10
    assert got["grad_norm_first_tenth"] == 40.0  # step 10 only
    assert got["grad_norm_middle"] == pytest.approx((8 + 3 + 2 + 1.5 + 1.2) / 5)  # steps 20-60 (<= 66.7)
    assert got["grad_norm_last_third"] == pytest.approx((0.9 + 0.8 + 0.7 + 0.6) / 4, abs=1e-4)
    assert got["grad_norm_largest_window"] == 40.0
    assert got["windows_above_1"] == 0.6 and got["clipped_share"] == 0.6


def test_a_run_without_logged_norms_is_refused_with_its_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"type": "train", "step": 5, "lr": 0.1}) + "\n")
    with pytest.raises(SystemExit, match=r"metrics\.jsonl: no train record with a grad_norm"):
        windows(tmp_path)
