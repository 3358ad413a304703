"""Runs several ``mtl-decoder`` commands in one launch of several processes (one process group, started once), as
``torchrun --nproc_per_node 2 launch_driver.py CASES.json RESULTS.json``. Used by test_predict_processes.py.

CASES.json: a list of {"name", "argv"}; each process runs ``mtl_decoder.cli.main(argv)`` for each case in turn,
as ``torchrun -m mtl_decoder ARGV`` would. Rank 0 writes RESULTS.json: name -> {"status", "stdout", "stderr"}.

DRIVER_FAIL=raise|kill (tests of failures): rank 1 raises a RuntimeError, or kills itself with SIGKILL, in its
first batch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys


def break_rank_one(how: str) -> None:
    from mtl_decoder.inference.predictor import Predictor

    def failing_batch(self, *args, **kwargs):
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("the device of rank 1 broke")

    Predictor._run_batch = failing_batch


def main() -> int:
    from mtl_decoder.cli import main as cli

    cases_path, results_path = sys.argv[1], sys.argv[2]
    if os.environ.get("DRIVER_FAIL") and os.environ.get("RANK") == "1":
        break_rank_one(os.environ["DRIVER_FAIL"])
    results = {}
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    for case in cases:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli(case["argv"])
        results[case["name"]] = {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}
        print(f"rank {os.environ.get('RANK')}: {case['name']} -> {status} {err.getvalue()}", file=sys.stderr)
    if os.environ.get("RANK", "0") == "0":
        with open(results_path, "w", encoding="utf-8") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
