"""The teacher's labelling shared between processes: one process against two (torchrun), the same texts, alternately.

    python benchmarks/labelling_processes.py --teacher benchmarks/runs/smollm2_echo_hybrid2_on16_bidir_3k_ple/best \
        [--texts 1000] [--rounds 2] [--out labelling_processes.json]

Each run is ``mtl-decoder distill`` (``training.max_steps=1``) into a cold target cache: a small native student of
the teacher's tasks (conll2003, sst2) whose training files are the first 50 sentences of each bundled sample, and
the first --texts lines of ../shared/data/unlabelled/news.txt as the transfer set; the teacher labels them all in
float32, one thread per process, with an empty state cache (``MTL_DECODER_CACHE``), so that every text runs through
its trunk as a new text does. The figure is the labelling's wall time as ``distill.json`` records it
(``targets.seconds``: the slowest process's share, the teacher's loading included), words labelled per second and
the two-process speed-up, with
the spread over the rounds, and what the faster two-process rate makes of ../shared/data/unlabelled's words (the texts
a teacher's own training cached no states of). Writes benchmarks/results/NAME.json with the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_record import machine

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "tasks" / "data"
STUDENT = {
    "model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "expert_hidden": 64},
    "tokenizer": {"vocab_size": 2000, "min_frequency": 1},
    "training": {"max_steps": 1, "eval_every": 1, "progress": False},
}
"""The student: any native model of the teacher's tasks (it trains one step; only the labelling is timed)."""
SAMPLE_TEXTS = 50


def write_inputs(folder: Path, news: Path, texts: int) -> tuple[Path, Path, int]:
    """The student config (tasks conll2003 and sst2 on sample slices) and the transfer file; (config, transfer
    file, words of every text the teacher labels: the transfer file's and the training files')."""
    tasks, words = [], 0
    for name, kind, sample, columns in (
        ("conll2003", "token_tagging", "conll2003-sample", {"tokens": "tokens", "tags": "ner_tags"}),
        ("sst2", "sentence_classification", "sst2-sample", {"text": "text", "label": "label"}),
    ):
        data = {}
        for split in ("train", "validation"):
            lines = (SAMPLES / sample / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()[:SAMPLE_TEXTS]
            (folder / f"{name}_{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
            data[split] = str(folder / f"{name}_{split}.jsonl")
            if split == "train":
                records = [json.loads(line) for line in lines]
                words += sum(len(r["tokens"]) if "tokens" in r else len(r["text"].split()) for r in records)
        task = {"name": name, "kind": kind, "data": data, "columns": columns}
        if name == "sst2":
            task["labels"] = ["negative", "positive"]
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(task), encoding="utf-8")
        tasks.append(str(folder / f"{name}.yaml"))
    config = folder / "student.yaml"
    config.write_text(yaml.safe_dump({"tasks": tasks, **STUDENT}), encoding="utf-8")
    lines = [line for line in news.read_text(encoding="utf-8").splitlines() if line.strip()][:texts]
    transfer = folder / "news.txt"
    transfer.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config, transfer, words + sum(len(line.split()) for line in lines)


def label_once(teacher: Path, config: Path, transfer: Path, processes: int, work: Path) -> dict:
    """One distill run into a cold cache; its distill.json targets."""
    out, cache = work / f"run-{processes}", work / f"cache-{processes}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    args = ["distill", "--teacher", str(teacher), "--config", str(config), "--unlabelled", str(transfer),
            "--output-dir", str(out), f"distill.cache_dir={cache}"]  # fmt: skip
    if processes == 1:
        command = [sys.executable, "-m", "mtl_decoder", *args]
    else:
        torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
        command = [torchrun, "--nproc_per_node", str(processes), "-m", "mtl_decoder", *args]
    # an empty state cache: every text runs through the teacher's trunk (a cached text costs it a whole shard's read,
    # a fixed cost that no number of processes divides)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MTL_DECODER_CACHE": str(work / "empty")}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    targets = json.loads((out / "distill.json").read_text(encoding="utf-8"))["targets"]
    shutil.rmtree(cache, ignore_errors=True)
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", type=Path, required=True, help="the teacher's saved folder (RUN/best)")
    parser.add_argument("--texts", type=int, default=1000, help="lines of news.txt in the transfer set")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-root", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", default="labelling_processes.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config, transfer, words = write_inputs(work, args.data_root / "unlabelled" / "news.txt", args.texts)
        rounds = []
        for r in range(args.rounds):
            pair = {}
            for processes in (1, 2) if r % 2 == 0 else (2, 1):  # alternately: drift in the machine's load evens out
                targets = label_once(args.teacher.resolve(), config, transfer, processes, work)
                pair[str(processes)] = {"seconds": targets["seconds"], "texts": targets["computed"],
                                        "words_per_s": round(words / targets["seconds"], 1),
                                        "teacher_forwards": targets["teacher_forwards"]}  # fmt: skip
                print(f"round {r}: {processes} process(es) labelled {targets['computed']} texts in "
                      f"{targets['seconds']} s", flush=True)  # fmt: skip
            pair["speedup"] = round(pair["1"]["seconds"] / pair["2"]["seconds"], 3)
            rounds.append(pair)
    folder = args.data_root / "unlabelled"
    unlabelled = {name: sum(len(line.split()) for line in (folder / f"{name}.txt").open(encoding="utf-8"))
                  for name in ("news", "movie_reviews")}  # fmt: skip
    best = max(p["2"]["words_per_s"] for p in rounds)
    result = {
        "benchmark": "labelling_processes",
        "teacher": str(args.teacher),
        "precision": "fp32",
        "threads_per_process": 1,
        "input": f"the first {args.texts} lines of unlabelled/news.txt and {SAMPLE_TEXTS} training sentences of each "
        "bundled sample (conll2003, sst2), cold target cache, empty state cache",
        "words": words,
        "rounds": rounds,
        "one_process_words_per_s": [p["1"]["words_per_s"] for p in rounds],
        "two_processes_words_per_s": [p["2"]["words_per_s"] for p in rounds],
        "speedup": [p["speedup"] for p in rounds],
        "unlabelled_words": unlabelled,
        "unlabelled_hours_two_processes": round(sum(unlabelled.values()) / best / 3600, 2),
        **machine(),
    }
    path = REPO / "benchmarks" / "results" / args.out
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("words", "one_process_words_per_s", "two_processes_words_per_s",
                                             "speedup", "cpu")}))  # fmt: skip


if __name__ == "__main__":
    main()
