"""Where a frozen-trunk model's prediction time goes: CPU seconds per stage of ``predict_texts`` (the path that
benchmarks/pretrained_throughput.py times), one thread, on CoNLL-2003 test sentences (issue 22 item 5).

    python benchmarks/pretrained_profile.py --model RUN/best [--model ...] [--sentences 500] [--precision fp32,int8]
                                            [--max-tokens 0,1024]

Each model predicts every task of the first ``--sentences`` CoNLL-2003 test token lists once as a warm-up, then once
with every stage's method wrapped in a CPU-time (time.process_time) accumulator; stages nest (the trunk's blocks
inside the trunk, the trunk inside the model), and each is printed with its share of the whole. Stages:

- tokenization: the encoder's encode_batch and window encodings (sub-words, the word alignment);
- collate: the batch tensors (ids, masks, word features, read positions);
- trunk: FrozenStates.compute (the pretrained model; inside it embedding, blocks, final norm; the rest of it --
  the rotary table, the attention mask -- is "trunk other"); state cache: FrozenStates.forward around it (keys,
  the half-precision store, the scatter into the batch);
- projection: the norm + Linear from the trunk's width to the layers'; word features; native layers;
- heads: the final norm, pooling and task heads (the model's forward less all of the above);
- decode: softmax and the CRF's Viterbi (decode_tags); merge: the batch's results into the predictions;
- output: prediction_dicts and their JSON lines (what ``predict`` writes), timed apart, after the run;
- python: the run's total less every stage above (the buffer, batching, the generator chain).

``--max-tokens``: the Predictor's bound on a batch's padded sub-words (0: rows only, the code before the bound).
Padding: real against padded tokens of the trunk's batches (the arithmetic spent on padding). The trunk's rate:
its multiply-adds per real token (linear layers, attention from the batch shapes) over its CPU seconds. Writes
benchmarks/results/pretrained_profile.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spacy_throughput import REPO, cpu_name, default_data_root, read_sentences, words_of

from mtl_decoder.inference.predictor import MAX_TOKENS

STAGES = (
    "tokenization", "collate", "state cache", "trunk", "trunk embedding", "trunk blocks", "trunk final norm",
    "trunk other", "projection", "word features", "native layers", "heads", "decode", "merge", "output", "python",
)  # fmt: skip


class Clock:
    """CPU seconds accumulated per stage by wrapped methods, and the trunk's batch shapes."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.trunk_shapes: list[tuple[int, int, int]] = []
        """(rows, padded length, real tokens) of each trunk batch."""

    def wrap(self, obj, attr: str, stage: str) -> None:
        inner = getattr(obj, attr)

        def timed(*args, **kwargs):
            started = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[stage] += time.process_time() - started
                self.calls[stage] += 1

        setattr(obj, attr, timed)


def instrument(saved, predictor, clock: Clock) -> None:
    """Wrap every stage's method of ``predictor`` and its model (instance attributes: the classes are untouched)."""
    model, states = saved.model, saved.model.states
    base = states.base
    clock.wrap(predictor.encoder, "encode_batch", "tokenization")
    clock.wrap(predictor.encoder, "encode_words", "tokenization")
    clock.wrap(predictor, "collate", "collate")
    clock.wrap(predictor, "_merge", "merge")
    clock.wrap(model, "decode_tags", "decode")
    clock.wrap(model, "forward", "model")
    clock.wrap(states, "forward", "state cache")
    compute = states.compute

    def trunk(input_ids, attention_mask):
        clock.trunk_shapes.append((*input_ids.shape, int(attention_mask.sum())))
        return compute(input_ids, attention_mask)

    states.compute = trunk
    clock.wrap(states, "compute", "trunk")
    clock.wrap(base.embed_tokens if hasattr(base, "embed_tokens") else base.wte, "forward", "trunk embedding")
    for block in _blocks(base):
        clock.wrap(block, "forward", "trunk blocks")
    norm = getattr(base, "norm", None) or getattr(base, "ln_f", None)
    if norm is not None:
        clock.wrap(norm, "forward", "trunk final norm")
    clock.wrap(model.embed, "forward", "projection")
    if model.word_features is not None:
        clock.wrap(model.word_features, "forward", "word features")
    for layer in model.layers:
        clock.wrap(layer, "forward", "native layers")


def _blocks(base):
    from mtl_decoder.model.pretrained.hub import decoder_layers

    return list(decoder_layers(base))


def trunk_macs(base, shapes: list[tuple[int, int, int]]) -> tuple[float, float]:
    """(multiply-adds the trunk's batches did, the share of them on real tokens): every Linear of its blocks per
    padded token, and attention's scores and weighted sum per (query, key) pair of a padded row."""
    linears = [m for b in _blocks(base) for m in b.modules() if hasattr(m, "in_features")]  # int8 ones too
    per_token = sum(m.in_features * m.out_features for m in linears)
    width = base.config.hidden_size
    blocks = len(_blocks(base))
    total = real = 0.0
    for rows, length, tokens in shapes:
        linear = rows * length * per_token
        attention = 2 * rows * length * length * width * blocks
        total += linear + attention
        real += tokens * per_token + attention * tokens / (rows * length)
    return total, real / total if total else 0.0


def output_seconds(predictions: list[dict], items: list[list[str]]) -> float:
    """CPU seconds of turning predictions into what ``predict`` writes: one JSON line per record."""
    started = time.process_time()
    for item, pred in zip(items, predictions, strict=True):
        json.dumps({"tokens": item, "predictions": pred}, ensure_ascii=False)
    return time.process_time() - started


