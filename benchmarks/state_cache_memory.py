"""The memory a training run's state cache takes: every entry of a cache folder read as training reads it
(``StateCache.get`` of each key, whole shards at a time), in a fresh process per way of reading.

    python benchmarks/state_cache_memory.py --cache ~/.cache/mtl-decoder/states/FOLDER [--out FILE]
    python benchmarks/state_cache_memory.py --training-log LOG --row NAME [--beside TEXT] [--out FILE]

Two ways, each in its own process: ``mapped`` (today's reader: each shard's tensors are views of one copy-on-write
mapping of the file, so their pages are the page cache's, shared between processes and dropped under pressure) and
``copied`` (each tensor copied into the process's own memory, as the reader did before). For each: the states'
bytes, the process's resident memory split into its own (RssAnon: what must fit in free memory, per process) and
file pages (RssFile: the page cache's, shared), and the seconds the reading took. Bounded by the folder's size.

``--training-log``: a whole training run instead, from a log of its distill process sampled every 20 s by
benchmarks/sample_memory.sh (lines ``HH:MM:SS VmHWM: MiB RssAnon: MiB RssFile: MiB avail MiB``): the peaks of its
own memory and of its file pages, its peak resident size (what quality.py's peak_memory_mb reports: both), and the
least memory left available to the machine, stored under ``runs`` with the row's name.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from quality_record import machine, resident_mib

from mtl_decoder.files import atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def read_all(cache: Path, copied: bool) -> dict:
    """Every entry of ``cache`` through StateCache.get, kept in memory as training keeps it."""
    from mtl_decoder.model.pretrained.state_cache import StateCache

    before = resident_mib()
    start = time.perf_counter()
    states = StateCache(cache, write=False)
    keys = list(states.on_disk)
    total = 0
    for key in keys:
        found = states.get(key)
        total += found.numel() * found.element_size()
    if copied:  # the reader before: each tensor its own copy out of the file
        states.memory = type(states.memory)((k, t.clone()) for k, t in states.memory.items())
    seconds = time.perf_counter() - start
    after = resident_mib()
    return {
        "entries": len(keys),
        "states_mib": round(total / 2**20, 1),
        "seconds": round(seconds, 1),
        **{f"{k}_mib": round(after[k] - before.get(k, 0.0), 1) for k in ("RssAnon", "RssFile")},
        "peak_VmHWM_mib": round(after["VmHWM"], 1),
    }


def training_peaks(log: Path) -> dict[str, int]:
    """The peaks of a sampled run (benchmarks/sample_memory.sh's lines), in MiB."""
    rows = [line.split() for line in log.read_text().splitlines() if line.count(":") >= 5]
    if not rows:
        raise SystemExit(f"{log}: no samples (lines 'HH:MM:SS VmHWM: N RssAnon: N RssFile: N avail N')")
    column = {name: [int(r[i + 1]) for r in rows] for i, name in ((1, "VmHWM"), (3, "RssAnon"), (5, "RssFile"))}
    return {
        "samples": len(rows),
        "peak_RssAnon_mib": max(column["RssAnon"]),
        "peak_RssFile_mib": max(column["RssFile"]),
        "peak_VmHWM_mib": max(column["VmHWM"]),
        "least_available_mib": min(int(r[8]) for r in rows),
    }


def _stored(out: Path) -> dict:
    """The results file as it is (the two modes each replace only their own part of it)."""
    return json.loads(out.read_text()) if out.is_file() else {"benchmark": "state_cache_memory"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help="a state cache folder (shard-*.safetensors)")
    parser.add_argument("--training-log", type=Path, help="a sampled training run (benchmarks/sample_memory.sh)")
    parser.add_argument("--row", help="the sampled run's benchmarks/quality.py row")
    parser.add_argument("--beside", default="", help="what ran beside it")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "state_cache_memory.json")
    parser.add_argument("--way", choices=["mapped", "copied"], help=argparse.SUPPRESS)  # one child's way
    args = parser.parse_args()
    if args.way:
        print(json.dumps(read_all(args.cache.expanduser(), args.way == "copied")))
        return
    if args.training_log:
        if not args.row:
            parser.error("--training-log needs --row")
        result = _stored(args.out)
        peaks = training_peaks(args.training_log)
        result.setdefault("runs", {})[args.row] = {**peaks, "beside": args.beside, **machine()}
        print(args.row, peaks)
        atomic_write_text(args.out, json.dumps(result, indent=2))
        return
    if args.cache is None:
        parser.error("give --cache or --training-log")
    ways = {}
    for way in ("mapped", "copied"):
        child = subprocess.run(
            [sys.executable, __file__, "--cache", str(args.cache), "--way", way],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        ways[way] = json.loads(child.stdout.strip().splitlines()[-1])
        print(way, ways[way], flush=True)
    result = {**_stored(args.out), "cache": args.cache.name, "ways": ways, **machine()}  # the sampled runs kept
    atomic_write_text(args.out, json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
