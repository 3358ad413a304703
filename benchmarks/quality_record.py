"""What ``quality.py`` records beside a run's metrics (the machine, the date, the commit) and how it merges the run
into its results file."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
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
