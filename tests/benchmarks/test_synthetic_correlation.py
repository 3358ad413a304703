"""benchmarks/synthetic_correlation.py: the convergence criterion on hand-made curves, a tiny training against the
step cap, the seed-by-seed comparison on hand-made numbers, and the results page built from the stored JSON."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

import synthetic_correlation as sc  # noqa: E402
import synthetic_correlation_report as rep  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "synthetic_correlation.json"
PAGE = REPO / "docs" / "synthetic_correlation.md"


# ---------------------------------------------------------------------------------------------- convergence criterion


def decisions(curve: list[float], window: int, eps: float, drops: int) -> list[str]:
    rule = sc.StopRule(window, eps, drops)
    out = []
    for loss in curve:
        out.append(rule.update(loss))
        if out[-1] == "stop":
            break
    return out


def test_flat_curve_is_flat_once_there_is_an_earlier_evaluation():
    assert not sc.flattened([1.0] * 3, window=3, eps=0.01)  # nothing before the window to compare with
    assert sc.flattened([1.0] * 4, window=3, eps=0.01)


def test_still_falling_curve_never_flattens():
    curve = [0.98**k for k in range(60)]  # 2% per evaluation: 6% per window of 3, above eps = 5%
    assert not any(sc.flattened(curve[:n], window=3, eps=0.05) for n in range(1, len(curve) + 1))
    # the same curve at eps = 7% is flat as soon as a window exists
    assert sc.flattened(curve[:4], window=3, eps=0.07)


def test_noisy_plateau_stops_where_a_dip_beats_the_old_best_by_less_than_eps():
    # hand-checked, window 3, eps 5%: at the 8th loss (0.118) the best before the window is 0.15, so 0.118 is
    # progress; at the 9th (0.125) the best before is 0.12 and the window's best 0.118 is only 1.7% lower
    curve = [1.0, 0.5, 0.3, 0.2, 0.15, 0.12, 0.13, 0.118, 0.125, 0.119, 0.121]
    flat = [sc.flattened(curve[:n], window=3, eps=0.05) for n in range(1, len(curve) + 1)]
    assert flat.index(True) == 8
    assert decisions(curve, window=3, eps=0.05, drops=0) == ["go"] * 8 + ["stop"]


def test_a_drop_restarts_the_stage_from_the_best_loss_so_far():
    # stage 1 is flat at 1.0 (drop at the 4th loss); stage 2 starts from [1.0], falls to 0.5 and must then beat
    # 0.5 by eps within 3 evaluations: it stops at the 5th loss of stage 2
    curve = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.4]
    assert decisions(curve, window=3, eps=0.05, drops=1) == ["go", "go", "go", "drop", "go", "go", "go", "stop"]


def test_non_finite_losses_count_as_no_progress():
    assert decisions([1.0, math.nan, math.inf, math.nan], window=3, eps=0.01, drops=0) == ["go"] * 3 + ["stop"]


@pytest.mark.parametrize("bad", [(0, 0.01, 1), (3, 1.0, 1), (3, -0.1, 1), (3, 0.01, -1)])
def test_stop_rule_refuses_bad_settings(bad):
    with pytest.raises(ValueError, match="StopRule"):
        sc.StopRule(*bad)


def test_a_bad_share_is_refused_before_any_training():
    with pytest.raises(SystemExit):
        sc.parse_args(["--agree", "0.4"])


def tiny_args(**over) -> argparse.Namespace:
    small = "--dim 8 --sines 2 --hidden 2 --tower 2 --batch 16 --val-size 64 --test-size 64 --eval-every 5"
    args = sc.parse_args([*small.split(), "--max-steps", "20"])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_training_that_keeps_improving_hits_the_cap_and_says_so():
    args = tiny_args(eps=0.0, window=50)  # a stage needs 50 evaluations: the 4 the cap allows never end one
    run = sc.train_one("mlp", 0, sc.SeedData(0, args).at(0.5), args)
    assert run["capped"] and run["stopped_at"] == 20 and run["lr_drops"] == []
    assert run["steps"] == [5, 10, 15, 20] and len(run["val_mse"]) == 4
    assert run["best_step"] == run["steps"][min(range(4), key=run["val_mse"].__getitem__)]
    assert run["best_val_mse"] == min(run["val_mse"])


def test_training_that_flattens_drops_the_lr_then_stops_before_the_cap():
    # eps 0.99: anything short of a 99% improvement is flat, so each stage ends after window + 1 evaluations
    args = tiny_args(eps=0.99, window=1, max_steps=1000)
    run = sc.train_one("ple", 0, sc.SeedData(0, args).at(0.5), args)
    assert not run["capped"]
    assert run["lr_drops"] == [10] and run["stopped_at"] == 15 and run["steps"] == [5, 10, 15]


# ------------------------------------------------------------------------------------------------ seed-by-seed claims


def test_paired_every_seed_agrees():
    c = rep.paired([0.1, 0.2, 0.3], [0.2, 0.25, 0.4])
    assert c["verdict"] == "a" and (c["a_lower"], c["b_lower"], c["n"]) == (3, 0, 3)
    assert c["diffs"] == pytest.approx([-0.1, -0.05, -0.1]) and c["mean_diff"] == pytest.approx(-0.25 / 3)
    assert c["sign_p"] == pytest.approx(0.25)  # 2 * (1/2)^3


def test_paired_disagreement_and_a_stated_share():
    a, b = [0.1, 0.5, 0.3, 0.2, 0.6], [0.2, 0.3, 0.4, 0.3, 0.7]  # a lower in 4 of 5
    assert rep.paired(a, b)["verdict"] is None
    assert rep.paired(a, b, share=0.8)["verdict"] == "a"
    assert rep.paired(b, a, share=0.8)["verdict"] == "b"
    assert rep.paired([0.1, 0.2], [0.1, 0.3])["verdict"] is None  # a tie counts for neither side


def test_sign_test_matches_enumeration():
    for n in range(1, 9):
        outcomes = list(itertools.product([0, 1], repeat=n))
        for k in range(n + 1):
            extreme = abs(k - n / 2)
            brute = sum(abs(sum(o) - n / 2) >= extreme for o in outcomes) / len(outcomes)
            assert rep.sign_test_p(k, n) == pytest.approx(brute)


def hand_result() -> dict:
    """Two models, two correlations, three seeds: 'b' beats 'a' at p = 0 in every seed, not at p = 1."""
    losses = {("a", 1.0): [0.10, 0.20, 0.30], ("b", 1.0): [0.12, 0.18, 0.35], ("a", 0.0): [0.30, 0.40, 0.50]}
    losses["b", 0.0] = [0.15, 0.19, 0.36]
    rows = []
    for (m, p), v in losses.items():
        per_seed = {
            str(s): {"loss": x, "stopped_at": 100 * (s + 1), "capped": s == 2, "lr_drops": [50] * (s == 0)}
            for s, x in enumerate(v)
        }
        rows.append({"model": m, "correlation": p, "capped": 1, "per_seed": per_seed})
    settings = {"models": "a,b", "correlations": "1.0,0.0", "agree": 1.0, "max_steps": 300, "noise_var": 0.01}
    settings["test_size"] = 100
    machine = {"cpu": "hand", "torch_threads": 1}
    return {
        "results": rows,
        "settings": settings,
        "machine": machine,
        "date": "d",
        "commit": "c",
        "cpu_s": 60,
        "label_variance": 5.0,
    }


def test_compare_pairs_and_rises_on_hand_numbers():
    cmp = rep.compare(hand_result()["results"], ["a", "b"], [1.0, 0.0], share=1.0)
    at = {c["correlation"]: c for c in cmp["loss"]}
    assert at[1.0]["verdict"] is None and at[1.0]["a_lower"] == 2
    assert at[0.0]["verdict"] == "b" and at[0.0]["diffs"] == pytest.approx([0.15, 0.21, 0.14])
    (rise,) = cmp["rise"]  # a rises by 0.2 every seed; b by 0.03, 0.01, 0.01
    assert rise["verdict"] == "b" and rise["diffs"] == pytest.approx([0.17, 0.19, 0.19])
    per_model = {c["model"]: c for c in cmp["rise_per_model"]}
    assert per_model["a"]["b_lower"] == 3 and per_model["a"]["verdict"] == "b"  # 'b' side of (rise, 0): it rose


def test_tables_state_claims_only_where_seeds_agree():
    text = rep.tables(hand_result())
    assert "- a vs b: b lower at p = 0.0 (3/3, sign test p = 0.25); the seeds disagree at p = 1.0." in text
    assert "| a | 0.200 (0.100 to 0.300), 1 capped | 0.400 (0.300 to 0.500), 1 capped |" in text
    assert "| a | 200 (100-300), 1/3 capped, lr dropped in 1/3 |" in text


def test_merge_refuses_different_settings():
    one = {**hand_result(), "label_pearson": {}, "label_variance": 1.0, "wall_s": 1, "cpu_s": 1}
    one["settings"] = {**one["settings"], "seeds": 3, "first_seed": 0}
    other = {**one, "settings": {**one["settings"], "lr": 1.0}}
    with pytest.raises(SystemExit, match="different settings: lr"):
        rep.merge([one, other])


# ------------------------------------------------------------------------------------------------ the stored results


def test_results_page_carries_the_tables_of_the_stored_json():
    """docs/synthetic_correlation.md's tables and claims are --table's output for the stored JSON, verbatim."""
    page = PAGE.read_text()
    opening = "<!-- generated: synthetic_correlation_report.tables synthetic_correlation.json -->\n"
    assert page.count(opening) == 1
    body = page.split(opening, 1)[1].split("\n<!-- /generated -->", 1)[0]
    assert body == rep.tables(json.loads(RESULTS.read_text())).strip("\n")


def test_stored_runs_keep_each_seeds_curve():
    result = json.loads(RESULTS.read_text())
    cap = result["settings"]["max_steps"]
    for row in result["results"]:
        assert row["capped"] == sum(run["capped"] for run in row["per_seed"].values())
        for run in row["per_seed"].values():
            assert len(run["steps"]) == len(run["val_mse"]) and run["steps"][-1] == run["stopped_at"] <= cap
            assert not run["capped"] or run["stopped_at"] == cap
            assert run["best_val_mse"] == min(run["val_mse"])
