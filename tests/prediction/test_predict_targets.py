"""Where predict may write (issue 27 cases 1-3, 14, 15, 17): a regular file or a new path, never inside the model
folder; a device or FIFO is written through, never replaced; a link is refused and its target left alone; one
process at a time per output; a full disk leaves no temporary file; standard input can be read."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from predict_testkit import read_jsonl, texts, write_lines

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.files import TMP_MARK, AtomicFile
from mtl_decoder.prediction import predict_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def source(tmp_path) -> Path:
    return write_lines(tmp_path / "in.txt", texts())


def _predict(best, source, output, **kwargs):
    return predict_file(best, source, output, progress=False, workers=1, **kwargs)


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if TMP_MARK in p.name or p.name.endswith(".mtl-lock")]


def test_a_fifo_output_is_written_through_and_stays_a_fifo(best, source, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    summary = _predict(best, source, fifo, force=True)
    reader.join(timeout=20)  # a replaced FIFO never gets a writer: its reader would wait forever
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got, "the FIFO's reader got nothing"
    lines = got[0].decode("utf-8").splitlines()
    assert len(lines) == summary.predicted == len(texts())  # the reader got every prediction, not 0 bytes
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_character_device_output_is_written_through_and_not_replaced(best, source, tmp_path):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    summary = _predict(best, source, null, force=True)
    assert summary.predicted == len(texts())
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_output_dash_writes_to_whatever_stdout_is_redirected_to(best, source, tmp_path):
    """`--output - > file` (stdout a link to a file), `>>` (appended, nothing truncated) and `--shard 1/3 --output -
    | tail -1` (a pipe) all write the predictions: standard output is never a file to protect."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "mtl_decoder", "predict", "--model", str(best), "--input", str(source),
            "--output", "-"]  # fmt: skip
    redirected = tmp_path / "file.jsonl"
    redirected.write_text("kept\n", encoding="utf-8")
    with open(redirected, "a", encoding="utf-8") as stdout:  # `>>`: what is there stays
        done = subprocess.run(argv, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = redirected.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "kept" and [json.loads(line)["text"] for line in lines[1:]] == texts()
    with open(tmp_path / "new.jsonl", "w", encoding="utf-8") as stdout:  # `>`
        done = subprocess.run(argv, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [r["text"] for r in read_jsonl(tmp_path / "new.jsonl")] == texts()
    done = subprocess.run([*argv, "--shard", "1/3"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    footer = json.loads(done.stdout.splitlines()[-1])["part"]
    assert (footer["shard"], footer["shards"], footer["records"]) == (1, 3, len(texts()))


def test_a_symlink_output_is_refused_and_its_target_left_alone(best, source, tmp_path):
    target = tmp_path / "target.jsonl"
    target.write_text("old\n", encoding="utf-8")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with pytest.raises(UserError, match="symbolic link"):
        _predict(best, source, link, force=True)
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "old\n"


def test_an_output_inside_the_model_folder_is_refused_and_the_weights_kept(tiny_run, source, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_run / "best", model)
    weights = (model / "model.safetensors").read_bytes()
    with pytest.raises(UserError, match="inside the model folder"):
        _predict(model, source, model / "model.safetensors", force=True)
    with pytest.raises(UserError, match="inside the model folder"):
        _predict(model, source, model / "preds.jsonl")
    assert (model / "model.safetensors").read_bytes() == weights
    assert not (model / "preds.jsonl").exists()


def test_a_second_run_on_an_output_being_written_stops_naming_the_first(best, source, tmp_path):
    out = tmp_path / "out.jsonl"
    first = AtomicFile(out, replace=False)  # run A, still writing (holds the output's lock)
    try:
        with pytest.raises(UserError, match=rf"being written by another mtl-decoder process \(PID {os.getpid()}\)"):
            _predict(best, source, out)  # run B: before, it wrote its file and A then replaced it
        assert not out.exists()
        first.write_line('{"from": "A"}')
        first.commit()
    finally:
        first.discard()
    assert read_jsonl(out) == [{"from": "A"}]
    assert _leftovers(tmp_path) == []


def test_a_file_that_appears_meanwhile_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "out.jsonl"
    mine = AtomicFile(out, replace=False)
    mine.write_line("mine")
    out.write_text("theirs\n", encoding="utf-8")  # another program, between the start and the end of a run
    with pytest.raises(UserError, match="appeared"):
        mine.commit()
    assert out.read_text(encoding="utf-8") == "theirs\n"
    assert _leftovers(tmp_path) == []


def test_a_240_character_output_name_works_and_a_300_byte_one_is_one_line(best, source, tmp_path, capsys):
    long = tmp_path / ("p" * 234 + ".jsonl")
    summary = _predict(best, source, long)
    assert summary.predicted == len(texts()) and len(read_jsonl(long)) == len(texts())
    too_long = tmp_path / ("q" * 300 + ".jsonl")
    argv = ["predict", "--model", str(best), "--input", str(source), "--output", str(too_long)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "longer than a file system allows" in err[0]


def _limit_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(best, tmp_path):
    big = write_lines(tmp_path / "big.txt", texts() * 200)  # ~1,000 records, ~300 KB of predictions
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    argv = ["predict", "--model", str(best), "--input", str(big), "--output", str(out_dir / "out.jsonl")]
    proc = subprocess.run(
        [sys.executable, "-m", "mtl_decoder", *argv, "--workers", "1"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size(64 * 1024),
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0] and "temporary file was removed" in lines[0], lines
    assert list(out_dir.iterdir()) == []


def test_standard_input_is_read_with_a_format_and_refused_without_one(best, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "out.jsonl"
    base = [sys.executable, "-m", "mtl_decoder", "predict", "--model", str(best), "--input", "-", "--workers", "1"]
    text = "".join(t + "\n" for t in texts())

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], input=text, env=env, capture_output=True, text=True, timeout=300)

    proc = run("--output", str(out), "--format", "txt")
    assert proc.returncode == 0, proc.stderr
    assert [r["text"] for r in read_jsonl(out)] == texts()
    proc = run("--output", "-", "--format", "txt")  # and the predictions on stdout, the summary on stderr
    assert proc.returncode == 0 and [json.loads(line)["text"] for line in proc.stdout.splitlines()] == texts()
    assert "predictions -> /dev/stdout" in proc.stderr
    proc = run("--output", str(tmp_path / "o2.jsonl"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --input -: standard input has no suffix to say its format; give --format "
        "jsonl | csv | tsv | txt | conll"
    ]
