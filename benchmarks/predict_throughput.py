"""Throughput of batch prediction against a naive one-sentence-at-a-time loop over the same model.

    python benchmarks/predict_throughput.py [--json] [--data-root ../shared/data] [--sentences 5000]
                                            [--precision fp32|bf16]

Data: CoNLL-2003 test sentences (token lists) and SST-2 test sentences (raw texts), shuffled together with a
fixed seed, the first --sentences of them. Model: the model section of configs/demo.yaml, built untrained, with
the demo's tokenizer settings (BPE, 8k), trained in seconds on the same sentences. Training is not
needed to measure speed: the work per sentence does not depend on the weights.

- batched: ``predict_file`` on a JSON-lines file of the sentences (read, batch by length, predict every task,
  write the output file), i.e. ``mtl-decoder predict``; ``predict_texts`` on the in-memory list is reported too.
- naive: for each sentence in input order, encode it, run the model on a batch of one, read the tags and the
  label; no length grouping, no file I/O. This is the floor batching must beat (>= 5x).

--precision bf16 runs both ways under bf16 autocast (``predict --precision bf16``; the naive loop inside
``torch.autocast``), so the ratio compares the same model at the same precision.

The machine may be shared: the sentences are cut into chunks (--chunk, default 2,500: two files) and the three
ways run chunk after chunk, in alternating order, so that each sees the same load; each way's time is its total
over the chunks. Chunks are not smaller because each ``predict`` call fills and drains its pipeline (the first
buffer is encoded before any batch runs; the last one's results are written after the last batch): on
500-sentence calls that start-up cost is a tenth of the time, which a user predicting on a file pays once. The naive
loop's tags and labels are checked against the batched predictions ("naive_agrees"). Exit status 1 when batched
is below 5x the naive loop.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from mtl_decoder.config import TAGGING, load_config
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.data.iob import sort_tag_labels
from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.inference import PRECISIONS
from mtl_decoder.model import build_model
from mtl_decoder.prediction import predict_file, predict_texts
from mtl_decoder.saved import SavedModel

REPO = Path(__file__).resolve().parents[1]


def load_sentences(data_root: Path, count: int, seed: int = 0) -> tuple[list[str | list[str]], set[str]]:
    """CoNLL-2003 test token lists and SST-2 test texts, shuffled together; and the NER tags seen."""
    items: list[str | list[str]] = []
    tags: set[str] = set()
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            items.append(record["tokens"])
            tags.update(record.get("ner_tags", []))
    with open(data_root / "sst2" / "test.jsonl", encoding="utf-8") as f:
        items += [json.loads(line)["text"] for line in f]
    random.Random(seed).shuffle(items)
    if len(items) < count:
        raise SystemExit(f"{data_root}: only {len(items)} sentences, {count} asked for")
    return items[:count], tags


def demo_model(items: list[str | list[str]], ner_tags: set[str]) -> SavedModel:
    """The demo config's model, untrained, with a tokenizer trained on ``items``."""
    config = load_config(REPO / "configs" / "demo.yaml")
    label_sets = {
        name: list(task.labels) if task.labels else sort_tag_labels(ner_tags | {"O"})
        for name, task in config.tasks.items()
    }
    encoder = TextEncoder.for_model(train_tokenizer(items, config.tokenizer), config.model, config.data.max_length)
    torch.manual_seed(0)
    model = build_model(config, label_sets, encoder).eval()
    return SavedModel(model, encoder, config, label_sets, Path("untrained-demo"))


@torch.inference_mode()  # as predict runs its batches: the same model, run the same way, one sentence at a time
def naive_predict(
    pretrained: SavedModel, items: list[str | list[str]], precision: str = "fp32"
) -> list[tuple[dict, dict]]:
    """One sentence at a time, in input order: encode, run the model on a batch of one, read the tags and the
    label. Returns (task -> tags, task -> label) per sentence."""
    if precision != "fp32":
        with torch.autocast("cpu", dtype=PRECISIONS[precision]):
            return naive_predict(pretrained, items)
    model, encoder = pretrained.model, pretrained.encoder
    cfg = model.cfg
    collate = collator_for(cfg, encoder.pad_id, {})
    tasks = model.task_names
    results = []
    for item in items:
        enc = encoder.encode_text(item) if isinstance(item, str) else encoder.encode_words(item)
        batch = collate([EncodedExample.unlabelled(enc)])
        out = model(**batch, tasks=tasks)
        tags, labels = {}, {}
        for task in tasks:
            names = pretrained.label_sets[task]
            if model.task(task).kind == TAGGING:
                tags[task] = [names[i] for i in model.decode_tags(task, out.logits[task], batch["word_read"])[0]]
            else:
                labels[task] = names[int(out.logits[task].float().softmax(-1)[0].argmax())]
        results.append((tags, labels))
    return results