def profile(model_dir: Path, items: list[list[str]], precision: str, batch_size: int, max_tokens: int) -> dict:
    import torch

    from mtl_decoder.inference import Predictor
    from mtl_decoder.prediction.predict import _predict_items
    from mtl_decoder.saved import load_model

    torch.set_num_threads(1)
    saved = load_model(model_dir, "cpu")
    with tempfile.TemporaryDirectory(prefix="profile-states-") as cache_dir:
        tasks = list(saved.model.task_names)
        warm = Predictor.from_saved(saved, batch_size=batch_size, precision=precision, workers=1, cache_dir=cache_dir)
        warm.max_tokens = max_tokens
        list(_predict_items(warm, items, tasks))  # warm-up (the allocator, int8's quantisation)
        # a new predictor: a new in-memory state cache (the folder is only read), so every text runs the trunk
        predictor = Predictor.from_saved(
            saved, batch_size=batch_size, precision=precision, workers=1, cache_dir=cache_dir
        )
        predictor.max_tokens = max_tokens
        clock = Clock()
        instrument(saved, predictor, clock)
        started = time.process_time()
        predictions = list(_predict_items(predictor, items, tasks))
        total = time.process_time() - started
    seconds = dict(clock.seconds)
    inner = sum(seconds.get(k, 0.0) for k in ("trunk embedding", "trunk blocks", "trunk final norm"))
    seconds["trunk other"] = seconds.get("trunk", 0.0) - inner
    seconds["state cache"] = seconds.get("state cache", 0.0) - seconds.get("trunk", 0.0)
    below = ("projection", "word features", "native layers")
    seconds["heads"] = seconds.pop("model") - sum(seconds.get(k, 0.0) for k in ("state cache", "trunk", *below))
    seconds["output"] = output_seconds(predictions, items)
    top = ("tokenization", "collate", "state cache", "trunk", *below, "heads", "decode", "merge")
    seconds["python"] = total - sum(seconds.get(k, 0.0) for k in top)
    total += seconds["output"]
    macs, real_share = trunk_macs(saved.model.states.base, clock.trunk_shapes)
    words = words_of(items)
    padded = sum(r * t for r, t, _ in clock.trunk_shapes)
    tokens = sum(n for *_, n in clock.trunk_shapes)
    return {
        "model": str(model_dir),
        "blocks": len(_blocks(saved.model.states.base)),
        "precision": precision,
        "batch_size": batch_size,
        "max_tokens": max_tokens,
        "words": words,
        "cpu_seconds": round(total, 3),
        "words_per_cpu_s": round(words / total, 1),
        "stages": {
            k: {"cpu_s": round(seconds.get(k, 0.0), 3), "share": round(seconds.get(k, 0.0) / total, 3)} for k in STAGES
        },
        "trunk_batches": len(clock.trunk_shapes),
        "trunk_tokens": tokens,
        "trunk_padded_tokens": padded,
        "padding_share": round(1 - tokens / padded, 3) if padded else 0.0,
        "sub_words_per_word": round(tokens / words, 3),
        "trunk_gmac": round(macs / 1e9, 2),
        "trunk_gmac_real_share": round(real_share, 3),
        "trunk_gflop_per_cpu_s": round(2 * macs / 1e9 / seconds["trunk"], 1) if seconds.get("trunk") else None,
    }


def print_profile(entry: dict) -> None:
    print(f"{entry['model']} ({entry['blocks']} blocks, {entry['precision']}, max_tokens {entry['max_tokens']}): "
          f"{entry['words']} words in "
          f"{entry['cpu_seconds']} CPU s = {entry['words_per_cpu_s']} words/CPU-s")  # fmt: skip
    for stage, v in entry["stages"].items():
        indent = "    " if stage.startswith("trunk ") else "  "
        print(f"{indent}{stage:<18} {v['cpu_s']:8.3f} s {100 * v['share']:6.1f} %")
    print(f"  trunk: {entry['trunk_tokens']} real of {entry['trunk_padded_tokens']} padded tokens "
          f"(padding {100 * entry['padding_share']:.1f} %), {entry['sub_words_per_word']} sub-words a word, "
          f"{entry['trunk_gmac']} GMAC at {entry['trunk_gflop_per_cpu_s']} GFLOP per CPU-s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True, help="a trained frozen-trunk model folder")
    parser.add_argument("--sentences", type=int, default=500, help="CoNLL-2003 test sentences")
    parser.add_argument("--precision", default="fp32", help="fp32 and/or int8, comma-separated")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--max-tokens",
        default=str(MAX_TOKENS["pretrained"]),
        help="padded sub-words a batch at most, comma-separated (0: rows only)",
    )
    parser.add_argument("--data-root", default=str(default_data_root()))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pretrained_profile.json"))
    args = parser.parse_args(argv)
    items = read_sentences(Path(args.data_root), args.sentences)
    entries = []
    for model in args.model:
        for precision in args.precision.split(","):
            for bound in [int(b) for b in args.max_tokens.split(",")]:
                entries.append(profile(Path(model), items, precision, args.batch_size, bound))
                print_profile(entries[-1])
    result = {
        "benchmark": "pretrained_profile",
        "command": "python benchmarks/pretrained_profile.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpu": cpu_name(),
        "threads": 1,
        "input": f"CoNLL-2003 test, first {len(items)} sentences, pre-tokenised; every task predicted",
        "entries": entries,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
