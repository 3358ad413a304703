"""predict and evaluate under torchrun with two CPU processes (gloo): the files one process writes, byte for byte
(txt, jsonl and csv from the bundled samples, clean and with bad records, fail and skip mode), the same summary
counts and errors, the same metrics.json; a rank that fails or is killed is named and nothing is written.

All the commands of one launch run in one torchrun (tests/prediction/launch_driver.py), so the processes start
once; the single-process references run in this process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import needs_torchrun, torchrun
from predict_testkit import write_delimited, write_jsonl, write_lines

from mtl_decoder.cli import main
from mtl_decoder.evaluation.evaluate import evaluate
from mtl_decoder.files import TMP_MARK

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "tasks" / "data"
DRIVER = Path(__file__).parent / "launch_driver.py"
RECORDS, BATCH = 150, 4  # blocks of 64 records: rank 0 takes blocks 0 and 2 (short), rank 1 block 1 (and waits)


def _sample(name: str, records: int) -> list[dict]:
    lines = (SAMPLES / name / "test.jsonl").read_text(encoding="utf-8").splitlines()[:records]
    return [json.loads(line) for line in lines]


def write_inputs(folder: Path, records: int = RECORDS) -> dict[str, Path]:
    """Clean and bad (two unreadable records in the jsonl, one in the txt and the csv) inputs in three formats,
    the first ``records`` of the bundled samples."""
    conll, sst2 = _sample("conll2003-sample", records), _sample("sst2-sample", records)
    texts = [r["text"] for r in sst2]
    rows = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    paths = {
        "jsonl": write_jsonl(folder / "tokens.jsonl", conll),
        "sst2": write_jsonl(folder / "sst2.jsonl", sst2),  # labelled: for evaluate
        "txt": write_lines(folder / "texts.txt", texts),
        "csv": write_delimited(folder / "texts.csv", rows, ","),
    }
    bad_jsonl = [json.dumps(r) for r in conll]
    bad_jsonl[records * 2 // 15 : records * 2 // 15] = ['{"tokens": []}']  # line 21 of 150
    bad_jsonl[records * 2 // 3 : records * 2 // 3] = ['{"tokens": ["unclosed"']
    paths["jsonl-bad"] = write_lines(folder / "tokens-bad.jsonl", bad_jsonl)
    txt = (folder / "texts-bad.txt").open("wb")
    for i, text in enumerate(texts):
        txt.write(text.encode() + b"\n" + (b"caf\xe9 bytes that are not UTF-8\n" if i == records // 3 else b""))
    txt.close()
    paths["txt-bad"] = folder / "texts-bad.txt"
    rows[records // 2] = {"id": str(records // 2), "text": ""}
    paths["csv-bad"] = write_delimited(folder / "texts-bad.csv", rows, ",")
    return paths


PREDICT_CASES = {  # name -> (input, mode)
    "jsonl": ("jsonl", "fail"),
    "txt": ("txt", "fail"),
    "csv": ("csv", "fail"),
    "csv-skip": ("csv", "skip"),
    "jsonl-bad-skip": ("jsonl-bad", "skip"),
    "txt-bad-skip": ("txt-bad", "skip"),
    "csv-bad-skip": ("csv-bad", "skip"),
    "jsonl-bad-fail": ("jsonl-bad", "fail"),
}


def predict_argv(model: Path, source: Path, out: Path, mode: str, *extra: str) -> list[str]:
    return ["predict", "--model", str(model), "--input", str(source), "--output", str(out), "--batch-size",
            str(BATCH), "--workers", "1", "--on-error", mode, *extra]  # fmt: skip


def evaluate_argv(model: Path, inputs: dict[str, Path], out: Path) -> list[str]:
    return ["evaluate", "--model", str(model), "--data", f"ner={inputs['jsonl']}", "--data",
            f"sentiment={inputs['sst2']}", "--batch-size", str(BATCH), "--output", str(out)]  # fmt: skip


def launch(cases: list[dict], folder: Path, fail: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    cases_path, results_path = folder / "cases.json", folder / "results.json"
    cases_path.write_text(json.dumps(cases), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if fail:
        env["DRIVER_FAIL"] = fail
    done = subprocess.run(
        [*torchrun(), str(DRIVER), str(cases_path), str(results_path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    return done, results


def run_here(argv: list[str]) -> dict:
    """The command in this process (one process): status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if TMP_MARK in p.name]


@pytest.fixture(scope="module")
def runs(best, tmp_path_factory):
    """Every case once in one process (here) and once in two (one torchrun): folder -> outputs, and results."""
    root = tmp_path_factory.mktemp("processes")
    inputs = write_inputs(root)
    one, two = root / "one", root / "two"
    one.mkdir(), two.mkdir()
    single, cases = {}, []
    for name, (source, mode) in PREDICT_CASES.items():
        single[name] = run_here(predict_argv(best, inputs[source], one / f"{name}.jsonl", mode))
        cases.append({"name": name, "argv": predict_argv(best, inputs[source], two / f"{name}.jsonl", mode)})
    for k in range(2):  # --shard under the launcher: each shard's blocks split again between the two processes
        part = two / f"part-{k}.jsonl"
        argv = predict_argv(best, inputs["jsonl-bad"], part, "skip", "--shard", f"{k}/2")
        cases.append({"name": f"shard-{k}", "argv": argv})
    cases.append({"name": "evaluate", "argv": evaluate_argv(best, inputs, two / "eval")})
    done, launched = launch(cases, root)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"root": root, "one": one, "two": two, "single": single, "launched": launched, "inputs": inputs}


