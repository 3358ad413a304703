"""How fast a teacher labelled, read from its target cache: the shards' write times and the texts each holds.

    python benchmarks/labelling_rate.py FINGERPRINT [--shards N] [--since NS] [--out NAME.json]

A distill run writes a shard of the target cache (``~/.cache/mtl-decoder/targets/FINGERPRINT``, or
``$MTL_DECODER_CACHE/targets``) every few thousand texts, named by its write time in nanoseconds and its writer's
process id. For a labelling that was stopped before it finished (its run folder, and so its ``distill.json``,
removed), the shards it wrote are all that measures it: for each writing process, the texts (and words) of its second
to last shard over the time between its first shard's write and its last's (the first shard's own start is not
recorded); the processes' rates add up. ``--since``: only shards written at or after that time (ns since the epoch),
to leave out an earlier run's. Writes benchmarks/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from quality_record import machine
from safetensors import safe_open

from mtl_decoder.distill.targets import SPANS, default_cache_root
from mtl_decoder.tensorstore import SHARD_GLOB, entry_key


def shard_times(folder: Path) -> list[tuple[int, int, int, str]]:
    """(write time in ns, texts, words, writer's pid) of each shard, oldest first; a text's words are the rows of
    its word spans (a text without them counts none)."""
    out = []
    for shard in folder.glob(SHARD_GLOB):
        _, written, pid = shard.name.removesuffix(".safetensors").split("-")
        with safe_open(str(shard), framework="pt") as f:
            names = list(f.keys())
            words = sum(f.get_slice(n).get_shape()[0] for n in names if n.endswith(f"/{SPANS}"))
        out.append((int(written), len({entry_key(name) for name in names}), words, pid))
    return sorted(out)


def writer_rates(times: list[tuple[int, int, int, str]]) -> dict[str, dict]:
    """Each writing process's timed span: its shards, timed texts and words, minutes."""
    by_writer = defaultdict(list)
    for entry in times:
        by_writer[entry[3]].append(entry)
    rates = {}
    for pid, own in by_writer.items():
        if len(own) < 2:
            continue
        minutes = (own[-1][0] - own[0][0]) / 60e9
        texts, words = sum(n for _, n, _, _ in own[1:]), sum(w for _, _, w, _ in own[1:])
        rates[pid] = {
            "shards": len(own),
            "timed_texts": texts,
            "timed_words": words,
            "timed_minutes": round(minutes, 2),
            "texts_per_minute": round(texts / minutes, 1),
            "words_per_s": round(words / minutes / 60, 1),
        }
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fingerprint", help="the teacher's target folder name (distill.json's fingerprint)")
    parser.add_argument("--shards", type=int, help="the first N shards only")
    parser.add_argument("--since", type=int, default=0, help="only shards written at or after this time (ns)")
    parser.add_argument("--out", default="labelling_rate.json")
    args = parser.parse_args()
    folder = default_cache_root() / args.fingerprint
    times = [t for t in shard_times(folder) if t[0] >= args.since][: args.shards]
    rates = writer_rates(times)
    if not rates:
        raise SystemExit(f"{folder}: no process wrote two shards, no interval to measure")
    texts = sum(r["timed_texts"] for r in rates.values())
    result = {
        "fingerprint": args.fingerprint,
        "shards": len(times),
        "texts_in_shards": sum(n for _, n, _, _ in times),
        "words_in_shards": sum(w for _, _, w, _ in times),
        "processes": len(rates),
        "by_process": rates,
        "timed_texts": texts,
        "timed_minutes": max(r["timed_minutes"] for r in rates.values()),
        "texts_per_minute": round(sum(r["texts_per_minute"] for r in rates.values()), 1),
        "words_per_s": round(sum(r["words_per_s"] for r in rates.values()), 1),
        **machine(),
    }
    out = Path(__file__).resolve().parent / "results" / args.out
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
