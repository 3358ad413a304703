"""Timing shared by the throughput benchmarks (``spacy_throughput.py``, ``pretrained_*.py``, ``distill_rows.py``):
the input sentences, wall and CPU time of a run with the threads that did the work, and the machine's name.

Standard library only: spaCy's worker (``spacy_worker.py``) imports it from spaCy's own virtual environment.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUSY_SHARE = 0.1
"""A thread 'did the work' when it took at least this share of its process's CPU time during a measurement."""


def default_data_root() -> Path:
    """../shared/data beside the checkout (or beside the folder of worktrees that holds it)."""
    for root in (REPO.parent, REPO.parent.parent):
        if (root / "shared" / "data").is_dir():
            return root / "shared" / "data"
    return REPO.parent / "shared" / "data"


def read_sentences(data_root: Path, count: int) -> list[list[str]]:
    """The first ``count`` CoNLL-2003 test token lists (0: all)."""
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        items = [json.loads(line)["tokens"] for line in f if line.strip()]
    return items[:count] if count else items


def thread_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of this process (Linux; empty elsewhere)."""
    ticks = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[tid] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except OSError:
        return {}
    return ticks


class ThreadSampler:
    """The CPU ticks each thread of this process used while it ran, sampled every ``every`` seconds (threads that
    start and end within a measurement, such as the Predictor's workers, are seen up to their last sample)."""

    def __init__(self, every: float = 0.05):
        self.every, self.stop = every, threading.Event()
        self.first, self.last = thread_ticks(), {}
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self.last.update(thread_ticks())

    def finish(self) -> dict[str, int]:
        self.stop.set()
        self.thread.join()
        self.last.update(thread_ticks())
        me = str(self.thread.native_id)
        return {tid: t - self.first.get(tid, 0) for tid, t in self.last.items() if tid != me}


def timed(fn) -> dict:
    """Run ``fn`` (-> words) and measure wall time, process CPU time and the threads that did the work."""
    sampler = ThreadSampler()
    cpu, start = time.process_time(), time.perf_counter()
    words = fn()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    used = sampler.finish()
    total = sum(used.values())
    return {
        "words": words,
        "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3),
        "words_per_s": round(words / wall, 1),
        "words_per_cpu_s": round(words / cpu, 1) if cpu > 0 else None,
        "busy_threads": sum(1 for v in used.values() if total and v >= BUSY_SHARE * total),
    }


def words_of(items: list[list[str]]) -> int:
    return sum(len(words) for words in items)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            info = f.read()
    except OSError:
        return platform.processor()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    family = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("cpu family")), "")
    number = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model\t")), "")
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx_vnni") if f in flags)
    return f"{model} (family {family}, model {number}), {os.cpu_count()} cores, {isa or 'no AVX2'}"


def median_of(rows: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 1)
