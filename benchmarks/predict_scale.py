"""``mtl-decoder predict`` in one process against two processes under ``torchrun`` on this machine.

    python benchmarks/predict_scale.py [--records 4000] [--repeats 2] [--batch-size 64] [--json]

Data: the bundled samples (tasks/data: CoNLL-2003 token lists and SST-2 texts, train files), interleaved, the
first --records of them, as one JSON-lines file. Model: the model section of configs/demo.yaml, untrained (speed
does not depend on the weights; see predict_throughput.py), saved to a folder as a trained one would be.

Three ways, each the full command a user types (so each pays its start-up: importing torch, loading the model):
- 1 process, 1 thread: ``python -m mtl_decoder predict --workers 1`` with one torch thread;
- 1 process, 2 threads: the single-process default on 2 cores (``--workers 2``, a thread each);
- 2 processes: ``torchrun --nproc_per_node 2 -m mtl_decoder predict --workers 1``, a thread each.
They run --repeats times in alternating order (the machine may be shared); each way's wall-clock seconds and the
``predict`` seconds its summary reports (reading, predicting and writing, start-up excluded) are the medians.
The outputs of the three are checked to be byte-identical. Also measured: reading and parsing the input alone
(every process of a multi-process run reads all of it), which bounds how far more processes can go.

Writes benchmarks/results/predict_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "predict_scale.json"
WAYS = {
    "1 process, 1 thread": (1, 1),
    "1 process, 2 threads": (1, 2),
    "2 processes, 1 thread each": (2, 1),
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_input(path: Path, records: int) -> Path:
    """CoNLL-2003 and SST-2 sample records, alternating, as JSON lines (every field kept)."""
    samples = REPO / "tasks" / "data"
    conll = (samples / "conll2003-sample" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    sst2 = (samples / "sst2-sample" / "train.jsonl").read_text(encoding="utf-8").splitlines()
    mixed = [line for pair in zip(conll, sst2, strict=False) for line in pair]
    if len(mixed) < records:
        raise SystemExit(f"the samples hold {len(mixed)} records, {records} asked for")
    path.write_text("\n".join(mixed[:records]) + "\n", encoding="utf-8")
    return path


def save_demo_model(folder: Path, source: Path) -> Path:
    """The demo model (untrained, tokenizer trained on the input) saved as a model folder."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from predict_throughput import demo_model

    from mtl_decoder.saved import save_model

    items, tags = [], set()
    for line in source.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        items.append(record["tokens"] if "tokens" in record else record["text"])
        tags.update(record.get("ner_tags", []))
    saved = demo_model(items, tags)
    save_model(folder, saved.model, saved.encoder, saved.config, saved.label_sets)
    return folder


def run_way(processes: int, threads: int, model: Path, source: Path, out: Path, batch_size: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
    predict = ["predict", "--model", str(model), "--input", str(source), "--output", str(out), "--force",
               "--batch-size", str(batch_size), "--workers", str(threads)]  # fmt: skip
    if processes == 1:
        command = [sys.executable, "-m", "mtl_decoder", *predict]
    else:
        torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
        command = [torchrun, "--nproc_per_node", str(processes), "-m", "mtl_decoder", *predict]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    seconds = float(re.search(r"^([0-9.]+) s \(", done.stdout, re.M).group(1))
    return {"wall": wall, "predict": seconds, "output": out.read_bytes()}


def reading_seconds(source: Path) -> float:
    """Reading and parsing every record of the input, as each process of a multi-process run does."""
    from mtl_decoder.data.inputs import InputReader

    start = time.perf_counter()
    count = sum(1 for _ in InputReader(source))
    assert count > 0
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="predict-scale-"))
    try:
        source = write_input(work / "input.jsonl", args.records)
        model = save_demo_model(work / "model", source)
        times: dict[str, list[dict]] = {name: [] for name in WAYS}
        outputs = set()
        for r in range(args.repeats):
            order = list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]
            for name in order:
                processes, threads = WAYS[name]
                result = run_way(processes, threads, model, source, work / "out.jsonl", args.batch_size)
                outputs.add(result.pop("output"))
                times[name].append(result)
        read_s = statistics.median(reading_seconds(source) for _ in range(3))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ways = {
        name: {
            "processes": WAYS[name][0],
            "threads_per_process": WAYS[name][1],
            "wall_seconds": round(statistics.median(t["wall"] for t in runs), 2),
            "predict_seconds": round(statistics.median(t["predict"] for t in runs), 2),
            "records_per_s": round(args.records / statistics.median(t["predict"] for t in runs), 1),
            "runs": [{k: round(v, 2) for k, v in t.items()} for t in runs],
        }
        for name, runs in times.items()
    }
    base = ways["1 process, 1 thread"]["predict_seconds"]
    return {
        "benchmark": "predict_scale",
        "records": args.records,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "ways": ways,
        "speedup_2_processes_over_1_thread": round(base / ways["2 processes, 1 thread each"]["predict_seconds"], 2),
        "speedup_2_processes_over_2_threads": round(
            ways["1 process, 2 threads"]["predict_seconds"] / ways["2 processes, 1 thread each"]["predict_seconds"], 2
        ),
        "outputs_identical": len(outputs) == 1,
        "reading_seconds": round(read_s, 3),
        "reading_records_per_s": round(args.records / read_s, 1),
        "model": "configs/demo.yaml model section, untrained (3.0M parameters), saved as a model folder",
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=4000, help="records predicted by every run (default 4000)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, alternating (default 2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="print the JSON written to the results file")
    args = parser.parse_args(argv)
    result = measure(args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, way in result["ways"].items():
            print(f"{name:28s} predict {way['predict_seconds']:7.2f} s  {way['records_per_s']:8.1f} rec/s  "
                  f"(command {way['wall_seconds']:.1f} s)")  # fmt: skip
        print(f"outputs identical: {result['outputs_identical']}; reading alone: {result['reading_records_per_s']} "
              f"records/s; CPU: {result['cpu']} x {result['cpus']}; wrote {RESULTS}")  # fmt: skip
    return 0 if result["outputs_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
