"""Prediction speed of the pretrained-trunk model at several configurations (trunk blocks kept, precision), each timed
alternately with spaCy's CNN pipeline on the same words, one thread, in one run; with the test quality of trained
model folders beside their speed (issue 22 item 3).

    python benchmarks/pretrained_throughput.py [--model RUN/best ...] [--blocks 4,8,16] [--precisions fp32,int8]
                                               [--sentences 500] [--rounds 2] [--spacy-python PATH]

Configurations: every ``--model`` folder (a trained frozen-trunk model; its blocks are its own) at every precision,
and, for each of ``--blocks``, configs/bench/smollm2_frozen.yaml's model with that many SmolLM2 blocks, untrained
(speed does not depend on the weights: the same work per word), at every precision. Quality comes from the trained
folders only: eval-test/metrics.json (CoNLL-2003 test F1 and SST-2 test accuracy) and, for int8, eval-test-int8, read
inside the model folder (where benchmarks/quality.py writes them) or beside it in the run folder, where the CLI writes
them: ``mtl-decoder evaluate --model RUN/best --split test [--precision int8] --output RUN/eval-test[-int8]``.

Timing (the machinery of benchmarks/spacy_throughput.py): the first ``--sentences`` CoNLL-2003 test token lists, every
task predicted (``predict_texts``, 1 torch thread, 1 worker, the Predictor's batches: ``max_tokens`` in the output),
the trunk's state cache an empty temporary folder read only, so that every sentence runs through the trunk as a new
text does; spaCy in its own virtual environment
(``--spacy-python``), ``nlp.pipe`` over the same words. Every round times each configuration and spaCy once, in
alternating order; the medians of words per CPU-second are reported (the machine is shared). Writes
benchmarks/results/pretrained_throughput.json: one entry per configuration and ``best``, the fastest configuration
whose test quality meets the target (CoNLL-2003 F1 >= 0.85, SST-2 accuracy >= 0.88), else the fastest one with
quality figures, else the fastest (``meets_target`` says which).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spacy_throughput import (
    DEFAULT_SPACY_PYTHON,
    REPO,
    SpacyProcess,
    cpu_name,
    default_data_root,
    read_sentences,
    timed,
    untrained_model,
    words_of,
)

TARGET = {"words_per_cpu_s": 1000, "conll2003_test_f1": 0.85, "sst2_test_accuracy": 0.88}
SMOLLM2_CONFIG = REPO / "configs" / "bench" / "smollm2_frozen.yaml"


@dataclass
class Configuration:
    name: str
    blocks: int
    precision: str
    load: object
    """() -> SavedModel: a fresh model (int8 quantises in place, so every precision gets its own)."""
    quality: dict = field(default_factory=dict)
    source: str = ""


def test_quality(model_dir: Path, precision: str) -> dict:
    """CoNLL-2003 test F1 and SST-2 test accuracy from eval-test[-PRECISION]/metrics.json in MODEL or beside it ({}
    if neither holds one)."""
    name = "eval-test" if precision == "fp32" else f"eval-test-{precision}"
    for folder in (model_dir / name, model_dir.parent / name):
        try:
            tasks = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))["tasks"]
            break
        except (OSError, KeyError, ValueError):
            continue
    else:
        return {}
    out = {"source": str(folder / "metrics.json")}
    for name, metrics in tasks.items():
        if "f1" in metrics and "conll" in name:
            out["conll2003_test_f1"] = float(metrics["f1"])  # unrounded: the docs round once
        elif "accuracy" in metrics and "sst" in name:
            out["sst2_test_accuracy"] = float(metrics["accuracy"])
    return out


def configurations(args: argparse.Namespace, data_root: Path) -> list[Configuration]:
    from mtl_decoder.saved import load_model

    out = []
    precisions = args.precisions.split(",")
    for model in args.model or []:
        folder = Path(model)
        blocks = json.loads((folder / "trunk.json").read_text(encoding="utf-8"))["layers"]
        for precision in precisions:
            out.append(
                Configuration(
                    f"{folder.parent.name}/{folder.name} {precision}",
                    blocks,
                    precision,
                    lambda folder=folder: load_model(folder, "cpu"),
                    test_quality(folder, precision),
                    f"{folder} (trained)",
                )
            )
    for blocks in [int(b) for b in args.blocks.split(",") if b]:
        for precision in precisions:
            out.append(
                Configuration(
                    f"smollm2 {blocks} blocks untrained {precision}",
                    blocks,
                    precision,
                    lambda blocks=blocks: untrained_model(SMOLLM2_CONFIG, data_root, [f"model.trunk.layers={blocks}"]),
                    source=f"{SMOLLM2_CONFIG.relative_to(REPO)} model section, model.trunk.layers={blocks}, untrained",
                )
            )
    return out


def runner(saved, items: list[list[str]], precision: str, cache_dir: Path):
    """A function predicting every task of ``items`` at 1 thread, 1 worker, the state cache empty and read only."""
    import torch

    from mtl_decoder.prediction import predict_texts

    def run() -> int:
        torch.set_num_threads(1)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        setting = ("int8", False) if precision == "int8-alone" else (precision, True)  # --no-refine
        preds = predict_texts(saved, items, precision=setting[0], refine=setting[1], workers=1, cache_dir=cache_dir)
        return sum(next(len(v["tags"]) for v in p.values() if "tags" in v) for p in preds)

    return run


def best_entry(entries: list[dict]) -> dict:
    def meets(e: dict) -> bool:
        return all(e.get(k) is not None and e[k] >= v for k, v in TARGET.items())

    with_quality = [e for e in entries if e.get("conll2003_test_f1") is not None]
    pool = [e for e in entries if meets(e)] or with_quality or entries
    best = max(pool, key=lambda e: e["words_per_cpu_s"])
    keys = ("words_per_cpu_s", "conll2003_test_f1", "sst2_test_accuracy", "blocks", "precision", "cpu", "name")
    return {**{k: best.get(k) for k in keys}, "meets_target": meets(best), "target": TARGET}


def measure(args: argparse.Namespace) -> dict:
    import torch

    from mtl_decoder.inference.predictor import MAX_TOKENS

    data_root = Path(args.data_root)
    items = read_sentences(data_root, args.sentences)
    words = words_of(items)
    spacy = SpacyProcess(
        Path(args.spacy_python),
        {"data_root": str(data_root), "sentences": args.sentences, "width": 96, "depth": 4},
    )
    cpu = cpu_name()
    configs = configurations(args, data_root)
    entries: list[dict] = []
    spacy_runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="throughput-states-") as cache_dir:
        for config in configs:  # one model in memory at a time; spaCy timed beside each
            saved = config.load()
            run = runner(saved, items, config.precision, Path(cache_dir))
            run()  # warm-up (and int8: the quantisation, once)
            ours_runs, beside = [], []
            for r in range(args.rounds):
                pair = ["ours", "spacy"] if r % 2 == 0 else ["spacy", "ours"]
                for who in pair:
                    m = spacy.run() if who == "spacy" else timed(run)
                    assert m["words"] == words, (who, m["words"], words)
                    (beside if who == "spacy" else ours_runs).append(m)
            spacy_runs += beside
            ours_cpu = statistics.median(m["words_per_cpu_s"] for m in ours_runs)
            spacy_cpu = statistics.median(m["words_per_cpu_s"] for m in beside)
            entry = {
                "name": config.name,
                "model": config.source,
                "blocks": config.blocks,
                "precision": config.precision,
                "words_per_cpu_s": round(ours_cpu, 1),
                "words_per_s": round(statistics.median(m["words_per_s"] for m in ours_runs), 1),
                "spacy_words_per_cpu_s_beside": round(spacy_cpu, 1),
                "spacy_over_ours_per_cpu_s": round(spacy_cpu / ours_cpu, 2),
                "conll2003_test_f1": config.quality.get("conll2003_test_f1"),
                "sst2_test_accuracy": config.quality.get("sst2_test_accuracy"),
                "quality_source": config.quality.get("source"),
                "cpu": cpu,
                "runs": ours_runs,
            }
            entries.append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "runs"}), file=sys.stderr, flush=True)
            del saved
    spacy.close()
    return {
        "benchmark": "pretrained_throughput",
        "cpu": cpu,
        "input": f"CoNLL-2003 test, first {len(items)} sentences ({words} words), pre-tokenised; every task predicted",
        "threads": 1,
        "max_tokens": MAX_TOKENS["pretrained"],
        "torch": torch.__version__,
        "spacy": {k: v for k, v in spacy.info.items() if k != "ready"},
        "spacy_words_per_cpu_s": round(statistics.median(m["words_per_cpu_s"] for m in spacy_runs), 1),
        "entries": entries,
        "best": best_entry(entries),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="a trained frozen-trunk model folder (repeatable)")
    parser.add_argument("--blocks", default="4,8,16", help="SmolLM2 blocks of the untrained configurations ('' none)")
    parser.add_argument("--precisions", default="fp32,int8", help="comma list of fp32, bf16, int8, int8-alone")
    parser.add_argument("--sentences", type=int, default=500, help="CoNLL-2003 test sentences")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per configuration")
    parser.add_argument("--data-root", default=str(default_data_root()))
    parser.add_argument("--spacy-python", default=os.environ.get("SPACY_PYTHON", str(DEFAULT_SPACY_PYTHON)))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pretrained_throughput.json"))
    args = parser.parse_args(argv)
    load = [round(x, 2) for x in os.getloadavg()]
    result = {
        "command": "python benchmarks/pretrained_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    }
    result.update(measure(args))
    result["load_average_before"] = load
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result["best"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
