"""Is the multi-task model level with its single-task pair? A paired bootstrap over the test sentences and the seeds.

    python benchmarks/pair_bootstrap.py [--seeds 0,1,2,3] [--resamples 2000] [--out pair_bootstrap.json]
                                        [--multi smollm2_echo_hybrid2_on16_bidir_3k{}_ple]

issue 37's "ple at least level with its single-task pair", for the echo recipe (smollm2_echo_hybrid2_on16_bidir_3k*):
each model of each seed (the multi-task model, CoNLL-2003 alone, SST-2 alone; benchmarks/runs/ROW/best) predicts
CoNLL-2003 and SST-2 test with ``mtl-decoder predict --cache-states`` (the first writes the frozen blocks' states of
the test texts to the shared state cache, the rest read them), its predictions kept under
benchmarks/runs/pair_predictions/. Each model's test F1 (entities from seqeval's ``get_entities``, micro-averaged as
seqeval's ``f1_score``) and accuracy are first checked against the ``mtl-decoder evaluate`` figures in
quality.json. Score = the mean of the two; difference = multi-task score - pair's score. ``--multi`` names another
multi-task row against the same pair (``{}``: where the seed's suffix goes), e.g. the recipe with CoNLL drawn twice
as often (``smollm2_echo_hybrid2_on16_bidir_3k_conll2x{}_ple``); ``--pair`` names the single-task rows (``{}`` the task,
then the seed's suffix), e.g. the full schedule's with ``--multi smollm2_echo_hybrid2_on16_bidir_full{}_ple --pair
smollm2_echo_hybrid2_on16_bidir_full_single_{}{}``.

Two intervals for the mean difference over the seeds: the test set's sampling alone (the same resampled sentences for
every model: paired), and seeds and sentences together (seeds resampled with replacement, then sentences). Writes
benchmarks/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from seqeval.metrics import f1_score
from seqeval.metrics.sequence_labeling import get_entities

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "benchmarks" / "runs"
OUT = RUNS / "pair_predictions"
MULTI = "smollm2_echo_hybrid2_on16_bidir_3k{}_ple"
SINGLE = "smollm2_echo_hybrid2_on16_bidir_3k_single_{}{}"
TASKS = {"conll2003": "conll2003/test.jsonl", "sst2": "sst2/test.jsonl"}


def suffix(seed: int) -> str:
    return f"_seed{seed}" if seed else ""


def predictions(row: str, task: str, data_root: Path) -> list[dict]:
    """ROW's predictions for ``task`` on its test file, made once (``predict --cache-states``) and kept."""
    path = OUT / f"{row}.{task}.jsonl"
    if not path.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial.jsonl")
        model, test = str(RUNS / row / "best"), str(data_root / TASKS[task])
        command = [sys.executable, "-m", "mtl_decoder", "predict", "--model", model, "--input", test, "--output",
                   str(tmp), "--tasks", task, "--cache-states", "--force"]  # fmt: skip
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        tmp.rename(path)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tagging_counts(records: list[dict]) -> tuple[list[tuple[int, int, int]], float]:
    """Per sentence (true positives, predicted, gold) entities, and seqeval's F1 over all of them."""
    counts, gold_all, pred_all = [], [], []
    for r in records:
        gold, pred = r["ner_tags"], r["predictions"]["conll2003"]["tags"]
        g, p = set(get_entities(gold)), set(get_entities(pred))
        counts.append((len(g & p), len(p), len(g)))
        gold_all.append(gold)
        pred_all.append(pred)
    return counts, f1_score(gold_all, pred_all)


def f1_of(counts: list[tuple[int, int, int]], rows: list[int]) -> float:
    tp = sum(counts[i][0] for i in rows)
    predicted = sum(counts[i][1] for i in rows)
    gold = sum(counts[i][2] for i in rows)
    return 2 * tp / (predicted + gold) if predicted + gold else 0.0


