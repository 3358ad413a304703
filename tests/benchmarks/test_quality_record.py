"""benchmarks/quality_record.py's sampler of a training process's own memory (quality.py's peak_own_memory_mb):
it sees what a child allocates and holds, and not the file pages the child maps."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from quality_record import OwnMemoryPeak

CHILD = """
import mmap, sys, time
held = bytearray(300 * 2**20)  # 300 MiB of its own, touched
with open(sys.argv[1], "rb") as f:
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(mapped[i] for i in range(0, len(mapped), 4096))  # 200 MiB of file pages, touched
print("ready", flush=True)
time.sleep(1.5)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux /proc")
def test_the_peak_counts_what_the_process_holds_not_the_files_it_maps(tmp_path):
    big = tmp_path / "file.bin"
    big.write_bytes(b"\1" * (200 * 2**20))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(big)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    sampler = OwnMemoryPeak(child.pid, every=0.1)
    time.sleep(0.5)
    child.wait()
    peak = sampler.stop()
    assert 300 <= peak < 300 + 150  # its bytearray and the interpreter, not the 200 MiB of mapped file


def test_a_process_gone_before_the_first_sample_gives_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert OwnMemoryPeak(child.pid, every=0.1).stop() is None
