"""Forward + backward speed of one expert block, against the recompute-per-task formulation of the same function.

    python benchmarks/ple_block.py [--ffn ple|cgc|mmoe|cgc_stacked|mmoe_stacked] [--tasks 2] [--json]

The layer timed is the one a model of that variant spends its expert time in:

- ple: a middle layer (not the first, which forks, nor the last, which has no shared gate). Every example runs
  K task routes and the shared route: the block reads (K+1) x M packed tokens and writes as many.
- cgc, mmoe: their one expert layer, which forks the shared bottom: the block reads the M bottom tokens and writes
  the tokens of every task route. --labels one (default): the batch is split evenly between the tasks, every
  example on one task's route (a training step with one label per example); --labels all: every example on every
  task's route (prediction of all tasks).
- cgc_stacked, mmoe_stacked: a layer above the fork; the routes' tokens are disjoint (--labels one).

The recompute-per-task formulation (the seed article's reference module): for each task, its experts and every
shared expert (separate SwiGLU weights per expert) run on every row of that task's input, the task's gate mixes
them, and for cgc/mmoe the result is masked to the task's rows. Shared experts are recomputed once per task. Under
ple each task's input is its own route and the shared experts read the shared route; the shared gate mixes the
outputs already computed. Expert passes over M tokens, per layer (n_t task experts per task, n_s shared):

    variant                  recompute per task    each expert once (ours)    ideal speedup
    ple                      K (n_t + n_s)         K n_t + n_s                K (n_t + n_s) / (K n_t + n_s)
    cgc, --labels one        K (n_t + n_s)         n_t + n_s                  K
    cgc, --labels all        K (n_t + n_s)         K n_t + n_s                K (n_t + n_s) / (K n_t + n_s)
    mmoe                     K n_s                 n_s                        K

Both modules hold identical weights and their outputs are checked equal first. Timings alternate between the two
and a bare fp32 matmul (2048 x 2048, the machine's measured peak) within one run, each round in a different
order; `speedup` and `fraction_of_peak` are the medians over --repeats rounds of each round's own ratio (a busy
moment slows every side of its round), times and rates the medians of each side. `gflops` counts only the expert
matmuls the block needs (for each expert, the up (C x 2H) and down (H x C) matmuls on the tokens that read it), x3
for forward + backward. Both sides run with glibc keeping freed memory for reuse, as training does with the shipped
configs (training.keep_freed_memory; --release-freed-memory: not): on this VM, page-faulting fresh tensors in every
step cost the block about 5%.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.config import SHARED, VARIANTS
from mtl_decoder.model import ExpertBlock, RouteLayout
from mtl_decoder.training.memory import keep_freed_memory


class RecomputePerTask(nn.Module):
    """The reference formulation: per task, all its experts and all shared experts on all of its input rows."""

    def __init__(self, block: ExpertBlock):
        super().__init__()

        def experts(group) -> nn.ParameterList:
            H = group.hidden
            w_in = [group.w_in.detach()[:, e * 2 * H : (e + 1) * 2 * H].clone() for e in range(group.n_experts)]
            w_out = [group.w_out.detach()[e].clone() for e in range(group.n_experts)]
            return nn.ParameterList([nn.Parameter(w) for pair in zip(w_in, w_out, strict=True) for w in pair])

        def linear(gate) -> nn.Linear:
            out = nn.Linear(gate.proj.in_features, gate.proj.out_features)
            out.load_state_dict(gate.proj.state_dict())
            return out

        self.hidden = block.shared.hidden
        self.shared = experts(block.shared)
        self.task_experts = nn.ModuleDict({t: experts(g) for t, g in block.task_experts.items()})
        self.gates = nn.ModuleDict({t: linear(g) for t, g in block.task_gates.items()})
        self.shared_gate = linear(block.shared_gate) if block.shared_gate is not None else None

    def _run(self, params: nn.ParameterList, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for w_in, w_out in zip(params[0::2], params[1::2], strict=True):
            gate, up = (x @ w_in).split(self.hidden, dim=-1)
            outs.append((F.silu(gate) * up) @ w_out)
        return outs

    def _mix(self, gate: nn.Linear, x: torch.Tensor, outs: list[torch.Tensor]) -> torch.Tensor:
        weights = gate(x).float().softmax(-1)
        return sum(weights[:, e : e + 1] * out for e, out in enumerate(outs))

    def _own(self, task: str, x: torch.Tensor) -> list[torch.Tensor]:
        return self._run(self.task_experts[task], x) if task in self.task_experts else []

    def progressive(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """ple: ``inputs`` route -> (M, C); the output's routes in the same order (the shared route last)."""
        outs, own_outs, shared_outs = [], [], []
        for task, x in inputs.items():
            if task == SHARED:
                continue
            own = self._own(task, x)
            shared_outs = self._run(self.shared, inputs[SHARED])  # recomputed for every task
            outs.append(self._mix(self.gates[task], x, own + shared_outs))
            own_outs += own
        outs.append(self._mix(self.shared_gate, inputs[SHARED], own_outs + shared_outs))
        return torch.cat(outs)

    def per_task(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None) -> torch.Tensor:
        """cgc/mmoe: every task on every row of x; masked to each task's rows (``masks``), or one block of rows per
        task (``masks`` None: every example on every task)."""
        outs = [self._mix(self.gates[t], x, self._own(t, x) + self._run(self.shared, x)) for t in self.gates]
        if masks is None:
            return torch.cat(outs)
        return sum(out * masks[t].unsqueeze(-1) for t, out in zip(self.gates, outs, strict=True))


