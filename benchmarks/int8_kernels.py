"""What W8A8's int8 products cost on this CPU: one SmolLM2 projection in float32, in int8 with activations per
tensor (torch's fused dynamic kernel) and per token (int8 x int8 sums by ``torch._int_mm``, or the same sums as a
float32 product: ``smoothquant.integer_products``), one thread, CPU seconds.

    OMP_NUM_THREADS=1 python benchmarks/int8_kernels.py [--rounds 5] [--out benchmarks/results/int8_kernels.json]

Why: ``mtl-decoder quantize`` quantises every activation per token by default, and torch's int8 x int8 product
runs at several times float32's rate where the CPU has VNNI or AMX, but far below it on AVX2 alone; which way
``Int8Linear`` takes is decided once per process (``int8_products_are_fast``), and this says what each way costs.
Shapes: SmolLM2-135M's gate/up projection (576 -> 1536) and its down projection (1536 -> 576) on 512 tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from quality_record import machine

from mtl_decoder.inference.smoothquant import (
    Int8Linear,
    full_range_is_exact,
    int8_products_are_fast,
    per_token_product,
)

OUT = Path(__file__).resolve().parent / "results" / "int8_kernels.json"
SHAPES = {"gate_up": (576, 1536), "down": (1536, 576)}


def ways(linear: torch.nn.Linear, x: torch.Tensor) -> dict:
    """Each way to run ``linear`` on ``x``."""
    per_tensor, per_token = Int8Linear(linear, per_token=False), Int8Linear(linear, per_token=True)

    def per_token_by(fast: bool):
        return lambda: per_token_product(x, per_token.w_int8, per_token.w_scale, fast) + per_token.bias

    return {
        "fp32": lambda: linear(x),
        "int8_per_tensor": lambda: per_tensor(x),
        "int8_per_token_int_mm": per_token_by(True),
        "int8_per_token_float_sums": per_token_by(False),
    }


def cpu_ms(run, repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        run()
    return 1000 * (time.process_time() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    result = {
        "benchmark": "int8_kernels",
        **machine(),
        "torch": torch.__version__,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "eight_bit_activations_per_tensor": full_range_is_exact(),
        "int8_products_are_fast": int8_products_are_fast(),
        "shapes": {},
    }
    with torch.no_grad():
        for name, (k, n) in SHAPES.items():
            linear, x = torch.nn.Linear(k, n), torch.randn(args.tokens, k)
            runs = ways(linear, x)
            for run in runs.values():
                run()  # warm-up
            times: dict[str, list[float]] = {way: [] for way in runs}
            for r in range(args.rounds):
                for way in runs if r % 2 == 0 else reversed(list(runs)):
                    slow = way == "int8_per_token_int_mm" and not result["int8_products_are_fast"]
                    times[way].append(cpu_ms(runs[way], 1 if slow else 10))
            fp32 = statistics.median(times["fp32"])
            result["shapes"][name] = {
                "in_out": [k, n],
                "ms": {way: round(statistics.median(t), 2) for way, t in times.items()},
                "spread_ms": {way: [round(min(t), 2), round(max(t), 2)] for way, t in times.items()},
                "speed_over_fp32": {way: round(fp32 / statistics.median(t), 3) for way, t in times.items()},
            }
            print(name, result["shapes"][name]["speed_over_fp32"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
