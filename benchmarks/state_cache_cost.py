"""The one-time cost of a frozen trunk's state cache for a training recipe (issue 22 item 4), apart from training.

    python benchmarks/state_cache_cost.py --config configs/bench/smollm2_default.yaml [--threads 2]
                                          [--data-root ../shared/data] [--cache-dir DIR]
    python benchmarks/state_cache_cost.py --config CONFIG --record RUN_DIR --log TRAIN_LOG --threads 2  # made by hand

The first form runs ``mtl-decoder train --config CONFIG training.max_steps=1`` into a temporary run folder with the
tasks pointed at --data-root as benchmarks/quality.py points them (CoNLL-2003 and SST-2; not SemEval, whose validation
split quality.py carves), so the trunk computes the states of every training and
validation text once (into --cache-dir, default an empty temporary folder: a cold cache), then trains one step.
The second records such a run made by hand (the same command): its summary.json holds ``state_cache_seconds``
and its log the trainer's ``trunk states (...)`` line (sequences computed, blocks, bytes per token, memory and
disk of the cache). Either way benchmarks/results/state_cache_cost.json gets one entry per recipe, with the CPU
and the torch threads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import data_overrides
from quality_record import machine

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "state_cache_cost.json"
LINE = re.compile(r"trunk states \(layer (\d+) of [^)]*\): ([\d,]+) computed in [\d.]+ min.*?; (.*)$")


def run(config: Path, data_root: Path, threads: int, cache_dir: Path | None) -> tuple[Path, str]:
    """Train one step (the states first) into a temporary folder; (run folder, its log text)."""
    out = Path(tempfile.mkdtemp(prefix="state-cache-cost-"))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MTL_DECODER_CACHE=str(cache_dir or out / "cache"))
    cmd = [sys.executable, "-m", "mtl_decoder", "train", "--config", str(config), "--output-dir", str(out / "run"),
           *data_overrides(config, data_root, None), "training.max_steps=1", "training.progress=false"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return out / "run", done.stdout + done.stderr


def entry(config: Path, run_dir: Path, log: str, threads: int, command: str) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    found = [LINE.search(line) for line in log.replace("\r", "\n").splitlines()]
    found = [m for m in found if m]
    if not found:
        raise SystemExit("no 'trunk states (...)' line in the log: not a frozen-trunk run?")
    blocks, computed, footprint = found[-1].groups()
    trunk = cfg["model"]["trunk"]
    return {
        "config": str(config.resolve().relative_to(REPO)) if config.resolve().is_relative_to(REPO) else str(config),
        "tasks": [t["name"] for t in cfg["tasks"]],
        "trunk_blocks_run": int(blocks),
        "read_layers": trunk.get("read_layers"),
        "sequences_computed": int(computed.replace(",", "")),
        "state_cache_minutes": summary["state_cache_seconds"] / 60,
        "footprint": footprint,
        "threads": threads,
        "command": command,
        **machine(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, required=True, help="the frozen-trunk training recipe (measured or recorded)")
    p.add_argument("--record", type=Path, metavar="RUN_DIR", help="record a run made by hand instead (with --log)")
    p.add_argument("--log", type=Path, help="--record: the run's training log (stdout and stderr)")
    p.add_argument("--name", help="the entry's name (default: the config's file name)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--cache-dir", type=Path, help="the state cache root (default: an empty temporary folder)")
    p.add_argument("--note", default="", help="what else ran on the machine meanwhile (stored with the entry)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.record is not None:
        if args.log is None:
            raise SystemExit("--record needs --log")
        run_dir, log = args.record, args.log.read_text(errors="replace")
        command = f"recorded from {args.record} ({args.log})"
    else:
        run_dir, log = run(args.config, args.data_root, args.threads, args.cache_dir)
        command = " ".join(sys.argv)
    result = entry(args.config, run_dir, log, args.threads, command)
    name = args.name or Path(result["config"]).stem
    results = json.loads(args.out.read_text()) if args.out.is_file() else {"benchmark": "state_cache_cost", "runs": {}}
    results["runs"][name] = {**result, "note": args.note}
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    minutes, blocks = result["state_cache_minutes"], result["trunk_blocks_run"]
    print(f"{name}: {result['sequences_computed']:,} sequences through {blocks} blocks in {minutes:.1f} min at "
          f"{args.threads} threads ({result['cpu']}); {result['footprint']}")  # fmt: skip


if __name__ == "__main__":
    main()
