"""The MMoE paper's synthetic two-task regression at controlled task correlation, on this project's expert blocks.

    python benchmarks/synthetic_correlation.py [--seeds 5] [--steps 1200] [--correlations 1.0,0.9,0.5,0.0]
                                               [--models mlp,mmoe,cgc,ple] [--json]

Prints markdown tables (model x correlation: mean ± std over seeds of the held-out MSE after the last step, averaged
over the two tasks and per task, and each seed's increase over its own loss at the highest correlation); ``--json``
also writes ``benchmarks/results/synthetic_correlation.json`` (``--out``). The default run is 80 trainings of 1,200
steps on one thread: about 9-15 minutes on the 2-core development machine, depending on its load.

Sources
  Ma et al., "Modeling Task Relationships in Multi-task Learning with Multi-gate Mixture-of-Experts", KDD 2018,
  https://doi.org/10.1145/3219819.3220007, section 3.2 (data), 3.3 and 5.1-5.2 (models, training, results):
    u1, u2 orthonormal in R^d; w1 = c u1, w2 = c (p u1 + sqrt(1 - p^2) u2), so cos(w1, w2) = p, the "task
    correlation"; x ~ N(0, I_d); y_k = w_k^T x + sum_{i=1..m} sin(alpha_i w_k^T x + beta_i) + eps_k, with
    eps_1, eps_2 ~ N(0, 0.01) i.i.d. alpha_i, beta_i, c and m are "given parameters" whose values the paper does not
    give (N(0, 0.01) is the label noise, not the distribution of alpha and beta). Section 5.1: input dimension 100;
    MMoE and OMoE with 8 experts, each a single-layer ReLU network of 16 units; towers one layer of 8 units; the
    shared-bottom baseline one layer of 113 units, to match the 13,056 expert + tower parameters; Adam with the
    learning rate grid-searched over {1e-4, 1e-3, 1e-2}; 200 runs per (model, correlation) with fresh data and
    initialisation, averaged; the figures plot one task's loss against training steps (Fig. 4: correlations 0.5, 0.9
    and identical tasks). Data-set size, batch size, step count, and whether the plotted loss is on training or held-
    out data are not given. Reported: every model does better at higher correlation; MMoE's gap between
    correlations is much smaller than OMoE's and shared-bottom's; both MoE models beat shared-bottom everywhere, and
    shared-bottom's run-to-run spread is much larger (section 5.2, "trainability").
  Tang et al., "Progressive Layered Extraction (PLE)", RecSys 2020, https://doi.org/10.1145/3383313.3412236,
  section 5.2: the same generator; "as hyper-parameters for data synthesis are not provided in [MMoE], we randomly
  sample alpha_i and beta_i following the standard normal distribution, and set c=1, m=10, d=512"; 1.4 million
  samples per correlation; towers three ReLU layers [256, 128, 64], single-layer experts, hyper-parameters tuned;
  Fig. 7 reports the "MTL gain" over single-task models: hard sharing and MMoE sometimes show a seesaw, PLE is best on
  both tasks at every correlation (+87.2% MTL gain over MMoE on average). The synthetic-data section reports no CGC
  result; the paper's PLE > CGC evidence is from its industrial data set (Tables 1-4).
  Also read: drawbridge/keras-mmoe, synthetic_demo.py (https://github.com/drawbridge/keras-mmoe), a public Keras
  re-implementation: d = 100, c = 0.3, m = 5, alpha, beta ~ N(0, 1), noise std 0.1, 8 experts x 16, towers of 8,
  Adam at 1e-4.

Data here: d = 100 (MMoE), c = 1, m = 10, alpha_i, beta_i ~ N(0, 1) (PLE), eps ~ N(0, 0.01) read as variance 0.01
(std 0.1, the noise floor of the MSE). u1, u2, alpha, beta, the 10,000-example test set and the stream of training
examples are drawn per seed and shared by every correlation and every model (paired design: for a seed, only w2
depends on p, and each model starts from the same initialisation at every p). Training examples are fresh every
step (PLE's 1.4M examples are effectively never revisited; --train-size N samples a fixed set instead). Either
task's labels have the same distribution at every p, so a change of loss with p comes from sharing, up to the
noise of a fixed initialisation meeting a different direction w2 (the single-task reference 'stl' measures that).

Models (every one built from mtl_decoder's blocks and fed x directly: d_model = d = 100, no input projection; each
expert is the project's SwiGLU expert 100 -> hidden -> 100, 300 x hidden weights; every model has 8 x 16 = 128
expert hidden units, 38,400 expert weights; each task's tower is Linear(100, 8)-ReLU-Linear(8, 1)):
  mlp   hard sharing: one ExpertGroup of one expert with hidden 128 (the project's 'mlp' variant), then the towers.
  mmoe  ExpertBlock('mmoe'): 8 shared experts of 16, one gate per task, gates read the input (the paper's MMoE).
  cgc   ExpertBlock('cgc'): 2 experts per task + 4 shared, of 16 (one extraction level).
  ple   two ExpertBlock('ple') levels of 1 expert per task + 2 shared, of 16; the first level has the shared gate,
        the last none, as in the paper and in MTLDecoder; level 2 reads level 1's per-route outputs.
  stl   reference, not in the default list: two single-task networks, each one expert of hidden 64 + a tower.
Each example is one token (T = 1); routes are built as MTLDecoder.route_layout does (every example on every task's
route, plus the 'shared' route for ple). Levels are stacked as in the papers, f(h), not as residual branches;
--residual stacks them as the decoder does, h + f(RMSNorm(h)). Gates keep the project's initialisation (zero
weights, shared logits biased to --initial-shared-weight, 0.7 as in the project's configs; with 4 of 6 and 2 of 3
experts shared that is within 0.03 of uniform).

Initialisation (--init): the project draws w_in from N(0, 0.02) and zero-initialises w_out, because in the decoder
every block is a residual branch and a layer should start as the identity ('project'). In this non-residual network
a zero w_out makes each block's output zero; PLE's second level then reads zeros, and no weight below its w_out ever
gets a gradient: PLE does not train at all (held-out MSE stays at the label variance, about 7). The default,
'nonzero-wout', keeps the project's w_in and draws w_out from N(0, 1/hidden); 'fanin' also draws w_in from
N(0, 1/d_model). The results file reports what each gives.

Training: Adam, one learning rate for every model (3e-3, constant, then linear decay to 0 over the last 20% of the
steps), batch 128, loss = sum of the two tasks' MSE, 1,200 steps (the 10-minute budget; the nets are not converged
there: each run's held-out curve is in the results file, and --steps runs longer). Reported: held-out MSE after
the last step. All runs are deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

# ------------------------------------------------------------------------------------------------------------------
# Adapter: every use of mtl_decoder's API is in this section (ExpertGroup, ExpertBlock, RouteLayout, SHARED).
# ------------------------------------------------------------------------------------------------------------------
from mtl_decoder.model import SHARED, ExpertBlock, ExpertGroup, RouteLayout

TASKS = ["t1", "t2"]


def make_expert_group(n_experts: int, d_model: int, hidden: int) -> nn.Module:
    return ExpertGroup(n_experts, d_model, hidden)


def run_expert_group(group: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(M, C) -> (M, C): the group's single expert."""
    return group(x)[0]


