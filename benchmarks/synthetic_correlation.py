"""The MMoE paper's synthetic two-task regression at controlled task correlation, on this project's expert blocks.

    python benchmarks/synthetic_correlation.py [--seeds 5] [--first-seed 0] [--max-steps 6000]
                                               [--correlations 1.0,0.0] [--models mlp,mmoe,cgc,ple,stl] [--json]
    python benchmarks/synthetic_correlation.py --merge part0.json part3.json   # seeds run in parts, into --out
    python benchmarks/synthetic_correlation.py --table                         # the tables of --out, no training

Trains every (model, correlation, seed) to convergence (below), then prints markdown tables computed from the
per-seed numbers alone (held-out MSE per model, steps to the stop, every pair of models compared seed by seed, the
change of each seed's loss as the correlation falls) and the claims on which the seeds agree; ``--json`` also
writes ``benchmarks/results/synthetic_correlation.json`` (``--out``), with every seed's validation curve. ``--table``
prints the same tables from that file: docs/synthetic_correlation.md is made of them.

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
  stl   the single-task reference: two networks, one per task, each one expert of hidden 64 + a tower.
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
N(0, 1/d_model). The stored run uses the default.

Training: Adam, one learning rate for every model (--lr 3e-3), batch 128, loss = sum of the two tasks' MSE.
Convergence, per run: the validation MSE (--val-size 2,000 examples of the seed, apart from the 10,000 test
examples) every --eval-every 100 steps; a stage ends when the best of its last --window 10 evaluations beats the
best before them by less than --eps 1% (``flattened``; best against best, so a noisy plateau ends and a lucky
evaluation is not progress); the first stage's end restores the best state and divides the learning rate by 10
(--lr-drops 1, --lr-factor 0.1), the second stage's end is the stop (``StopRule``). --max-steps caps a run; a run
stopped by the cap is marked 'capped' in the results and counted in the tables. Reported: the test MSE of the
state with the lowest validation MSE. With a fixed 1,200 steps (this script before) hard sharing and the
single-task nets had not converged on three of five seeds, so the comparison measured speed of convergence. The
drop and the best-state restore also catch divergence: at a constant 3e-3 a ple run was seen to blow up after
7,500 steps. All runs are deterministic for a given seed and thread count.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or imported by the tests
from synthetic_correlation_models import build_model, n_params
from synthetic_correlation_report import compare, git_commit, machine, merge, summarise, tables

# ------------------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------------------


class SeedData:
    """Everything drawn once per seed (u1, u2, alpha, beta, the test set, the training set unless --train-size is 0,
    and the validation set that the stop rule reads); the labels of correlation p are computed from them, so only w2
    depends on p."""

    def __init__(self, seed: int, args: argparse.Namespace):
        self.seed, self.args = seed, args
        g = torch.Generator().manual_seed(10_000 + seed)
        q, _ = torch.linalg.qr(torch.randn(args.dim, 2, generator=g, dtype=torch.float64))
        self.u1, self.u2 = q[:, 0], q[:, 1]  # orthonormal
        self.alpha = torch.randn(args.sines, generator=g)
        self.beta = torch.randn(args.sines, generator=g)
        self.test = self._draw(args.test_size, g)
        self.train = self._draw(args.train_size, g) if args.train_size else None
        self.val = self._draw(args.val_size, g)  # drawn last: the test set and the training stream stay as before

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
    """The data of one (correlation, seed): fixed validation and test sets, and training batches (a fixed training set
    sampled with replacement, or fresh examples every step when --train-size is 0), the same for every model."""

    def __init__(self, seed_data: SeedData, p: float):
        self.sd, self.p = seed_data, p
        self.x_test, self.y_test = seed_data.test[0], seed_data.labels(*seed_data.test, p)
        self.x_val, self.y_val = seed_data.val[0], seed_data.labels(*seed_data.val, p)
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
# Training to convergence
# ------------------------------------------------------------------------------------------------------------------


def flattened(losses: list[float], window: int, eps: float) -> bool:
    """True when the best of the last ``window`` evaluations beats the best of those before them by less than the
    relative margin ``eps``; False while there is no earlier evaluation to compare with. Comparing best with best
    (not last with last) makes a noisy plateau count as flat and a single lucky evaluation not count as progress
    beyond ``eps``."""
    if len(losses) <= window:
        return False
    return min(losses[-window:]) > (1.0 - eps) * min(losses[:-window])


class StopRule:
    """Decides, after each held-out evaluation, whether to go on, drop the learning rate or stop.

    A stage ends when its losses have ``flattened``; after the first ``drops`` stages the learning rate drops (the
    training loop restores the best state first) and a new stage starts from the best loss so far, so the next
    stage must beat that by ``eps`` within ``window`` evaluations to go on; the last stage's end is the stop.
    Non-finite losses count as no progress."""

    def __init__(self, window: int, eps: float, drops: int):
        if window < 1 or not 0.0 <= eps < 1.0 or drops < 0:
            raise ValueError(f"StopRule needs window >= 1, 0 <= eps < 1, drops >= 0 (got {window}, {eps}, {drops})")
        self.window, self.eps, self.drops = window, eps, drops
        self.stage, self.history = 0, []

    def update(self, loss: float) -> str:
        """'go', 'drop' or 'stop'."""
        self.history.append(loss if math.isfinite(loss) else math.inf)
        if not flattened(self.history, self.window, self.eps):
            return "go"
        if self.stage == self.drops:
            return "stop"
        self.stage += 1
        self.history = [min(self.history)]
        return "drop"


@torch.no_grad()
def test_mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    model.eval()
    err = ((model(x) - y) ** 2).mean(0)
    model.train()
    return err.tolist()


def train_one(name: str, seed: int, data: Data, args: argparse.Namespace) -> dict:
    """Adam at --lr, the validation MSE every --eval-every steps, the StopRule's drops and stop, at most --max-steps
    steps; the reported test MSE is the checkpoint with the lowest validation MSE."""
    torch.manual_seed(seed)  # the same initialisation at every correlation
    model = build_model(name, args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rule = StopRule(args.window, args.eps, args.lr_drops)
    best_loss, best_step, best_state = math.inf, 0, copy.deepcopy((model.state_dict(), opt.state_dict()))
    steps, val, drops, train_loss = [], [], [], []
    batches, step, capped = data.batches(args.batch), 0, False
    while True:
        for x, y in islice(batches, args.eval_every):
            loss = ((model(x) - y) ** 2).mean(0).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            train_loss.append(loss.item() / 2)
        step += args.eval_every
        v = statistics.fmean(test_mse(model, data.x_val, data.y_val))
        steps.append(step)
        val.append(v)
        if v < best_loss:  # False for NaN: a diverged state is never kept
            best_loss, best_step = v, step
            best_state = copy.deepcopy((model.state_dict(), opt.state_dict()))
        decision = rule.update(v)
        if decision == "stop":
            break
        if step >= args.max_steps:
            capped = True
            break
        if decision == "drop":
            model.load_state_dict(best_state[0])
            opt.load_state_dict(best_state[1])  # also brings back the lr of the best state's stage: set it anew
            drops.append(step)
            for group in opt.param_groups:
                group["lr"] = args.lr * args.lr_factor ** len(drops)
    model.load_state_dict(best_state[0])
    per_task = test_mse(model, data.x_test, data.y_test)
    return {
        "loss": statistics.fmean(per_task),
        "test_mse": per_task,
        "best_step": best_step,
        "best_val_mse": best_loss,
        "stopped_at": step,
        "capped": capped,
        "lr_drops": drops,
        "train_mse_tail": statistics.fmean(train_loss[-args.eval_every :]),
        "steps": steps,
        "val_mse": val,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (--first-seed .. --first-seed + N - 1)")
    ap.add_argument("--first-seed", type=int, default=0, help="first seed (run seeds in parts, then --merge them)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="combine results files of other seeds into --out")
    ap.add_argument("--correlations", default="1.0,0.0", help="task correlations p (the stored run: 1.0,0.0)")
    ap.add_argument("--models", default="mlp,mmoe,cgc,ple,stl", help="from mlp, mmoe, cgc, ple, stl")
    ap.add_argument("--json", action="store_true", help="write the result file (--out)")
    ap.add_argument("--table", action="store_true", help="print the markdown tables of --out and exit (no training)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "synthetic_correlation.json"))
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate of the first stage")
    ap.add_argument("--max-steps", type=int, default=6_000, help="cap on the steps of one training (reported)")
    ap.add_argument("--eval-every", type=int, default=100, help="steps between validation evaluations")
    ap.add_argument("--window", type=int, default=10, help="evaluations without eps progress that end a stage")
    ap.add_argument("--eps", type=float, default=0.01, help="relative improvement of the best loss that counts")
    ap.add_argument("--lr-drops", type=int, default=1, help="stages after the first, each at lr x --lr-factor")
    ap.add_argument("--lr-factor", type=float, default=0.1, help="learning rate factor at each drop")
    ap.add_argument("--agree", type=float, default=1.0, help="share of seeds that must agree for a verdict")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=16, help="hidden units of each expert (mlp: 8x, stl: 4x per task)")
    ap.add_argument("--tower", type=int, default=8, help="hidden units of each task tower")
    ap.add_argument("--init", choices=["nonzero-wout", "project", "fanin"], default="nonzero-wout")
    ap.add_argument("--initial-shared-weight", type=float, default=0.7, help="the project's gate init (default 0.7)")
    ap.add_argument("--residual", action="store_true", help="levels as in the decoder: h + block(RMSNorm(h))")
    ap.add_argument("--train-size", type=int, default=0, help="fixed training set size; 0: fresh examples every step")
    ap.add_argument("--val-size", type=int, default=2_000, help="validation examples the stop rule reads")
    ap.add_argument("--test-size", type=int, default=10_000, help="test examples of the reported loss")
    ap.add_argument("--dim", type=int, default=100, help="input dimension d (= d_model)")
    ap.add_argument("--sines", type=int, default=10, help="m, the number of sine terms")
    ap.add_argument("--scale", type=float, default=1.0, help="c, the norm of w1 and w2")
    ap.add_argument("--noise-var", type=float, default=0.01, help="label noise variance")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 was faster for these tiny nets)")
    args = ap.parse_args(argv)
    if args.max_steps < args.eval_every or args.eval_every < 1:
        ap.error(f"--max-steps ({args.max_steps}) must be at least --eval-every ({args.eval_every}) >= 1")
    StopRule(args.window, args.eps, args.lr_drops)  # validates them
    if not 0.5 < args.agree <= 1.0:
        ap.error(f"--agree must be in (0.5, 1] (got {args.agree}): more than half the seeds, so a verdict is one-sided")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table:
        print(tables(json.loads(Path(args.out).read_text())))
        return
    if args.merge:
        result = merge([json.loads(Path(f).read_text()) for f in args.merge])
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(tables(result) + f"\nwrote {args.out}")
        return
    torch.set_num_threads(args.threads)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    corrs = [float(c) for c in args.correlations.split(",")]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    params = {name: n_params(name, args) for name in models}
    commit = git_commit()  # the code that runs, not whatever is checked out when it ends

    start, cpu0, runs, label_corr, label_var = time.perf_counter(), time.process_time(), {}, {}, {}
    for seed in seeds:
        seed_data = SeedData(seed, args)
        for p in corrs:
            data = seed_data.at(p)
            y = data.y_test
            label_corr[p, seed] = torch.corrcoef(y.T)[0, 1].item()
            label_var[p, seed] = y.var(0).mean().item()
            for name in models:
                t = time.process_time()
                runs[name, p, seed] = {**train_one(name, seed, data, args), "cpu_s": round(time.process_time() - t, 2)}
        print(
            f"seed {seed} done, {time.perf_counter() - start:.0f} s, {time.process_time() - cpu0:.0f} CPU-s", flush=True
        )
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0

    result = {
        "benchmark": "synthetic_correlation",
        "results": summarise(runs, models, corrs, seeds),
        "label_pearson": {str(p): [label_corr[p, s] for s in seeds] for p in corrs},
        "label_variance": statistics.fmean(label_var.values()),
        "parameters": params,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "out", "table", "merge")},
        "machine": machine(),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit,
    }
    result["comparisons"] = compare(result["results"], models, corrs, args.agree)
    print(tables(result))
    print("Parameters: " + ", ".join(f"{n} {params[n]['total']:,} (experts {params[n]['experts']:,})" for n in models))
    if args.json:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