def matmul_seconds(a: torch.Tensor, b: torch.Tensor, repeats: int = 2) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return min(times)


def cpu_name() -> tuple[str, bool]:
    """The CPU's model name and whether it has AVX-512 (Linux /proc/cpuinfo; the platform's name elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or platform.machine(), False
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    return name or platform.machine(), any(f.startswith("avx512") for f in flags)


def main() -> None:
    gated = [name for name, v in VARIANTS.items() if v.gated]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ffn", choices=gated, default="ple", help="the variant whose expert layer is timed")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--labels", choices=["one", "all"], default="one", help="cgc/mmoe: tasks per example")
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
    ap.add_argument(
        "--release-freed-memory",
        action="store_true",
        help="leave glibc's allocator as it is (default: keep freed memory for reuse, as training does with the "
        "shipped configs' training.keep_freed_memory: fresh activations are not page-faulted in every step)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    variant = VARIANTS[args.ffn]
    K = args.tasks
    labels = "all" if variant.shared_route else args.labels
    fork = not variant.shared_route and variant.expert_layers is not None  # single-level: the fork layer
    if labels == "one" and args.batch % K:
        ap.error("--batch must be a multiple of --tasks")
    if labels == "all" and not fork and not variant.shared_route:
        ap.error("--labels all is for ple, cgc and mmoe (a stacked layer above the fork is timed on disjoint routes)")
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = False if args.release_freed_memory else keep_freed_memory()
    torch.manual_seed(args.seed)

    C, H, B, T = args.d_model, args.hidden, args.batch, args.seq
    tasks = [f"task{i}" for i in range(K)]
    block = ExpertBlock(variant, tasks, C, args.shared, args.experts, H, 0.7, shared_gate=True)
    with torch.no_grad():  # trained-like weights: non-zero down projections and gates
        for p in block.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    reference = RecomputePerTask(block)
    n_t = args.experts if variant.task_experts else 0
    n_s = args.shared
    everyone = torch.arange(B)
    mask = torch.ones(B, T, dtype=torch.bool)
    if variant.shared_route:
        layout = RouteLayout.build({**{t: everyone for t in tasks}, SHARED: everyone}, mask)
    elif labels == "all":
        layout = RouteLayout.build({t: everyone for t in tasks}, mask, fork=True)
    else:  # routes are contiguous blocks of sentences, so the routes' packed order is the batch order
        per_task = B // K
        layout = RouteLayout.build(
            {t: everyone[i * per_task : (i + 1) * per_task] for i, t in enumerate(tasks)}, mask, fork=fork
        )
    M = B * T  # tokens per example set (the bottom's tokens; a route's under ple or --labels all)
    x = torch.randn(M * (K + 1) if variant.shared_route else M, C, requires_grad=True)
    masks = None
    if labels == "one":
        masks = {}
        for t in tasks:
            masks[t] = torch.zeros(M)
            masks[t][layout.tokens(t)] = 1.0

    def optimised() -> torch.Tensor:
        return block(x, layout, fork=fork)[0]

    def recompute() -> torch.Tensor:
        if variant.shared_route:
            return reference.progressive({name: x[layout.tokens(name)] for name in layout.names})
        return reference.per_task(x, masks)

    with torch.no_grad():
        y = optimised()
        diff = (y - recompute()).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"optimised and recompute-per-task outputs differ by {diff}")
    dy = torch.randn_like(y)

    def step(forward, module) -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        forward().backward(dy)

    def timed(forward, module) -> float:
        start = time.perf_counter()
        for _ in range(args.iters):
            step(forward, module)
        return (time.perf_counter() - start) / args.iters

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    runs = {
        "optimised": lambda: timed(optimised, block),
        "recompute": lambda: timed(recompute, reference),
        "peak": lambda: matmul_seconds(a, b),
    }
    for _ in range(2):  # warm-up
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for r in range(args.repeats):  # alternate, rotating which goes first, to share any drift
        for name in order[r % 3 :] + order[: r % 3]:
            times[name].append(runs[name]())

    t_opt, t_ref = statistics.median(times["optimised"]), statistics.median(times["recompute"])
    peak = 2 * 2048**3 / statistics.median(times["peak"]) / 1e9
    per_token = 3 * (2 * C * 2 * H + 2 * H * C)  # forward + backward flops of one expert on one token
    routes_per_example = 1 if labels == "one" else K
    needed = n_s * M + n_t * M * routes_per_example  # expert passes over tokens
    recomputed = K * (n_t + n_s) * M  # every task: its experts and every shared expert on all of its M rows
    rounds = list(zip(times["recompute"], times["optimised"], strict=True))
    fraction_of_peak = [
        needed * per_token / opt / (2 * 2048**3 / mm) for opt, mm in zip(times["optimised"], times["peak"], strict=True)
    ]
    cpu, avx512 = cpu_name()
    result = {
        "benchmark": "ple_block",
        "variant": args.ffn,
        "layer": "middle layer" if not fork else "fork (the one expert layer)",
        "labels": labels,
        "tasks": K,
        "d_model": C,
        "expert_hidden": H,
        "n_shared_experts": n_s,
        "n_task_experts": n_t,
        "batch": B,
        "seq": T,
        "tokens_in": x.shape[0],
        "tokens_out": y.shape[0],
        "threads": torch.get_num_threads(),
        "keep_freed_memory": kept,
        "repeats": args.repeats,
        "iters": args.iters,
        "ms_per_step": round(t_opt * 1e3, 2),
        "recompute_ms_per_step": round(t_ref * 1e3, 2),
        # ratios: the median over rounds of each round's own ratio (both sides timed back to back, so a round's
        # load affects both); rates: of the median times
        "speedup": round(statistics.median(ref / opt for ref, opt in rounds), 3),
        "ideal_speedup": round(recomputed / needed, 3),
        "fraction_of_ideal": round(statistics.median(ref / opt for ref, opt in rounds) / (recomputed / needed), 3),
        "gflops": round(needed * per_token / t_opt / 1e9, 1),
        "recompute_gflops": round(recomputed * per_token / t_ref / 1e9, 1),
        "peak_gflops": round(peak, 1),
        "fraction_of_peak": round(statistics.median(fraction_of_peak), 3),
        "fraction_of_peak_of_medians": round(needed * per_token / t_opt / 1e9 / peak, 3),
        "rounds": {name: [round(t * 1e3, 1) for t in ts] for name, ts in times.items()},
        "max_abs_diff": diff,
        "cpu": cpu,
        "avx512": avx512,
        "load_average_1m": round(os.getloadavg()[0], 2),  # other processes on the machine skew every timing
        "torch": torch.__version__,
    }
    if args.json:
        print(json.dumps(result))
    else:
        r = result
        print(
            f"{args.ffn} block ({r['layer']}), {K} tasks, {r['tokens_in']} tokens in: {r['ms_per_step']:.1f} ms vs "
            f"{r['recompute_ms_per_step']:.1f} recompute-per-task: {r['speedup']:.2f}x "
            f"(ideal {r['ideal_speedup']:.2f}x, {r['fraction_of_ideal']:.0%} of it); "
            f"{r['gflops']:.0f} GFLOP/s = {r['fraction_of_peak']:.0%} of "
            f"{r['peak_gflops']:.0f} measured fp32 matmul peak ({cpu}{', AVX-512' if avx512 else ', no AVX-512'})"
        )


if __name__ == "__main__":
    main()
