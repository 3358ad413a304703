"""Whether int8 would pay for a student's expert products on this CPU: one PLE layer's expert matrix products at
the fast student's sizes, float32 against torch's dynamic int8 (issue 35's next lever: the native layers' expert
groups are float32 while their attention projections already run int8).

    OMP_NUM_THREADS=1 python benchmarks/expert_int8.py [--rounds 5] [--out benchmarks/results/expert_int8.json]

The products: every route's up projection at a fork as one (M, C) x (C, E * 2H) product, then each expert's down
projection (M, H) x (H, C), with M tokens (a batch's), C = d_model, H = expert_hidden and E experts (the fast
student: 128, 256, two shared and one per task of two tasks). float32: torch's matmul and bmm. int8: weights per
output channel, activations per tensor as they come, through torch's fused dynamic kernel with 7-bit activations
where this CPU's 8-bit kernel saturates (``smoothquant.full_range_is_exact``), as ``Int8Linear`` runs them. Each
round times both (CPU seconds, alternating order); medians and spread, the relative error of int8 against float32,
and the CPU (its flags decide: int8 pays where VNNI sums 8-bit products straight into 32 bits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from quality_record import machine

from mtl_decoder.inference.smoothquant import Int8Linear, full_range_is_exact

OUT = Path(__file__).resolve().parent / "results" / "expert_int8.json"


def products(m: int, c: int, h: int, e: int, seed: int = 0):
    """The float32 and the int8 ways to run one layer's expert products, and their inputs."""
    g = torch.Generator().manual_seed(seed)
    x, a = torch.randn(m, c, generator=g), torch.randn(e, m, h, generator=g)
    up = torch.nn.Linear(c, e * 2 * h, bias=False)
    downs = [torch.nn.Linear(h, c, bias=False) for _ in range(e)]
    w_up, w_down = up.weight.detach().t().contiguous(), torch.stack([d.weight.detach().t() for d in downs])
    up8, downs8 = Int8Linear(up, per_token=False), [Int8Linear(d, per_token=False) for d in downs]

    def fp32():
        return x @ w_up, torch.bmm(a, w_down)

    def int8():
        return up8(x), torch.stack([d(a[i]) for i, d in enumerate(downs8)])

    return fp32, int8


def cpu_seconds(run, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        run()
    return (time.process_time() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20, help="products per timing")
    parser.add_argument("--tokens", type=int, default=2000, help="M: a batch's tokens")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    c, h, e = 128, 256, 4
    fp32, int8 = products(args.tokens, c, h, e)
    (up32, down32), (up8, down8) = fp32(), int8()
    error = {"up": float((up8 - up32).norm() / up32.norm()), "down": float((down8 - down32).norm() / down32.norm())}
    times: dict[str, list[float]] = {"fp32": [], "int8": []}
    for r in range(args.rounds):
        for name in ("fp32", "int8") if r % 2 == 0 else ("int8", "fp32"):
            times[name].append(1000 * cpu_seconds(fp32 if name == "fp32" else int8, args.repeat))
    ratios = [f / i for f, i in zip(times["fp32"], times["int8"], strict=True)]
    result = {
        "benchmark": "expert_int8",
        **machine(),
        "torch": torch.__version__,
        "sizes": {"tokens": args.tokens, "d_model": c, "expert_hidden": h, "experts": e},
        "eight_bit_activations": full_range_is_exact(),
        "ms_per_layer": {k: round(statistics.median(v), 2) for k, v in times.items()},
        "spread_ms": {k: [round(min(v), 2), round(max(v), 2)] for k, v in times.items()},
        "int8_speedup": round(statistics.median(ratios), 3),
        "int8_speedup_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "relative_error": {k: round(v, 4) for k, v in error.items()},
        "rounds": args.rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("cpu", "ms_per_layer", "int8_speedup", "int8_speedup_spread")}))


if __name__ == "__main__":
    main()