def correct(records: list[dict]) -> list[int]:
    return [int(r["predictions"]["sst2"]["label"] == r["label"]) for r in records]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", default="pair_bootstrap.json")
    parser.add_argument("--multi", default=MULTI, help="the multi-task row, {} where the seed's suffix goes")
    parser.add_argument(
        "--pair", default=SINGLE, help="the single-task rows, {} for the task, then {} where the seed's suffix goes"
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    quality = json.loads((REPO / "benchmarks" / "results" / "quality.json").read_text())["runs"]
    models = {}  # (seed, role) -> (per-sentence entity counts, per-sentence SST-2 correctness)
    checks = {}
    for seed in seeds:
        rows = {"multi": (args.multi.format(suffix(seed)),) * 2,
                "pair": tuple(args.pair.format(task, suffix(seed)) for task in TASKS)}  # fmt: skip
        for role, (conll_row, sst_row) in rows.items():
            counts, f1 = tagging_counts(predictions(conll_row, "conll2003", args.data_root))
            right = correct(predictions(sst_row, "sst2", args.data_root))
            models[seed, role] = (counts, right)
            reported = (quality[conll_row]["metrics"]["test"]["conll2003"]["f1"],
                        quality[sst_row]["metrics"]["test"]["sst2"]["accuracy"])  # fmt: skip
            ours = (f1_of(counts, list(range(len(counts)))), sum(right) / len(right))
            assert abs(ours[0] - f1) < 1e-9, (ours[0], f1)  # the micro F1 from counts is seqeval's
            if abs(ours[0] - reported[0]) > 2e-3 or abs(ours[1] - reported[1]) > 2e-3:
                print(f"warning: seed {seed} {role}: {ours} from predict against evaluate's {reported}", flush=True)
            checks[f"{seed} {role}"] = {
                "f1": round(ours[0], 5),
                "f1_evaluate": round(reported[0], 5),
                "accuracy": round(ours[1], 5),
                "accuracy_evaluate": round(reported[1], 5),
            }
    n_conll, n_sst = len(models[seeds[0], "multi"][0]), len(models[seeds[0], "multi"][1])

    def difference(seed: int, conll_rows: list[int], sst_rows: list[int]) -> float:
        scores = {}
        for role in ("multi", "pair"):
            counts, right = models[seed, role]
            scores[role] = (f1_of(counts, conll_rows) + sum(right[i] for i in sst_rows) / len(sst_rows)) / 2
        return scores["multi"] - scores["pair"]

    everything = (list(range(n_conll)), list(range(n_sst)))
    per_seed = {seed: difference(seed, *everything) for seed in seeds}
    observed = sum(per_seed.values()) / len(seeds)
    rng = random.Random(0)
    sentences_only, seeds_and_sentences = [], []
    for _ in range(args.resamples):
        conll_rows = [rng.randrange(n_conll) for _ in range(n_conll)]
        sst_rows = [rng.randrange(n_sst) for _ in range(n_sst)]
        diffs = {seed: difference(seed, conll_rows, sst_rows) for seed in seeds}
        sentences_only.append(sum(diffs.values()) / len(seeds))
        drawn = [rng.choice(seeds) for _ in seeds]
        seeds_and_sentences.append(sum(diffs[s] for s in drawn) / len(drawn))
    result = {
        "benchmark": "pair_bootstrap",
        "question": "issue 37: is the echo recipe's multi-task model level with its single-task pair (test)?",
        "score": "(CoNLL-2003 test entity F1 + SST-2 test accuracy) / 2; difference: multi-task - pair",
        "multi_row": args.multi.format(""),
        "pair_rows": [args.pair.format(task, "") for task in TASKS],
        "seeds": seeds,
        "resamples": args.resamples,
        "test_sentences": {"conll2003": n_conll, "sst2": n_sst},
        "checks_against_evaluate": checks,
        "per_seed_difference": {str(s): round(d, 5) for s, d in per_seed.items()},
        "mean_difference": round(observed, 5),
        "interval_percent": 95,
        "interval_95_sentences": [round(percentile(sentences_only, q), 5) for q in (0.025, 0.975)],
        "interval_95_seeds_and_sentences": [round(percentile(seeds_and_sentences, q), 5) for q in (0.025, 0.975)],
        "share_of_resamples_multi_behind": {
            "sentences": round(sum(d < 0 for d in sentences_only) / args.resamples, 4),
            "seeds_and_sentences": round(sum(d < 0 for d in seeds_and_sentences) / args.resamples, 4),
        },
    }
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from quality_record import machine

    result.update(machine())
    (REPO / "benchmarks" / "results" / args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    shown = ("per_seed_difference", "mean_difference", "interval_95_sentences", "interval_95_seeds_and_sentences")
    print(json.dumps({k: result[k] for k in (*shown, "share_of_resamples_multi_behind")}))


if __name__ == "__main__":
    main()
