"""The small distilled student's end-to-end prediction speed against spaCy's CNN pipeline, measured alternately in
one run on the same words at one thread each, with a profile of where the student's time goes (issue 36 item 3).

    OMP_NUM_THREADS=1 python benchmarks/student_speed.py [--rounds 3] [--out benchmarks/results/student_speed.json]
                                                         [--spacy-python PATH] [--sentences 0] [--no-profile]
                                                         [--bf16] [--int8] [--torch-products] [--model RUN/best]

The student: the ``distill_small`` architecture (configs/bench/ple.yaml with benchmarks/distill_rows.py's SMALL
overrides: d_model 128, 2 PLE layers, char CNN, word/shape/hashed features, CRF), built untrained with its BPE
tokenizer trained on CoNLL-2003 + SST-2 train (its speed does not depend on the weights: the work per word is the
same); ``--model`` times a saved student instead (a trained fast student, e.g. configs/distill_fast.yaml's). It runs
``predict_texts`` on the CoNLL-2003 test token lists (every task) at one torch thread and one worker,
as benchmarks/spacy_throughput.py times it; spaCy runs in its own interpreter (spacy_worker.py, ``nlp.pipe`` on
``Doc(vocab, words=tokens)``). Every round times each once, in alternating order; the figures are CPU seconds
(time.process_time: the machine is shared) and the medians and spread over the rounds are stored with the CPU's
name and the load average as ``student_vs_spacy``. ``--bf16`` adds the student at ``--precision bf16`` to every round
(faster where the CPU multiplies bfloat16 natively, and not identical to fp32's output). ``--int8`` adds the
student at ``--precision int8`` twice to every round: as it runs (attention projections and expert groups in int8)
and with its expert groups put back in float32 (``int8_attention_only``: what int8 was before ``Int8ExpertGroup``),
each on its own copy of the model (int8 quantises in place). ``--torch-products`` adds
the student with torch's own matrix products (``exact_matmul.disabled()``, the code before exact_matmul; the same
outputs bit for bit) to every round.

The profile (a separate pass after the rounds): the CPU seconds inside the model's forward (the arithmetic) against
the rest of the pass (tokenisation, collation, decoding, output dicts), the forward's floating-point work per word and
the rate it ran at against a large product's on the same core (``arithmetic``), and cProfile's top functions by own
time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import ours, untrained_model
from bench_timing import REPO, cpu_name, default_data_root, read_sentences, timed, words_of
from distill_rows import SMALL
from spacy_worker import DEFAULT_SPACY_PYTHON, SpacyProcess


def forward_split(saved, run) -> dict:
    """One pass of ``run`` with the model's forward timed apart: CPU seconds in it and in the rest."""
    model, acc = saved.model, {"seconds": 0.0, "tokens": 0, "padded": 0}
    forward = model.forward

    def timed_forward(*args, **kwargs):
        start = time.process_time()
        out = forward(*args, **kwargs)
        acc["seconds"] += time.process_time() - start
        mask = kwargs["attention_mask"]
        acc["tokens"] += int(mask.sum())
        acc["padded"] += mask.numel()
        return out

    model.forward = timed_forward
    try:
        start = time.process_time()
        run()
        total = time.process_time() - start
    finally:
        del model.forward
    return {
        "total_cpu_s": round(total, 3),
        "forward_cpu_s": round(acc["seconds"], 3),
        "rest_cpu_s": round(total - acc["seconds"], 3),
        "forward_share": round(acc["seconds"] / total, 3),
        "sub_words": acc["tokens"],
        "padded_sub_words": acc["padded"],
    }


