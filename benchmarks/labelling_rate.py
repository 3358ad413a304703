"""How fast a teacher labelled, read from its target cache: the shards' write times and the texts each holds.

    python benchmarks/labelling_rate.py FINGERPRINT [--shards N] [--out NAME.json]

A distill run writes a shard of the target cache (``~/.cache/mtl-decoder/targets/FINGERPRINT``, or
``$MTL_DECODER_CACHE/targets``) every few thousand texts, named by its write time in nanoseconds. For a labelling
process that was stopped before it finished (its run folder, and so its ``distill.json``, removed), the shards it
wrote are all that measures it: the texts of the second to the N-th shard over the time between the first shard's
write and the N-th's (the first shard's own start is not recorded). Writes benchmarks/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quality_record import machine
from safetensors import safe_open

from mtl_decoder.distill.targets import default_cache_root
from mtl_decoder.tensorstore import SHARD_GLOB, entry_key


def shard_times(folder: Path) -> list[tuple[int, int]]:
    """(write time in ns, texts) of each shard, oldest first."""
    out = []
    for shard in folder.glob(SHARD_GLOB):
        written = int(shard.name.split("-")[1])
        with safe_open(str(shard), framework="pt") as f:
            names = list(f.keys())
        out.append((written, len({entry_key(name) for name in names})))
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fingerprint", help="the teacher's target folder name (distill.json's fingerprint)")
    parser.add_argument("--shards", type=int, help="the first N shards only (those of one process)")
    parser.add_argument("--out", default="labelling_rate.json")
    args = parser.parse_args()
    folder = default_cache_root() / args.fingerprint
    times = shard_times(folder)[: args.shards]
    if len(times) < 2:
        raise SystemExit(f"{folder}: fewer than two shards, no interval to measure")
    minutes = (times[-1][0] - times[0][0]) / 60e9
    texts = sum(n for _, n in times[1:])
    result = {
        "fingerprint": args.fingerprint,
        "shards": len(times),
        "texts_in_shards": sum(n for _, n in times),
        "timed_texts": texts,
        "timed_minutes": round(minutes, 2),
        "texts_per_minute": round(texts / minutes, 1),
        **machine(),
    }
    out = Path(__file__).resolve().parent / "results" / args.out
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
