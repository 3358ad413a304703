"""Forward + backward speed of one expert block (`cgc`), against the naive way of computing the same thing.

    python benchmarks/ple_block.py [--tasks 2] [--json]

The batch is a mixed multi-task batch: --batch sentences of --seq tokens, split evenly between the tasks, every
token on exactly one task's route (what a training step with one label per example sees).

- optimised: mtl_decoder's ExpertBlock; every expert runs once, on exactly the tokens that read it.
- naive: the seed article's reference module: for each task, every shared expert and each of that task's experts
  (separate SwiGLU weights per expert) run on every row of the batch, the task's gate mixes them, and the result is
  masked to that task's rows. Shared experts are recomputed once per task.

Both run on identical weights (the naive module holds copies) and their outputs are checked equal first. Timings
alternate between the two in one run and report the median of --repeats; the machine's fp32 matmul rate is
measured in the same run. `gflops` counts only the expert matmuls the optimised block needs (for each expert, the
up (C x 2H) and down (H x C) matmuls on the tokens that use it), x3 for forward + backward.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.model import ExpertBlock, RouteLayout


class NaiveCGC(nn.Module):
    """The reference formulation: per task, all its experts and all shared experts on all rows, then a mask."""

    def __init__(self, block: ExpertBlock):
        super().__init__()

        def experts(group) -> nn.ParameterList:
            H = group.hidden
            w_in = [group.w_in.detach()[:, e * 2 * H : (e + 1) * 2 * H].clone() for e in range(group.n_experts)]
            w_out = [group.w_out.detach()[e].clone() for e in range(group.n_experts)]
            return nn.ParameterList([nn.Parameter(w) for pair in zip(w_in, w_out, strict=True) for w in pair])

        self.hidden = block.shared.hidden
        self.shared = experts(block.shared)
        self.task_experts = nn.ModuleDict({t: experts(g) for t, g in block.task_experts.items()})
        self.gates = nn.ModuleDict()
        for t, gate in block.task_gates.items():
            linear = nn.Linear(gate.proj.in_features, gate.proj.out_features)
            linear.load_state_dict(gate.proj.state_dict())
            self.gates[t] = linear

    def _run(self, params: nn.ParameterList, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for w_in, w_out in zip(params[0::2], params[1::2], strict=True):
            gate, up = (x @ w_in).split(self.hidden, dim=-1)
            outs.append((F.silu(gate) * up) @ w_out)
        return outs

    def forward(self, x: torch.Tensor, task_masks: dict[str, torch.Tensor]) -> torch.Tensor:
        y = torch.zeros_like(x)
        for task, mask in task_masks.items():
            outs = self._run(self.task_experts[task], x) + self._run(self.shared, x)  # gate order: own, shared
            weights = self.gates[task](x).float().softmax(-1)
            mixed = sum(weights[:, e : e + 1] * out for e, out in enumerate(outs))
            y = y + mixed * mask.unsqueeze(-1)
        return y


def matmul_gflops(n: int, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--shared", type=int, default=2, help="shared experts")
    ap.add_argument("--experts", type=int, default=2, help="experts per task")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of each SwiGLU expert")
    ap.add_argument("--batch", type=int, default=32, help="sentences")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sentence")
    ap.add_argument("--repeats", type=int, default=9, help="alternating timed rounds (median reported)")
    ap.add_argument("--iters", type=int, default=3, help="steps per timed round")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.batch % args.tasks:
        ap.error("--batch must be a multiple of --tasks")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    C, H, B, T = args.d_model, args.hidden, args.batch, args.seq
    tasks = [f"task{i}" for i in range(args.tasks)]
    block = ExpertBlock("cgc", tasks, C, args.shared, args.experts, H, 0.7, shared_gate=True)
    with torch.no_grad():  # trained-like weights: non-zero down projections and gates
        for p in block.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    per_task = B // args.tasks
    routes = {t: torch.arange(i * per_task, (i + 1) * per_task) for i, t in enumerate(tasks)}
    layout = RouteLayout.build(routes, torch.ones(B, T, dtype=torch.bool))
    M = layout.token_index.shape[0]
    # Routes are contiguous blocks of sentences, so the packed order is the batch order: the naive module reads
    # the same (M, C) matrix with a per-task row mask.
    task_masks = {}
    for t in tasks:
        mask = torch.zeros(M)
        mask[layout.tokens(t)] = 1.0
        task_masks[t] = mask
    naive = NaiveCGC(block)

    x = torch.randn(M, C, requires_grad=True)
    dy = torch.randn(M, C)
    with torch.no_grad():
        diff = (block(x, layout)[0] - naive(x, task_masks)).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"optimised and naive outputs differ by {diff}")

    def optimised_step() -> None:
        block.zero_grad(set_to_none=True)
        x.grad = None
        block(x, layout)[0].backward(dy)

    def naive_step() -> None:
        naive.zero_grad(set_to_none=True)
        x.grad = None
        naive(x, task_masks).backward(dy)

    def timed(step) -> float:
        start = time.perf_counter()
        for _ in range(args.iters):
            step()
        return (time.perf_counter() - start) / args.iters

    peak_before = max(matmul_gflops(1024), matmul_gflops(2048))
    for _ in range(2):  # warm-up
        optimised_step()
        naive_step()
    opt_times, naive_times = [], []
    for r in range(args.repeats):  # alternate, and swap which goes first, to share any drift
        if r % 2:
            naive_times.append(timed(naive_step))
            opt_times.append(timed(optimised_step))
        else:
            opt_times.append(timed(optimised_step))
            naive_times.append(timed(naive_step))
    peak = max(peak_before, matmul_gflops(1024), matmul_gflops(2048))

    t_opt, t_naive = statistics.median(opt_times), statistics.median(naive_times)
    expert_tokens = args.shared * M + args.experts * M  # shared experts on every token, each task's on its own
    flops = 3 * expert_tokens * (2 * C * 2 * H + 2 * H * C)
    naive_expert_tokens = args.tasks * (args.shared + args.experts) * M
    result = {
        "benchmark": "ple_block",
        "variant": "cgc",
        "tasks": args.tasks,
        "d_model": C,
        "expert_hidden": H,
        "n_shared_experts": args.shared,
        "n_task_experts": args.experts,
        "batch": B,
        "seq": T,
        "tokens": M,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "iters": args.iters,
        "ms_per_step": round(t_opt * 1e3, 2),
        "naive_ms_per_step": round(t_naive * 1e3, 2),
        "tokens_per_s": round(M / t_opt, 1),
        "naive_tokens_per_s": round(M / t_naive, 1),
        "speedup": round(t_naive / t_opt, 3),
        "ideal_speedup": round(naive_expert_tokens / expert_tokens, 3),
        "gflops": round(flops / t_opt / 1e9, 1),
        "peak_gflops": round(peak, 1),
        "fraction_of_peak": round(flops / t_opt / 1e9 / peak, 3),
        "max_abs_diff": diff,
        "load_average_1m": round(os.getloadavg()[0], 2),  # other processes on the machine skew every timing
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        r = result
        print(
            f"cgc block, {args.tasks} tasks, {M} tokens: {r['tokens_per_s']:.0f} tok/s optimised vs "
            f"{r['naive_tokens_per_s']:.0f} naive ({r['speedup']:.2f}x, ideal {r['ideal_speedup']:.2f}x); "
            f"{r['gflops']:.0f} GFLOP/s = {r['fraction_of_peak']:.0%} of {r['peak_gflops']:.0f} peak"
        )


if __name__ == "__main__":
    main()