def agreement(batched: list[dict], naive: list[tuple[dict, dict]]) -> tuple[int, int]:
    """(sentences tagged in one window, of which batched and naive agree on every tag and label)."""
    compared = agreed = 0
    for pred, (tags, labels) in zip(batched, naive, strict=True):
        if any(entry.get("windows", 1) > 1 for entry in pred.values()):
            continue  # too long for one pass: batched tags it in windows, naive reads a truncated prefix
        compared += 1
        agreed += all(pred[t]["tags"] == v for t, v in tags.items()) and all(
            pred[t]["label"] == v for t, v in labels.items()
        )
    return compared, agreed


class Timer:
    def __init__(self) -> None:
        self.seconds = 0.0

    def run(self, fn):
        start = time.perf_counter()
        result = fn()
        self.seconds += time.perf_counter() - start
        return result


def measure(args: argparse.Namespace) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    items, ner_tags = load_sentences(Path(args.data_root), args.sentences)
    pretrained = demo_model(items, ner_tags)
    work = Path(tempfile.mkdtemp(prefix="predict-bench-"))
    chunks = [items[i : i + args.chunk] for i in range(0, len(items), args.chunk)]
    files = [write_input(work / f"chunk{k}.jsonl", chunk) for k, chunk in enumerate(chunks)]
    precision = args.precision
    list(predict_texts(pretrained, items[:200], batch_size=args.batch_size, precision=precision))  # warm-up
    naive_predict(pretrained, items[:50], precision)
    on_file, in_memory, naive = Timer(), Timer(), Timer()
    tokens = compared = agreed = 0
    for k, (chunk, source) in enumerate(zip(chunks, files, strict=True)):

        def file_run(source=source) -> None:
            out = work / "out.jsonl"
            return predict_file(
                pretrained, source, out, batch_size=args.batch_size, force=True, progress=False, precision=precision
            )

        def memory_run(chunk=chunk) -> list[dict]:
            return list(predict_texts(pretrained, chunk, batch_size=args.batch_size, precision=precision))

        def naive_run(chunk=chunk) -> list[tuple[dict, dict]]:
            return naive_predict(pretrained, chunk, precision)

        runs = [(on_file, file_run), (in_memory, memory_run), (naive, naive_run)]
        results = [timer.run(fn) for timer, fn in (runs if k % 2 == 0 else runs[::-1])]
        summary, batched, single = results if k % 2 == 0 else results[::-1]
        assert summary.predicted == len(chunk), summary
        tokens += summary.tokens
        counts = agreement(batched, single)
        compared, agreed = compared + counts[0], agreed + counts[1]
    shutil.rmtree(work)
    sentences_per_s = len(items) / on_file.seconds
    naive_per_s = len(items) / naive.seconds
    return {
        "benchmark": "predict_throughput",
        "sentences": len(items),
        "tokens": tokens,
        "sentences_per_s": round(sentences_per_s, 1),
        "tokens_per_s": round(tokens / on_file.seconds, 1),
        "in_memory_sentences_per_s": round(len(items) / in_memory.seconds, 1),
        "naive_sentences_per_s": round(naive_per_s, 1),
        "naive_tokens_per_s": round(tokens / naive.seconds, 1),
        "batched_over_naive": round(sentences_per_s / naive_per_s, 2),
        "meets_5x": sentences_per_s >= 5 * naive_per_s,
        "naive_agrees": f"{agreed}/{compared} single-window sentences with the same tags and labels",
        "seconds": {
            "predict_file": round(on_file.seconds, 2),
            "predict_texts": round(in_memory.seconds, 2),
            "naive": round(naive.seconds, 2),
        },
        "batch_size": args.batch_size,
        "precision": precision,
        "interleaved_chunks": len(chunks),
        "model": "configs/demo.yaml model section, untrained: speed does not depend on the weights, so no "
        "training is needed; tokenizer trained on the benchmark sentences",
        "parameters": pretrained.model.num_parameters(),
        "max_length": pretrained.encoder.max_length,
        "tokens_counted_as": "words: the input tokens, or the pre-tokenizer's words of a raw text",
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__,
    }


def write_input(path: Path, items: list[str | list[str]]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, item in enumerate(items):
            record = {"id": i, "tokens": item} if isinstance(item, list) else {"id": i, "text": item}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data-root", default=str(REPO.parent / "shared" / "data"), help="folder with conll2003/, sst2/"
    )
    parser.add_argument("--sentences", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=2500, help="sentences per interleaved timing chunk")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="both ways (default: fp32)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = measure(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    return 0 if result["meets_5x"] else 1


if __name__ == "__main__":
    sys.exit(main())
