"""Does a run's gradient clip bind, and when? The gradient norm each run logged before clipping, by phase.

    python benchmarks/grad_norms.py ROW [ROW ...] [--runs-dir benchmarks/runs] [--out grad_norms.json]

Reads each run's metrics.jsonl (``grad_norm``: the mean of each logging window's norms before clipping;
``clipped_share``: the share of the window's steps the clip scaled down; logged also with the clip off,
``training.max_grad_norm: 0``) and reports, per run, the mean norm over the first tenth of its steps, the middle and
the last third, the largest window mean, the share of windows whose mean is above 1 (the default clip), and the mean
clipped share. Entries merge into benchmarks/results/NAME.json by row name (issue 37: the multi-task recipe's clip
of 1.0 against its norms, and whether turning it off costs or buys CoNLL anything).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quality_record import machine

from mtl_decoder.files import atomic_write_text

HERE = Path(__file__).resolve().parent


def windows(run_dir: Path) -> list[dict]:
    """The run's train records that carry a gradient norm, in step order."""
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    found = [r for r in records if r.get("type") == "train" and "grad_norm" in r]
    if not found:
        raise SystemExit(f"{run_dir / 'metrics.jsonl'}: no train record with a grad_norm")
    return sorted(found, key=lambda r: r["step"])


def phases(records: list[dict]) -> dict:
    """Mean window norm over the first tenth, the middle and the last third of the steps, and the clip's reach."""
    last = records[-1]["step"]

    def mean(chosen: list[dict], key: str) -> float:
        return sum(r[key] for r in chosen) / len(chosen)

    first = [r for r in records if r["step"] <= last / 10] or records[:1]
    middle = [r for r in records if last / 10 < r["step"] <= 2 * last / 3] or records
    final = [r for r in records if r["step"] > 2 * last / 3] or records[-1:]
    out = {
        "steps": last,
        "windows": len(records),
        "grad_norm_first_tenth": mean(first, "grad_norm"),
        "grad_norm_middle": mean(middle, "grad_norm"),
        "grad_norm_last_third": mean(final, "grad_norm"),
        "grad_norm_largest_window": max(r["grad_norm"] for r in records),
        "windows_above_1": sum(r["grad_norm"] > 1.0 for r in records) / len(records),
    }
    if all("clipped_share" in r for r in records):
        out["clipped_share"] = mean(records, "clipped_share")
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("rows", nargs="+", help="run folders' names under --runs-dir")
    parser.add_argument("--runs-dir", type=Path, default=HERE / "runs")
    parser.add_argument("--out", default="grad_norms.json", help="file name under benchmarks/results")
    args = parser.parse_args()
    path = HERE / "results" / args.out
    results = json.loads(path.read_text()) if path.is_file() else {"benchmark": "grad_norms", "runs": {}}
    for row in args.rows:
        results["runs"][row] = {**phases(windows(args.runs_dir / row)), **machine()}
        print(
            row,
            json.dumps({k: v for k, v in results["runs"][row].items() if k.startswith(("grad", "windows", "clip"))}),
        )
    atomic_write_text(path, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