@needs_torchrun
@pytest.mark.parametrize("name", [n for n, (_, mode) in PREDICT_CASES.items() if not n.endswith("-fail")])
def test_two_processes_write_what_one_writes_byte_for_byte(runs, name):
    one, two = runs["one"], runs["two"]
    single, launched = runs["single"][name], runs["launched"][name]
    assert launched["status"] == single["status"] == 0, launched["stderr"]
    assert (two / f"{name}.jsonl").read_bytes() == (one / f"{name}.jsonl").read_bytes()
    errors = f"{name}.errors.jsonl"
    assert (two / errors).is_file() == (one / errors).is_file() == name.endswith("skip")
    if name.endswith("skip"):
        assert (two / errors).read_bytes() == (one / errors).read_bytes()
    counts = launched["stdout"].splitlines()[0]  # read, predicted, skipped, truncated, windows, empty lines
    assert counts == single["stdout"].splitlines()[0] and counts.startswith("read ")
    if "bad" in name:
        assert ", skipped 0," not in counts and (one / errors).read_text().count("\n") >= 1
    assert not temporaries(two)


@needs_torchrun
def test_a_bad_record_in_fail_mode_stops_both_with_the_error_of_one(runs):
    single, launched = runs["single"]["jsonl-bad-fail"], runs["launched"]["jsonl-bad-fail"]
    assert single["status"] == launched["status"] == 2
    assert single["stderr"].startswith("error: ") and ":21:" in single["stderr"]  # the first bad record's line
    assert launched["stderr"] == single["stderr"]
    assert not (runs["two"] / "jsonl-bad-fail.jsonl").exists()
    assert not temporaries(runs["two"])


@needs_torchrun
def test_shards_under_a_launcher_merge_to_the_output_of_one_process(runs, tmp_path):
    two = runs["two"]
    assert all(runs["launched"][f"shard-{k}"]["status"] == 0 for k in range(2))
    merged = tmp_path / "merged.jsonl"
    assert main(["merge-predictions", str(merged), str(two / "part-1.jsonl"), str(two / "part-0.jsonl")]) == 0
    assert merged.read_bytes() == (runs["one"] / "jsonl-bad-skip.jsonl").read_bytes()
    errors = (tmp_path / "merged.errors.jsonl").read_bytes()
    assert errors == (runs["one"] / "jsonl-bad-skip.errors.jsonl").read_bytes()


@needs_torchrun
def test_two_processes_evaluate_to_the_metrics_of_one(runs, best, tmp_path):
    assert runs["launched"]["evaluate"]["status"] == 0, runs["launched"]["evaluate"]["stderr"]
    data = {"ner": runs["inputs"]["jsonl"], "sentiment": runs["inputs"]["sst2"]}
    reference = evaluate(best, split="test", data=data, batch_size=BATCH, output_dir=tmp_path).metrics
    metrics = json.loads((runs["two"] / "eval" / "metrics.json").read_text())
    assert metrics["data"]["ner"]["examples"] == metrics["data"]["sentiment"]["examples"] == RECORDS
    reference = json.loads(json.dumps(reference))  # as written: tuples become lists
    for key in ("tasks", "summary", "data", "settings", "notes", "model", "split"):
        assert metrics[key] == reference[key], key  # the same predictions: the same metrics exactly
    assert close(metrics["experts"], reference["experts"])  # sums over the processes' shares, in another order
    assert (runs["two"] / "eval" / "report.md").is_file()


def close(a, b) -> bool:
    """Equal, floats to a relative 1e-9."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@needs_torchrun
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failed_or_killed_rank_is_named_and_nothing_is_written(best, tmp_path, how):
    inputs = write_inputs(tmp_path)  # rank 1 fails in its first batch: its block (64 records on) must exist
    out = tmp_path / "out" / "pred.jsonl"
    argv = predict_argv(best, inputs["jsonl-bad"], out, "skip")
    done, results = launch([{"name": "predict", "argv": argv}], tmp_path, fail=how)
    assert done.returncode != 0
    if how == "raise":  # rank 1's error reaches rank 0 at the next round, which names it
        assert results["predict"]["status"] == 2
        assert "rank 1 of 2 failed: RuntimeError: the device of rank 1 broke" in results["predict"]["stderr"]
    else:  # killed: rank 0 loses contact, and the launcher's summary names the rank and its signal
        said = results["predict"]["stderr"] if results else done.stderr  # unless the launcher stopped rank 0 first
        assert "lost contact with another process" in said or "terminated" in said
        assert "rank      : 1 (local_rank: 1)" in done.stderr and "SIGKILL" in done.stderr
    assert not out.exists() and not (tmp_path / "out" / "pred.errors.jsonl").exists()
    assert not temporaries(tmp_path / "out")