def make_block(
    variant: str, d_model: int, n_shared: int, n_task: int, hidden: int, initial_shared_weight: float, last: bool
) -> nn.Module:
    return ExpertBlock(
        variant,
        TASKS,
        d_model,
        n_shared,
        n_task,
        hidden,
        initial_shared_weight,
        shared_gate=not last,
    )


def build_layout(variant: str, batch: int) -> RouteLayout:
    """Every example on every task's route (+ the shared route for ple), one token per example."""
    everyone = torch.arange(batch)
    routes = {t: everyone for t in TASKS}
    if variant == "ple":
        routes[SHARED] = everyone
    return RouteLayout.build(routes, torch.ones(batch, 1, dtype=torch.bool))


def pack(x: torch.Tensor, layout: RouteLayout) -> torch.Tensor:
    """(B, C) examples -> (M, C) packed tokens, grouped by route."""
    return x.unsqueeze(1)[layout.row_example].flatten(0, 1)[layout.token_index]


def run_block(block: nn.Module, x: torch.Tensor, layout: RouteLayout) -> torch.Tensor:
    out, _gates = block(x, layout)
    return out


def task_tokens(layout: RouteLayout, task: str) -> slice:
    return layout.tokens(task)


def init_experts(model: nn.Module, how: str) -> None:
    """'project': the project's own (w_in ~ N(0, 0.02), w_out = 0); 'nonzero-wout': the project's w_in, w_out ~
    N(0, 1/hidden); 'fanin': w_in ~ N(0, 1/d_model), w_out ~ N(0, 1/hidden)."""
    for m in model.modules():
        if isinstance(m, ExpertGroup):
            m.reset_parameters()
            if how == "project":
                continue
            with torch.no_grad():
                if how == "fanin":
                    m.w_in.normal_(0.0, m.w_in.shape[0] ** -0.5)
                m.w_out.normal_(0.0, m.hidden**-0.5)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------