def arithmetic(run, words: int, forward_cpu_s: float) -> dict:
    """What the student's forward computes per word and how fast it ran against this core's own rate.

    FlopCounterMode counts one pass run with torch's own products (``exact_matmul.disabled``: the same products,
    which it can count, oneDNN's it cannot); the reference rate is the best of five 1024-square float32 products at
    one thread, the most this core's matrix unit gives (the student's small products cannot reach it)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from mtl_decoder.model import exact_matmul

    with exact_matmul.disabled(), FlopCounterMode(display=False) as counter:
        run()
    flops = counter.get_total_flops()
    by_op = {str(op).removeprefix("aten."): round(n / 1e9, 2) for op, n in counter.get_flop_counts()["Global"].items()}
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b  # warm-up
    seconds = []
    for _ in range(5):
        start = time.process_time()
        a @ b
        seconds.append(time.process_time() - start)
    reference = 2 * 1024**3 / min(seconds) / 1e9
    achieved = flops / forward_cpu_s / 1e9
    return {
        "mflop_per_word": round(flops / words / 1e6, 3),
        "gflop_by_op": by_op,
        "forward_gflop_per_cpu_s": round(achieved, 1),
        "reference_gflop_per_cpu_s": round(reference, 1),
        "forward_over_reference": round(achieved / reference, 3),
        "note": "attention's own kernel (scaled_dot_product_attention) is not counted",
    }


def top_functions(run, rows: int = 20) -> list[dict]:
    """cProfile of one pass of ``run``: the functions with the most own time (with profiling overhead)."""
    profiler = cProfile.Profile()
    profiler.runcall(run)
    stats = pstats.Stats(profiler, stream=io.StringIO())
    total = stats.total_tt
    entries = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:rows]
    out = []
    for (file, line, name), (_, calls, own, cumulative, _) in entries:
        where = name if file == "~" else f"{Path(file).name}:{line}({name})"
        out.append(
            {"function": where, "calls": calls, "own_share": round(own / total, 3), "cum_s": round(cumulative, 3)}
        )
    return out


def measure(args: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    data_root = Path(args.data_root)
    items = read_sentences(data_root, args.sentences)
    words = words_of(items)
    saved, described = _student(args.model, data_root)
    spacy = SpacyProcess(Path(args.spacy_python), {"data_root": str(data_root), "sentences": args.sentences,
                                                  "width": 96, "depth": 4})  # fmt: skip
    ways = {"student": ours(saved, items, 1), "spacy": spacy.run}
    if args.bf16:
        ways["student_bf16"] = ours(saved, items, 1, "bf16")
    if args.int8:
        ways["student_int8"] = ours(_int8_copy(saved, experts=True), items, 1, "int8")
        ways["student_int8_attention_only"] = ours(_int8_copy(saved, experts=False), items, 1, "int8")
    if args.torch_products:
        ways["student_torch_products"] = _torch_products(ours(saved, items, 1))
    for name in ways:
        if name != "spacy":
            ways[name]()  # warm-up (spaCy's worker warmed up before saying ready)
    rounds = []
    for r in range(args.rounds):
        order = list(ways) if r % 2 == 0 else list(ways)[::-1]
        row = {}
        for name in order:
            row[name] = spacy.run() if name == "spacy" else timed(ways[name])
            assert row[name]["words"] == words, (name, row[name]["words"], words)
            print(f"round {r}: {name:8s} {row[name]}", file=sys.stderr)
        row["student_over_spacy_per_cpu_s"] = round(
            row["student"]["words_per_cpu_s"] / row["spacy"]["words_per_cpu_s"], 3
        )
        rounds.append(row)
    spacy.close()

    def per_cpu(name: str) -> list[float]:
        return [r[name]["words_per_cpu_s"] for r in rounds]

    ratios = [r["student_over_spacy_per_cpu_s"] for r in rounds]
    import mtl_decoder

    result: dict = {
        "benchmark": "student_speed",
        "cpu": cpu_name(),
        "commit": _commit(),
        "code": args.note or f"mtl_decoder from {Path(mtl_decoder.__file__).parent} (this checkout)",
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "load_average_before": load_before,
        "input": f"CoNLL-2003 test, {len(items)} sentences ({words} words), pre-tokenised; both systems predict every "
        "task (NER tags and the sentence's sentiment label), one thread each, alternately",
        "student": {
            **described,
            "parameters": saved.model.num_parameters(),
            "batch_size": 64,
        },
        "spacy": {k: v for k, v in spacy.info.items() if k != "ready"},
        "rounds": rounds,
        "student_vs_spacy": {
            "student_words_per_cpu_s": round(statistics.median(per_cpu("student")), 1),
            "spacy_words_per_cpu_s": round(statistics.median(per_cpu("spacy")), 1),
            "student_over_spacy": round(statistics.median(ratios), 3),
            "spread": {
                "student_words_per_cpu_s": [min(per_cpu("student")), max(per_cpu("student"))],
                "spacy_words_per_cpu_s": [min(per_cpu("spacy")), max(per_cpu("spacy"))],
                "student_over_spacy": [min(ratios), max(ratios)],
            },
            "rounds": len(rounds),
            "threads": 1,
        },
    }
    if args.bf16:
        bf16 = per_cpu("student_bf16")
        result["student_bf16"] = {
            "note": "--precision bf16 (autocast: matrix products in bfloat16): not identical to fp32's output",
            "words_per_cpu_s": round(statistics.median(bf16), 1),
            "spread": [min(bf16), max(bf16)],
            "over_spacy": round(statistics.median(b / s for b, s in zip(bf16, per_cpu("spacy"), strict=True)), 3),
        }
    if args.int8:
        for name in ("student_int8", "student_int8_attention_only"):
            speeds = per_cpu(name)
            result[name] = {
                "words_per_cpu_s": round(statistics.median(speeds), 1),
                "spread": [min(speeds), max(speeds)],
                "over_fp32": round(
                    statistics.median(q / f for q, f in zip(speeds, per_cpu("student"), strict=True)), 3
                ),
                "over_spacy": round(statistics.median(q / s for q, s in zip(speeds, per_cpu("spacy"), strict=True)), 3),
            }
    if args.torch_products:
        torch_products = per_cpu("student_torch_products")
        result["student_torch_products"] = {
            "note": "the student with torch's own matrix products (exact_matmul.disabled: the code before "
            "exact_matmul); its outputs are bit-identical to the student's",
            "words_per_cpu_s": round(statistics.median(torch_products), 1),
            "spread": [min(torch_products), max(torch_products)],
            "over_spacy": round(
                statistics.median(t / s for t, s in zip(torch_products, per_cpu("spacy"), strict=True)), 3
            ),
            "outputs_identical": _same_outputs(saved, items),
            "student_over_this": round(
                statistics.median(f / t for f, t in zip(per_cpu("student"), torch_products, strict=True)), 3
            ),
        }
    if args.profile:
        student = ways["student"]
        split = forward_split(saved, student)
        result["profile"] = {
            "split": split,
            "arithmetic": arithmetic(student, words, split["forward_cpu_s"]),
            "top_functions": top_functions(student),
        }
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _student(model: str | None, data_root: Path) -> tuple:
    """The student timed and what it is: a saved model folder (--model), or the distill_small architecture untrained."""
    if model:
        from mtl_decoder.saved import load_model

        return load_model(Path(model), "cpu"), {"model": f"{model} (trained)"}
    saved = untrained_model(REPO / "configs/bench/ple.yaml", data_root, SMALL)
    return saved, {
        "model": "distill_small architecture (configs/bench/ple.yaml + benchmarks/distill_rows.py SMALL), "
        "untrained (speed does not depend on the weights), BPE 16k tokenizer trained on CoNLL-2003 + SST-2 train",
        "overrides": SMALL,
    }


def _int8_copy(saved, experts: bool):
    """A copy of ``saved`` quantised for --precision int8; ``experts`` False: its expert groups back in float32."""
    import copy

    from mtl_decoder.inference.quantize import Int8ExpertGroup, quantize_int8

    quantised = copy.deepcopy(saved)
    quantize_int8(quantised.model)
    if not experts:
        originals = dict(saved.model.named_modules())
        for name, module in list(quantised.model.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, Int8ExpertGroup):
                    original = originals[f"{name}.{child_name}" if name else child_name]
                    setattr(module, child_name, copy.deepcopy(original))
    return quantised


def _torch_products(run):
    """``run`` with exact_matmul's oneDNN products off (torch's own; the prediction runs in this thread)."""
    from mtl_decoder.model import exact_matmul

    def without_onednn() -> int:
        with exact_matmul.disabled():
            return run()

    return without_onednn


def _same_outputs(saved, items: list[list[str]]) -> bool:
    """Whether the student predicts the same with and without exact_matmul: every tag, label and probability."""
    from mtl_decoder.model import exact_matmul
    from mtl_decoder.prediction import predict_texts

    def predictions() -> list:
        return list(predict_texts(saved, items, batch_size=64, workers=1))

    fast = predictions()
    with exact_matmul.disabled():
        return fast == predictions()


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=str(default_data_root()), help="folder with conll2003/ and sst2/")
    parser.add_argument("--sentences", type=int, default=0, help="CoNLL-2003 test sentences (0: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spacy-python", default=str(DEFAULT_SPACY_PYTHON))
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profile pass")
    parser.add_argument("--bf16", action="store_true", help="also time the student at --precision bf16 each round")
    parser.add_argument(
        "--int8", action="store_true", help="also time the student at --precision int8, with and without int8 experts"
    )
    parser.add_argument(
        "--torch-products", action="store_true", help="also time the student with torch's own products each round"
    )
    parser.add_argument("--model", default=None, help="a saved student folder (default: distill_small untrained)")
    parser.add_argument("--note", default="", help="what code was measured (stored as 'code')")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/student_speed.json"))
    args = parser.parse_args(argv)
    result = measure(args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    s = result["student_vs_spacy"]
    print(
        f"{result['cpu']}: student {s['student_words_per_cpu_s']:,.0f} words/CPU-s, spaCy "
        f"{s['spacy_words_per_cpu_s']:,.0f} (student/spaCy {s['student_over_spacy']}, rounds {s['spread']})"
    )
    if "profile" in result:
        print(json.dumps(result["profile"]["split"]))
        print(json.dumps(result["profile"]["arithmetic"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
