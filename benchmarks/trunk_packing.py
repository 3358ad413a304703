"""Issue 36 item 4: the trunk's texts packed into rows (model/pretrained/packing.py) against today's padded
token-budget batches, on a trained frozen-trunk model: speed, the arithmetic spent on padding, and the outputs.

    python benchmarks/trunk_packing.py --model benchmarks/runs/smollm2_frozen_ple/best [--pack 0,64,128,256]
                                       [--sentences 1000] [--rounds 3] [--precision fp32|int8] [--call-size N]

Every configuration predicts every task of the first ``--sentences`` CoNLL-2003 test token lists (``predict_texts``,
1 torch thread, 1 worker, the Predictor's default batches, the state cache an empty temporary folder read only, so
every sentence runs through the trunk); each round times every configuration once, in rotating order, and the medians
of words per CPU-second are reported with their spread (min-max over the rounds) and the ratio to pack 0 (today's
padded batches) from the same rounds. Padding: ids the trunk multiplied against the texts' own ids. Outputs: every
configuration's predictions against pack 0's (identical tag sequences and labels, the largest probability
difference). ``--call-size N`` predicts the sentences N at a time (a service's small requests, whose batches are
as ragged as the requests). Writes benchmarks/results/trunk_packing.json (``--out`` for another file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spacy_throughput import REPO, cpu_name, default_data_root, read_sentences, timed, words_of


def _counting(states) -> dict[str, int]:
    """Count the ids the trunk multiplies and the texts' own ids, wrapping ``states.hidden`` and ``states.run``."""
    counts = {"multiplied": 0, "own": 0}
    hidden, run = states.hidden, states.run

    def counted_hidden(input_ids, attention_mask, position_ids):
        counts["multiplied"] += input_ids.numel()
        return hidden(input_ids, attention_mask, position_ids)

    def counted_run(input_ids, attention_mask):
        counts["own"] += int(attention_mask.sum())
        return run(input_ids, attention_mask)

    states.hidden, states.run = counted_hidden, counted_run
    return counts


def _agreement(ours: list[dict], base: list[dict]) -> dict:
    tags = labels = n = 0
    largest = 0.0
    for a, b in zip(ours, base, strict=True):
        n += 1
        for task, pa in a.items():
            pb = b[task]
            if "tags" in pa:
                tags += pa["tags"] == pb["tags"]
            else:
                labels += pa["label"] == pb["label"]
                largest = max(largest, *(abs(pa["probs"][k] - pb["probs"][k]) for k in pa["probs"]))
    return {"tags_identical": tags / n, "labels_identical": labels / n, "largest_probability_difference": largest}


def measure(args: argparse.Namespace) -> dict:
    import torch

    from mtl_decoder.prediction import predict_texts
    from mtl_decoder.saved import load_model

    items = read_sentences(Path(args.data_root), args.sentences)
    words = words_of(items)
    packs = [int(p) for p in args.pack.split(",")]
    saved = load_model(args.model, "cpu")
    states = saved.model.trunk_kind.cached_states()
    counts = _counting(states)
    torch.set_num_threads(1)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    runs: dict[int, list[dict]] = {p: [] for p in packs}
    outputs: dict[int, list[dict]] = {}
    padding: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="packing-states-") as cache_dir:

        def predict(pack: int) -> list[dict]:
            states.pack_tokens = pack
            calls = [items[i : i + args.call_size] for i in range(0, len(items), args.call_size or len(items))]
            options = {"precision": args.precision, "workers": 1, "cache_dir": Path(cache_dir)}
            return [p for call in calls for p in predict_texts(saved, call, **options)]

        for pack in packs:  # warm-up, the outputs and the padding
            counts.update(multiplied=0, own=0)
            outputs[pack] = predict(pack)
            padding[pack] = 1 - counts["own"] / counts["multiplied"]
        for r in range(args.rounds):
            order = packs[r % len(packs) :] + packs[: r % len(packs)]
            for pack in order:
                m = timed(lambda pack=pack: sum(len(next(v["tags"] for v in p.values() if "tags" in v))
                                                for p in predict(pack)))  # fmt: skip
                assert m["words"] == words
                runs[pack].append(m)
                print(pack, round(m["words_per_cpu_s"], 1), file=sys.stderr, flush=True)
    base = packs[0]
    entries = []
    for pack in packs:
        speeds = [m["words_per_cpu_s"] for m in runs[pack]]
        ratios = [m["words_per_cpu_s"] / b["words_per_cpu_s"] for m, b in zip(runs[pack], runs[base], strict=True)]
        entries.append(
            {
                "pack_tokens": pack,
                "words_per_cpu_s": round(statistics.median(speeds), 1),
                "spread": [round(min(speeds), 1), round(max(speeds), 1)],
                f"ratio_to_pack_{base}": round(statistics.median(ratios), 3),
                "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
                "padding_share": round(padding[pack], 3),
                **_agreement(outputs[pack], outputs[base]),
            }
        )
        print(json.dumps(entries[-1]), file=sys.stderr, flush=True)
    return {
        "benchmark": "trunk_packing",
        "model": str(args.model),
        "cpu": cpu_name(),
        "threads": 1,
        "precision": args.precision,
        "call_size": args.call_size or None,
        "rounds": args.rounds,
        "input": f"CoNLL-2003 test, first {len(items)} sentences ({words} words), pre-tokenised; every task predicted",
        "torch": torch.__version__,
        "entries": entries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a trained frozen-trunk model folder")
    parser.add_argument("--pack", default="0,64,128,256", help="row lengths to try; the first is the baseline")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="fp32", help="fp32, or int8 (W8A8 where the folder has its scales)")
    parser.add_argument(
        "--call-size", type=int, default=0, help="texts per predict_texts call, as a service's requests (0: one call)"
    )
    parser.add_argument("--data-root", default=str(default_data_root()))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "trunk_packing.json"))
    args = parser.parse_args(argv)
    result = measure(args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({e["pack_tokens"]: e["words_per_cpu_s"] for e in result["entries"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
