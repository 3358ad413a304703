"""SmoothQuant W8A8 on SmolLM2's first 16 blocks, before it is built into ``--precision int8`` (issue 36 item 1):
the state error against fp32 and the speed of each way of quantising every Linear, on one CPU in one run.

    python benchmarks/smoothquant_probe.py [--sentences 256] [--rounds 3]

The trunk: benchmarks/runs/smollm2-135m-instruct (benchmarks/smollm2_checkpoint.py), blocks 1-16, float32, one thread.
Smoothing (Xiao et al., 2023): per input channel j of a Linear, s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha),
calibrated on 128 CoNLL-2003 + 128 SST-2 training texts; the activation is divided by s (folded into the RMSNorm
before q/k/v and gate/up, into up_proj's rows before down_proj, into v_proj's rows before o_proj, per key-value
head) and the weight's column multiplied by it, so the float32 function is unchanged (checked: ``smoothed_fp32``).
Then every Linear runs int8: weights per output channel, activations per tensor as each batch runs (torch's
dynamic kernels, 8-bit on a VNNI CPU: ``reduce_range`` off), or per token for down_proj (``torch._int_mm``).
Error: per real token of the first ``--sentences`` CoNLL-2003 test sentences, |h - h_fp32| / |h_fp32| (median,
90th percentile). Speed: words per CPU-second over the same sentences, batches of 32 sorted by length, the median
of ``--rounds`` rounds, every variant timed in each round in turn. Writes benchmarks/results/smoothquant_probe.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer

HERE = Path(__file__).resolve().parent
CHECKPOINT = HERE / "runs" / "smollm2-135m-instruct"
DATA = HERE.parent.parent / "shared" / "data"
BLOCKS = 16


def load():
    m = AutoModel.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32).eval()
    m.layers = m.layers[:BLOCKS]
    m.config.num_hidden_layers = BLOCKS
    return m


def batches(texts, size=32):
    tok = TOKENIZER[0]
    texts = sorted(texts, key=len)
    for i in range(0, len(texts), size):
        enc = tok(texts[i : i + size], return_tensors="pt", padding=True)
        yield enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def states(m, texts):
    out = []
    for ids, mask in batches(texts):
        h = m(input_ids=ids, attention_mask=mask).last_hidden_state
        out += [h[i][mask[i].bool()] for i in range(len(ids))]
    return out


@torch.no_grad()
def calibrate(m, texts):
    """max |x_j| of the input of every Linear, over real tokens."""
    amax = {}
    hooks = []
    cur_mask = {}

    def hook(name):
        def f(mod, inp):
            x = inp[0].detach().abs()
            x = x[cur_mask["m"].bool()] if x.dim() == 3 else x
            v = x.reshape(-1, x.shape[-1]).amax(0)
            amax[name] = torch.maximum(amax[name], v) if name in amax else v

        return f

    for n, mod in m.named_modules():
        if isinstance(mod, nn.Linear):
            hooks.append(mod.register_forward_pre_hook(hook(n)))
    for ids, mask in batches(texts):
        cur_mask["m"] = mask
        m(input_ids=ids, attention_mask=mask)
    for h in hooks:
        h.remove()
    return amax


def scales(amax_x, weights, alpha):
    wmax = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
    s = (amax_x.clamp(min=1e-5) ** alpha) / (wmax.clamp(min=1e-5) ** (1 - alpha))
    return s.clamp(min=1e-5)


@torch.no_grad()
def smooth(m, amax, alpha):
    for i, layer in enumerate(m.layers):
        a, mlp = layer.self_attn, layer.mlp
        p = f"layers.{i}."
        s = scales(amax[p + "self_attn.q_proj"], [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], alpha)
        layer.input_layernorm.weight.div_(s)
        for lin in (a.q_proj, a.k_proj, a.v_proj):
            lin.weight.mul_(s)
        s = scales(amax[p + "mlp.gate_proj"], [mlp.gate_proj.weight, mlp.up_proj.weight], alpha)
        layer.post_attention_layernorm.weight.div_(s)
        for lin in (mlp.gate_proj, mlp.up_proj):
            lin.weight.mul_(s)
        # down_proj reads act(gate) * up: up's output rows carry the scale
        s = scales(amax[p + "mlp.down_proj"], [mlp.down_proj.weight], alpha)
        mlp.up_proj.weight.div_(s[:, None])
        mlp.down_proj.weight.mul_(s)
        # o_proj reads the heads' values: v's output rows carry it, shared by the query heads of a kv head
        heads, kv = m.config.num_attention_heads, m.config.num_key_value_heads
        d = m.config.hidden_size // heads
        s = scales(amax[p + "self_attn.o_proj"], [a.o_proj.weight], alpha).view(kv, heads // kv, d).amax(1)  # (kv, d)
        a.v_proj.weight.div_(s.reshape(-1)[:, None])
        a.o_proj.weight.mul_(s[:, None, :].expand(kv, heads // kv, d).reshape(-1))


class Int8Linear(nn.Module):
    """A Linear with int8 weights (per output channel) and int8 activations (per tensor, or per token)."""

    def __init__(self, lin, reduce_range, per_token=False):
        super().__init__()
        qlin = torch.ao.nn.quantized.dynamic.Linear(lin.in_features, lin.out_features, dtype=torch.qint8)
        w = lin.weight.detach().float()
        scale = w.abs().amax(1).clamp(min=1e-8) / 127
        qw = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        qlin.set_weight_bias(qw, lin.bias)
        self.packed = qlin._packed_params._packed_params
        self.reduce_range, self.per_token = reduce_range, per_token
        self.w_int8 = torch.round(w / scale[:, None]).to(torch.int8).t().contiguous()  # (K, N)
        self.w_scale = scale

    def forward(self, x):
        if not self.per_token:
            return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        s = x.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
        q = torch.round(x / s).to(torch.int8)
        y = torch._int_mm(q, self.w_int8).float() * s * self.w_scale
        return y.reshape(*shape[:-1], -1)


def quantize(m, reduce_range, skip=(), per_token=()):
    for _, mod in list(m.named_modules()):
        for cname, child in list(mod.named_children()):
            if isinstance(child, nn.Linear) and cname not in skip:
                setattr(mod, cname, Int8Linear(child, reduce_range, cname in per_token))


def rel_err(a, b):
    e = torch.cat([((x - y).norm(dim=-1) / y.norm(dim=-1)) for x, y in zip(a, b, strict=True)])
    return e.median().item(), e.quantile(0.9).item()


@torch.no_grad()
def timed(m, texts):
    t = time.process_time()
    for ids, mask in batches(texts):
        m(input_ids=ids, attention_mask=mask)
    return time.process_time() - t


VARIANTS = {
    "int8 every Linear, no smoothing, 7-bit activations": dict(alpha=None, reduce_range=True),
    "int8 every Linear, no smoothing": dict(alpha=None, reduce_range=False),
    "SmoothQuant 0.5, every Linear": dict(alpha=0.5, reduce_range=False),
    "SmoothQuant 0.8, every Linear": dict(alpha=0.8, reduce_range=False),
    "SmoothQuant 0.5, down_proj fp32": dict(alpha=0.5, reduce_range=False, skip=("down_proj",)),
    "SmoothQuant 0.5, down_proj per token": dict(alpha=0.5, reduce_range=False, per_token=("down_proj",)),
}
TOKENIZER: list = []


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def read(name: str, key: str, n: int) -> list[str]:
    """The first ``n`` texts of a data file (word lists joined by spaces)."""
    records = map(json.loads, (DATA / name).read_text().splitlines()[:n])
    return [" ".join(r[key]) if isinstance(r[key], list) else r[key] for r in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    TOKENIZER.append(AutoTokenizer.from_pretrained(str(CHECKPOINT)))
    sentences = read("conll2003/test.jsonl", "tokens", args.sentences)
    calibration = read("conll2003/train.jsonl", "tokens", 128) + read("sst2/train.jsonl", "text", 128)
    words = sum(len(s.split()) for s in sentences)
    reference = load()
    want = states(reference, sentences)
    models, out = {"fp32": reference}, {"fp32": {"median_err_p90": [0.0, 0.0]}}
    amax = calibrate(load(), calibration)
    for name, v in VARIANTS.items():
        m = load()
        if v["alpha"] is not None:
            smooth(m, amax, v["alpha"])
            out.setdefault("smoothed_fp32", {})[str(v["alpha"])] = rel_err(states(m, sentences), want)
        quantize(m, v["reduce_range"], v.get("skip", ()), v.get("per_token", ()))
        models[name] = m
        out[name] = {"median_err_p90": rel_err(states(m, sentences), want)}
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, m in models.items():
            seconds[name].append(timed(m, sentences))
    for name in models:
        out[name]["words_per_cpu_s"] = words / statistics.median(seconds[name])
        out[name]["words_per_cpu_s_rounds"] = [words / s for s in seconds[name]]
    result = {"cpu": cpu_name(), "threads": 1, "sentences": args.sentences, "words": words, "rounds": args.rounds,
              "blocks": BLOCKS, "variants": out}  # fmt: skip
    (HERE / "results" / "smoothquant_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, r in out.items():
        if "words_per_cpu_s" in r:
            err = r["median_err_p90"]
            print(f"{name:48s} error {err[0]:.3f} / {err[1]:.3f}  {r['words_per_cpu_s']:7.0f} words/CPU-s")


if __name__ == "__main__":
    main()
