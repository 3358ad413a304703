"""Memory and disk of prediction with a frozen pretrained trunk, as the number of predicted records grows: both
must stay flat (issue 22 item 2).

    python benchmarks/pretrained_memory.py [--sizes 10000,100000,1000000] [--blocks 2] [--words 6-20]
                                           [--precision fp32|int8] [--out FILE]

The trunk: a random Llama of SmolLM2-135M's width (576, 9 heads, 3 key-value heads, MLP 1536), ``--blocks`` blocks,
built here (no download), with SmolLM2's tokenizer when benchmarks/runs/smollm2-135m-instruct exists (made by
benchmarks/smollm2_checkpoint.py), else a byte-level BPE trained here on the generated texts. The model on top:
configs/demo_pretrained.yaml's layers, untrained (memory does not depend on the weights), its state cache under a
temporary MTL_DECODER_CACHE. Records: distinct generated sentences of 6-20 words (``--words``: shorter records
bound a million-record run's time, not what it measures: memory per record), streamed through
``predict_texts`` (every task), one pass over max(--sizes) records; at each size the process's resident memory
(VmRSS, its peak VmHWM, and VmRSS after malloc_trim) and the size of the state-cache folder are printed and written to
benchmarks/results/pretrained_memory.json. The run is bounded by records, not time.

Two bounded caches fill as it goes: the state cache (state_cache.INFERENCE_ENTRIES states) and the collator's word
features (data.batching.word_feature_row, an LRU of 262,144 words, about 0.85 MB per 1,000 words): every generated
record holds a new number, so the second grows by one word per record until its bound (~220 MB), the worst case.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / "benchmarks" / "runs" / "smollm2-135m-instruct"
VOCAB = [
    "the",
    "a",
    "of",
    "to",
    "in",
    "and",
    "for",
    "on",
    "with",
    "by",
    "at",
    "from",
    "as",
    "is",
    "was",
    "were",
    "be",
    "has",
    "had",
    "said",
    "will",
    "would",
    "year",
    "years",
    "new",
    "market",
    "government",
    "police",
    "people",
    "city",
    "state",
    "minister",
    "president",
    "company",
    "shares",
    "percent",
    "group",
    "world",
    "team",
    "match",
    "win",
    "lost",
    "first",
    "second",
    "two",
    "three",
    "four",
    "five",
    "million",
    "week",
    "day",
    "today",
    "Monday",
    "Tuesday",
    "London",
    "Paris",
    "Germany",
    "France",
    "Britain",
    "China",
    "Japan",
    "United",
    "States",
    "European",
    "Union",
    "Reuters",
    "film",
    "movie",
    "story",
    "good",
    "bad",
    "great",
    "best",
    "worst",
    "funny",
    "boring",
    "love",
    "hate",
    "performance",
    "director",
    "actor",
    "plot",
    "script",
    "charming",
    "dull",
    "brilliant",
    "mess",
]


def sentence(i: int, lengths: tuple[int, int] = (6, 20)) -> str:
    """The i-th generated sentence: ``lengths`` words (an inclusive range), distinct for every i (its number is one
    of them)."""
    rng = random.Random(i)
    words = [rng.choice(VOCAB) for _ in range(rng.randint(lengths[0] - 1, lengths[1] - 1))]
    words.insert(rng.randrange(len(words)), str(i))
    return " ".join(words)


def memory_kb() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in kB (Linux)."""
    out = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def trimmed_rss_kb() -> int | None:
    """VmRSS after glibc's malloc_trim(0) hands freed heap pages back (None where there is no glibc): what is left
    is memory in use, not freed memory the allocator kept."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return memory_kb()["VmRSS"]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def random_trunk(folder: Path, blocks: int) -> Path:
    """A random Llama of SmolLM2's width with ``blocks`` blocks and a tokenizer, saved in ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (SMOLLM2 / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    else:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"])
        tok.train_from_iterator((sentence(i) for i in range(20000)), trainer=trainer)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=576, intermediate_size=1536, num_hidden_layers=blocks,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def frozen_model(checkpoint: Path, blocks: int):
    """configs/demo_pretrained.yaml's model over ``checkpoint``, untrained, as a SavedModel."""
    import torch

    from mtl_decoder.config import load_config
    from mtl_decoder.data.tokenization import TextEncoder
    from mtl_decoder.model import build_model
    from mtl_decoder.model.pretrained.hub import load_tokenizer
    from mtl_decoder.saved import SavedModel

    overrides = [f"model.trunk.pretrained={checkpoint}", "model.trunk.mode=frozen", f"model.trunk.layers={blocks}"]
    config = load_config(REPO / "configs" / "demo_pretrained.yaml", overrides)
    encoder = TextEncoder.for_model(load_tokenizer(config.model.trunk), config.model, config.data.max_length)
    tags = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    label_sets = {
        name: list(task.labels) if task.labels else tags for name, task in config.tasks.items()
    }  # the demo's tasks: entity tags and sentiment
    torch.manual_seed(0)
    model = build_model(config, label_sets, encoder).eval()
    return SavedModel(model, encoder, config, label_sets, Path(f"untrained:{checkpoint.name}"))


