"""What ``quality.py`` records beside a run's metrics (the machine, the date, the commit) and how it merges the run
into its results file."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import threading
from pathlib import Path

from quality_models import REPO

from mtl_decoder.files import atomic_write_text


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> dict:
    """The CPU model, family and AVX-512 flags, read from /proc/cpuinfo (Linux); timings depend on all three (two
    machines both named "AMD EPYC", families 25 and 26, ran the same student at 0.78x and 1.22x spaCy's speed)."""
    model, family, flags = None, None, []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "cpu family" and family is None:
                family = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    return {
        "cpu": model or platform.processor() or "unknown",
        "cpu_family": family,
        "cpu_cores": os.cpu_count(),
        "avx512": bool(avx512),
        "avx512_flags": avx512,
    }


def machine() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}",
        **cpu_info(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "commit": commit.strip(),
    }


def save_run(path: Path, name: str, run: dict) -> dict:
    """Merge one run into the results file, read again just before writing (another quality.py may have added
    runs since this one started), written whole and renamed into place."""
    results = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    results["runs"][name] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(results, indent=2))
    return results


def resident_mib(pid: int | str = "self") -> dict[str, float]:
    """A process's resident memory in MiB from /proc/PID/status: VmHWM (peak), VmRSS, RssAnon (its own) and RssFile
    (file pages it maps); {} when the process is gone or there is no /proc."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return fields


class OwnMemoryPeak:
    """The peak of a running process's own resident memory (RssAnon, in MiB), sampled every ``every`` seconds on a
    thread until ``stop()``: the memory a run needs free. Its peak resident size (ru_maxrss) also counts the file
    pages it maps, such as a state cache read as mapped views, which the kernel shares and may drop. None off
    Linux (no /proc)."""

    def __init__(self, pid: int, every: float = 5.0):
        self.pid, self.every = pid, every
        self.peak_mib: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        mib = resident_mib(self.pid).get("RssAnon")
        if mib is not None:
            self.peak_mib = mib if self.peak_mib is None else max(self.peak_mib, mib)

    def _run(self) -> None:
        while True:
            self._sample()
            if self._done.wait(self.every):
                return

    def stop(self) -> float | None:
        """Stop sampling (the process may have exited: its last sample stands); the peak in MiB, or None."""
        self._done.set()
        self._thread.join()
        return self.peak_mib