def tower(d_model: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_model, width), nn.ReLU(), nn.Linear(width, 1))


class Level(nn.Module):
    """One level: ``f(h)``, or with --residual the decoder's ``h + f(RMSNorm(h))``."""

    def __init__(self, f, d: int, residual: bool):
        super().__init__()
        self.f, self.norm = f, nn.RMSNorm(d) if residual else None

    def forward(self, h: torch.Tensor, *extra) -> torch.Tensor:
        return self.f(h, *extra) if self.norm is None else h + self.f(self.norm(h), *extra)


class HardSharing(nn.Module):
    def __init__(self, d: int, hidden: int, tower_width: int, residual: bool):
        super().__init__()
        self.bottom = make_expert_group(1, d, hidden)
        self.level = Level(lambda h: run_expert_group(self.bottom, h), d, residual)
        self.towers = nn.ModuleList(tower(d, tower_width) for _ in TASKS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.level(x)
        return torch.cat([t(h) for t in self.towers], dim=1)


class SingleTask(nn.Module):
    def __init__(self, d: int, hidden: int, tower_width: int, residual: bool):
        super().__init__()
        self.bottoms = nn.ModuleList(make_expert_group(1, d, hidden) for _ in TASKS)
        self.levels = nn.ModuleList(Level(lambda h, b=b: run_expert_group(b, h), d, residual) for b in self.bottoms)
        self.towers = nn.ModuleList(tower(d, tower_width) for _ in TASKS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([t(lv(x)) for lv, t in zip(self.levels, self.towers, strict=True)], dim=1)


class Gated(nn.Module):
    """One or more expert blocks (mmoe, cgc: one level; ple: two), then per-task towers."""

    def __init__(self, variant: str, levels: int, d: int, n_shared: int, n_task: int, hidden: int, args):
        super().__init__()
        self.variant = variant
        self.blocks = nn.ModuleList(
            make_block(variant, d, n_shared, n_task, hidden, args.initial_shared_weight, last=i == levels - 1)
            for i in range(levels)
        )
        self.levels = [Level(lambda h, lay, b=b: run_block(b, h, lay), d, args.residual) for b in self.blocks]
        self.norms = nn.ModuleList(lv.norm for lv in self.levels if lv.norm is not None)
        self.towers = nn.ModuleList(tower(d, args.tower) for _ in TASKS)
        self._layouts: dict[int, RouteLayout] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        if B not in self._layouts:
            self._layouts[B] = build_layout(self.variant, B)
        layout = self._layouts[B]
        h = pack(x, layout)
        for level in self.levels:
            h = level(h, layout)
        return torch.cat([t(h[task_tokens(layout, name)]) for t, name in zip(self.towers, TASKS, strict=True)], dim=1)


def build_model(name: str, args: argparse.Namespace) -> nn.Module:
    d, H, tw = args.dim, args.hidden, args.tower
    if name == "mlp":
        model = HardSharing(d, 8 * H, tw, args.residual)
    elif name == "stl":
        model = SingleTask(d, 4 * H, tw, args.residual)
    elif name == "mmoe":
        model = Gated("mmoe", 1, d, 8, 0, H, args)
    elif name == "cgc":
        model = Gated("cgc", 1, d, 4, 2, H, args)
    elif name == "ple":
        model = Gated("ple", 2, d, 2, 1, H, args)
    else:
        raise SystemExit(f"unknown model {name!r} (choose from mlp, mmoe, cgc, ple, stl)")
    init_experts(model, args.init)
    return model


# ------------------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------------------


class SeedData:
    """Everything drawn once per seed (u1, u2, alpha, beta, the test set and, unless --train-size is 0, the training
    set); the labels of correlation p are computed from them, so only w2 depends on p."""

    def __init__(self, seed: int, args: argparse.Namespace):
        self.seed, self.args = seed, args
        g = torch.Generator().manual_seed(10_000 + seed)
        q, _ = torch.linalg.qr(torch.randn(args.dim, 2, generator=g, dtype=torch.float64))
        self.u1, self.u2 = q[:, 0], q[:, 1]  # orthonormal
        self.alpha = torch.randn(args.sines, generator=g)
        self.beta = torch.randn(args.sines, generator=g)
        self.test = self._draw(args.test_size, g)
        self.train = self._draw(args.train_size, g) if args.train_size else None

    def _draw(self, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, self.args.dim, generator=g)
        eps = torch.randn(n, 2, generator=g) * math.sqrt(self.args.noise_var)
        return x, eps

    def labels(self, x: torch.Tensor, eps: torch.Tensor, p: float) -> torch.Tensor:
        c = self.args.scale
        w = torch.stack([c * self.u1, c * (p * self.u1 + math.sqrt(max(0.0, 1 - p * p)) * self.u2)], dim=1)
        z = (x.double() @ w).float()  # (n, 2): w_k^T x
        return z + torch.sin(self.alpha * z.unsqueeze(-1) + self.beta).sum(-1) + eps

    def at(self, p: float) -> Data:
        return Data(self, p)


class Data:
    """The data of one (correlation, seed): a fixed test set, and training batches (a fixed training set sampled
    with replacement, or fresh examples every step when --train-size is 0), the same for every model."""

    def __init__(self, seed_data: SeedData, p: float):
        self.sd, self.p = seed_data, p
        self.x_test, self.y_test = seed_data.test[0], seed_data.labels(*seed_data.test, p)
        if seed_data.train is not None:
            self.x_train, self.y_train = seed_data.train[0], seed_data.labels(*seed_data.train, p)

    def batches(self, batch: int):
        g = torch.Generator().manual_seed(20_000 + self.sd.seed)
        while True:
            if self.sd.train is None:
                x, eps = self.sd._draw(batch, g)
                yield x, self.sd.labels(x, eps, self.p)
            else:
                idx = torch.randint(0, self.x_train.shape[0], (batch,), generator=g)
                yield self.x_train[idx], self.y_train[idx]


# ------------------------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    model.eval()
    err = ((model(x) - y) ** 2).mean(0)
    model.train()
    return err.tolist()


def train_one(name: str, seed: int, data: Data, args: argparse.Namespace) -> dict:
    torch.manual_seed(seed)  # the same initialisation at every correlation
    model = build_model(name, args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    decay = {
        "constant": lambda step: 1.0,
        "linear": lambda step: 1.0 - step / args.steps,
        "cosine": lambda step: 0.5 * (1.0 + math.cos(math.pi * step / args.steps)),
        "tail": lambda step: min(1.0, 5.0 * (1.0 - step / args.steps)),  # constant, then linear to 0 over the last 20%
    }[args.schedule]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, decay)
    checkpoints = {round(k * args.steps / args.curve_points) for k in range(1, args.curve_points)}
    curve, train_loss = [], []
    for step, (x, y) in zip(range(1, args.steps + 1), data.batches(args.batch), strict=False):
        loss = ((model(x) - y) ** 2).mean(0).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        train_loss.append(loss.item() / 2)
        if step in checkpoints:
            curve.append((step, statistics.fmean(test_mse(model, data.x_test, data.y_test))))
    per_task = test_mse(model, data.x_test, data.y_test)
    curve.append((args.steps, statistics.fmean(per_task)))
    tail = train_loss[-max(1, args.steps // 20) :]
    return {"test_mse": per_task, "train_mse_tail": statistics.fmean(tail), "curve": curve}


def n_params(name: str, args: argparse.Namespace) -> dict:
    model = build_model(name, args)
    experts = sum(p.numel() for m in model.modules() if isinstance(m, ExpertGroup) for p in m.parameters())
    towers = sum(p.numel() for p in model.towers.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"experts": experts, "towers": towers, "gates": total - experts - towers, "total": total}


# ------------------------------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------------------------------


def machine() -> dict:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())
    return {
        "cpu": models[0] if models else platform.processor() or platform.machine(),
        "avx512": sorted(f for f in flags if f.startswith("avx512")) or False,
        "logical_cpus": len(models) or None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(values: list[float]) -> str:
    m, s = mean_std(values)
    return f"{m:.4f} ± {s:.4f}"


def summarise(runs: dict, models: list[str], corrs: list[float], seeds: list[int]) -> list[dict]:
    rows = []
    for name in models:
        for p in corrs:
            per_seed = [runs[name, p, s] for s in seeds]
            avg = [statistics.fmean(r["test_mse"]) for r in per_seed]
            m, sd = mean_std(avg)
            row = {
                "model": name,
                "correlation": p,
                "seeds": len(seeds),
                "loss_mean": m,
                "loss_std": sd,
                "loss_task1_mean": mean_std([r["test_mse"][0] for r in per_seed])[0],
                "loss_task1_std": mean_std([r["test_mse"][0] for r in per_seed])[1],
                "loss_task2_mean": mean_std([r["test_mse"][1] for r in per_seed])[0],
                "loss_task2_std": mean_std([r["test_mse"][1] for r in per_seed])[1],
                "train_loss_mean": statistics.fmean(r["train_mse_tail"] for r in per_seed),
                "per_seed": {str(s): r for s, r in zip(seeds, per_seed, strict=True)},
            }
            top = max(corrs)
            if p != top:  # paired by seed: the same data, initialisation and batches at both correlations
                base = [statistics.fmean(runs[name, top, s]["test_mse"]) for s in seeds]
                diffs = [a - b for a, b in zip(avg, base, strict=True)]
                ratios = [a / b for a, b in zip(avg, base, strict=True)]
                row[f"increase_vs_{top}_mean"], row[f"increase_vs_{top}_std"] = mean_std(diffs)
                row[f"ratio_vs_{top}_mean"], row[f"ratio_vs_{top}_std"] = mean_std(ratios)
            rows.append(row)
    return rows


def print_tables(rows: list[dict], models: list[str], corrs: list[float]) -> None:
    by = {(r["model"], r["correlation"]): r for r in rows}
    head = "| model | " + " | ".join(f"p = {p}" for p in corrs) + " |"
    sep = "| --- " * (len(corrs) + 1) + "|"

    def table(title: str, cell) -> None:
        print(f"\n{title}\n\n{head}\n{sep}")
        for name in models:
            print(f"| {name} | " + " | ".join(cell(by[name, p]) for p in corrs) + " |")

    table(
        "Held-out MSE, mean of the two tasks (mean ± std over seeds)",
        lambda r: f"{r['loss_mean']:.4f} ± {r['loss_std']:.4f}",
    )
    top = max(corrs)
    key = f"increase_vs_{top}"
    table(
        f"Increase over the same seed's loss at p = {top} (paired; mean ± std)",
        lambda r: f"{r[key + '_mean']:+.4f} ± {r[key + '_std']:.4f}" if key + "_mean" in r else "-",
    )
    table(
        f"Ratio to the same seed's loss at p = {top} (paired; mean ± std)",
        lambda r: f"{r[f'ratio_vs_{top}_mean']:.2f} ± {r[f'ratio_vs_{top}_std']:.2f}" if key + "_mean" in r else "-",
    )
    for k in (1, 2):
        table(
            f"Task {k} held-out MSE (mean ± std)",
            lambda r, k=k: f"{r[f'loss_task{k}_mean']:.4f} ± {r[f'loss_task{k}_std']:.4f}",
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (0 .. N-1)")
    ap.add_argument("--steps", type=int, default=1200, help="training steps per run")
    ap.add_argument("--correlations", default="1.0,0.9,0.5,0.0")
    ap.add_argument("--models", default="mlp,mmoe,cgc,ple", help="from mlp, mmoe, cgc, ple, stl")
    ap.add_argument("--json", action="store_true", help="write the result file (--out)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "synthetic_correlation.json"))
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (peak)")
    ap.add_argument(
        "--schedule", choices=["constant", "linear", "cosine", "tail"], default="tail", help="learning rate decay"
    )
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=16, help="hidden units of each expert (mlp: 8x, stl: 4x per task)")
    ap.add_argument("--tower", type=int, default=8, help="hidden units of each task tower")
    ap.add_argument("--init", choices=["nonzero-wout", "project", "fanin"], default="nonzero-wout")
    ap.add_argument("--initial-shared-weight", type=float, default=0.7, help="the project's gate init (default 0.7)")
    ap.add_argument("--residual", action="store_true", help="levels as in the decoder: h + block(RMSNorm(h))")
    ap.add_argument("--train-size", type=int, default=0, help="fixed training set size; 0: fresh examples every step")
    ap.add_argument("--test-size", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=100, help="input dimension d (= d_model)")
    ap.add_argument("--sines", type=int, default=10, help="m, the number of sine terms")
    ap.add_argument("--scale", type=float, default=1.0, help="c, the norm of w1 and w2")
    ap.add_argument("--noise-var", type=float, default=0.01, help="label noise variance")
    ap.add_argument("--curve-points", type=int, default=6, help="held-out evaluations during a run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 was faster for these tiny nets)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    corrs = [float(c) for c in args.correlations.split(",")]
    seeds = list(range(args.seeds))
    params = {name: n_params(name, args) for name in models}

    start, runs, label_corr, label_var = time.perf_counter(), {}, {}, {}
    for seed in seeds:
        seed_data = SeedData(seed, args)
        for p in corrs:
            data = seed_data.at(p)
            y = data.y_test
            label_corr[p, seed] = torch.corrcoef(y.T)[0, 1].item()
            label_var[p, seed] = y.var(0).mean().item()
            for name in models:
                runs[name, p, seed] = train_one(name, seed, data, args)
        print(f"seed {seed} done, {time.perf_counter() - start:.0f} s", flush=True)
    wall = time.perf_counter() - start

    rows = summarise(runs, models, corrs, seeds)
    print_tables(rows, models, corrs)
    print(
        "\nLabel Pearson correlation (test set, mean over seeds): "
        + ", ".join(f"p = {p}: {statistics.fmean(label_corr[p, s] for s in seeds):.3f}" for p in corrs)
    )
    variance = statistics.fmean(label_var.values())
    print(f"Label variance (mean of the two tasks): {variance:.3f}; noise floor {args.noise_var}")
    print("Parameters: " + ", ".join(f"{n} {params[n]['total']:,} (experts {params[n]['experts']:,})" for n in models))
    mach = machine()
    print(
        f"Machine: {mach['cpu']}, AVX-512: {'yes' if mach['avx512'] else 'no'}, torch {mach['torch']}, "
        f"{mach['torch_threads']} thread(s); wall time {wall:.0f} s"
    )

    if args.json:
        result = {
            "benchmark": "synthetic_correlation",
            "results": rows,
            "label_pearson": {str(p): [label_corr[p, s] for s in seeds] for p in corrs},
            "label_variance": variance,
            "parameters": params,
            "settings": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
            "machine": mach,
            "wall_s": round(wall, 1),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "commit": git_commit(),
        }
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
