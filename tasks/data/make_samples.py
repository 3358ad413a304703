"""Rebuild the bundled demo samples from the full data sets in ../shared/data (fixed seed).

    python tasks/data/make_samples.py [--source ../shared/data]

The samples are small random subsets (research-use data: see tasks/data/README.md for sources and licences).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SIZES = {"train": 2000, "validation": 500, "test": 500}
SETS = {"conll2003": "conll2003-sample", "sst2": "sst2-sample"}


def sample(src: Path, dst: Path, size: int, seed: int) -> int:
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(seed)
    picked = sorted(rng.sample(range(len(lines)), min(size, len(lines))))
    dst.write_text(
        "".join(json.dumps(json.loads(lines[i]), ensure_ascii=False) + "\n" for i in picked), encoding="utf-8"
    )
    return len(picked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    for name, out in SETS.items():
        (here / out).mkdir(exist_ok=True)
        for seed, (split, size) in enumerate(SIZES.items()):
            n = sample(args.source / name / f"{split}.jsonl", here / out / f"{split}.jsonl", size, seed)
            print(f"{out}/{split}.jsonl: {n} examples")


if __name__ == "__main__":
    main()