def measure(sizes: list[int], blocks: int, batch_size: int, lengths: tuple[int, int], precision: str) -> dict:
    import torch

    from mtl_decoder.data.batching import word_feature_row
    from mtl_decoder.prediction import predict_texts

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pretrained-memory-") as tmp:
        cache_root = Path(tmp) / "cache"
        os.environ["MTL_DECODER_CACHE"] = str(cache_root)  # the model's state cache: a folder of this run only
        saved = frozen_model(random_trunk(Path(tmp) / "trunk", blocks), blocks)
        states = saved.model.states
        rows: list[dict] = []
        started, words = time.perf_counter(), [0]
        marks = sorted(sizes)

        def items():
            for i in range(marks[-1]):
                if i in marks:
                    report(i)
                yield sentence(i, lengths)

        def report(n: int) -> None:
            cache = states.cache
            row = {
                "records": n,
                "seconds": round(time.perf_counter() - started, 1),
                "rss_mb": round(memory_kb()["VmRSS"] / 1024, 1),
                "peak_rss_mb": round(memory_kb()["VmHWM"] / 1024, 1),
                "rss_after_malloc_trim_mb": round((trimmed_rss_kb() or 0) / 1024, 1),
                "states_in_memory": len(cache.memory),
                "word_feature_cache_entries": word_feature_row.cache_info().currsize,
                "cache_folder_mb": round(folder_bytes(cache_root) / 2**20, 2),
                "trunk_runs": cache.misses,
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)

        report(0)
        for pred in predict_texts(saved, items(), batch_size=batch_size, workers=1, precision=precision):
            words[0] += len(next(v["tags"] for v in pred.values() if "tags" in v))
        report(marks[-1])
        elapsed = time.perf_counter() - started
    return {
        "rows": rows,
        "words": words[0],
        "records_per_s": round(marks[-1] / elapsed, 1),
        "words_per_s": round(words[0] / elapsed, 1),
        "parameters_trunk": sum(p.numel() for p in states.base.parameters()),
    }


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from spacy_throughput import cpu_name

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="records at which to report (comma list)")
    parser.add_argument("--blocks", type=int, default=2, help="trunk blocks (width 576)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--words", default="6-20", help="words per record, MIN-MAX")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "int8"), help="as predict --precision")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pretrained_memory.json"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    low, _, high = args.words.partition("-")
    lengths = (int(low), int(high or low))
    if not 2 <= lengths[0] <= lengths[1]:
        raise SystemExit(f"--words: expected MIN-MAX with 2 <= MIN <= MAX, got {args.words!r}")
    result = {
        "benchmark": "pretrained_memory",
        "command": "python benchmarks/pretrained_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_name(),
        "threads": 1,
        "trunk": f"random Llama, width 576 (SmolLM2-135M's), {args.blocks} blocks, frozen; "
        "configs/demo_pretrained.yaml's layers on top, untrained",
        "precision": args.precision,
        "input": f"distinct generated sentences of {lengths[0]}-{lengths[1]} words, streamed through predict_texts "
        "(every task)",
        **measure(sizes, args.blocks, args.batch_size, lengths, args.precision),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
