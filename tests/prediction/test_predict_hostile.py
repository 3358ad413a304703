"""predict under hostile inputs and interruptions: nothing lost, nothing silent (issue 17).

SIGTERM discards the temporaries (exit 143), a killed run's temporaries are removed by the next run, --force
replaces the errors file too, an input field named ``predictions`` is refused, a hostile record is one record's
error, a run in which every record failed exits 2 after its summary, and bad arguments are refused before the
model is loaded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from predict_testkit import read_jsonl, texts, write_jsonl, write_lines

import mtl_decoder.inference.loading as loading_module
import mtl_decoder.prediction.predict as predict_module
from mtl_decoder.cli import main
from mtl_decoder.errors import DataError
from mtl_decoder.prediction import predict_file
from mtl_decoder.termination import Terminated

REPO = Path(__file__).resolve().parents[2]


def _argv(best, source, out, *extra) -> list[str]:
    return ["predict", "--model", str(best), "--input", str(source), "--output", str(out), *extra]


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".mtl-tmp-" in p.name)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------------------------------- interruptions


def test_sigterm_discards_the_temporaries_keeps_the_old_output_and_exits_143(best, tmp_path, monkeypatch, capsys):
    source = write_lines(tmp_path / "in.txt", texts() * 4)
    out = tmp_path / "out.jsonl"
    out.write_text("the earlier output\n", encoding="utf-8")
    (tmp_path / "out.errors.jsonl").write_text("the earlier errors\n", encoding="utf-8")
    real, calls = predict_module.prediction_dict, []

    def killed_midway(*args, **kwargs):  # the third record: SIGTERM, as `kill PID` would send it
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(predict_module, "prediction_dict", killed_midway)
    before = signal.getsignal(signal.SIGTERM)
    assert main(_argv(best, source, out, "--on-error", "skip", "--force", "--batch-size", "2")) == 143
    assert capsys.readouterr().err.strip() == "terminated"
    assert len(calls) == 3  # it stopped there
    assert _temporaries(tmp_path) == []
    assert out.read_text(encoding="utf-8") == "the earlier output\n"
    assert (tmp_path / "out.errors.jsonl").read_text(encoding="utf-8") == "the earlier errors\n"
    assert signal.getsignal(signal.SIGTERM) == before  # the handler was only there during predict_file
    calls.clear()
    monkeypatch.setattr(predict_module, "prediction_dict", killed_midway)
    with pytest.raises(Terminated):  # in a program: an exception that no `except Exception` swallows
        predict_file(best, source, out, force=True, batch_size=2, progress=False)


def test_sigterm_from_another_process_leaves_no_temporary(best, tmp_path):
    source = write_lines(tmp_path / "in.txt", texts() * 20_000)  # 100,000 records: far more than it gets to
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtl_decoder", *_argv(best, source, out, "--on-error", "skip")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    # the output's temporary and the errors file's are opened one after the other: wait for both, not the first
    while len(_temporaries(tmp_path)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(_temporaries(tmp_path)) == 2, "predict never started writing"  # the output and the errors file
    time.sleep(0.3)  # well inside the prediction loop
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_killed_runs_temporaries_are_removed_by_the_next_run(best, tmp_path, capsys):
    source = write_lines(tmp_path / "in.txt", texts())
    dead, alive = _dead_pid(), os.getppid()
    stale = [f".out.jsonl.mtl-tmp-{dead}-00aa11bb", f".out.errors.jsonl.mtl-tmp-{dead}-22cc33dd"]
    kept = [f".out.jsonl.mtl-tmp-{alive}-44ee55ff", f".other.jsonl.mtl-tmp-{dead}-66aa77bb"]
    for name in stale + kept:
        (tmp_path / name).write_text("partial", encoding="utf-8")
    assert main(_argv(best, source, tmp_path / "out.jsonl")) == 0  # fail mode cleans the errors file's too
    assert "removed: " in capsys.readouterr().out
    assert _temporaries(tmp_path) == sorted(kept)  # a live process's and another file's stay
    assert len(read_jsonl(tmp_path / "out.jsonl")) == len(texts())


# ---------------------------------------------------------------------------------------------- --force


def test_force_in_fail_mode_leaves_an_errors_named_file_it_did_not_write(best, tmp_path, capsys):
    """po.errors.jsonl that predict did not write (notes, another tool's log) is no concern of a fail-mode run: not
    a reason to refuse, and never removed by --force."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts()])
    out, errors = tmp_path / "po.jsonl", tmp_path / "po.errors.jsonl"
    notes = '{"line": 1, "note": "my own log"}\nfree text\n'
    errors.write_text(notes, encoding="utf-8")
    assert main(_argv(best, source, out)) == 0
    out.write_text("the earlier output\n", encoding="utf-8")
    assert main(_argv(best, source, out, "--force")) == 0
    assert "removed" not in capsys.readouterr().out
    assert errors.read_text(encoding="utf-8") == notes and len(read_jsonl(out)) == len(texts())


def test_force_in_fail_mode_removes_an_earlier_skip_runs_errors_file(best, tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts()])
    out, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    errors.write_text('{"line": 3, "reason": "of another input"}\n', encoding="utf-8")
    assert main(_argv(best, source, out)) == 2  # without --force: refused, and says why
    err = capsys.readouterr().err
    assert "out.errors.jsonl: already exists, from an earlier --on-error skip run" in err and "--force" in err
    assert not out.exists() and errors.exists()

    out.write_text("the earlier output\n", encoding="utf-8")
    bad = write_lines(tmp_path / "bad.jsonl", ['{"text": "fine"}', "{broken"])
    assert main(_argv(best, bad, out, "--force")) == 2  # a failed run changes nothing
    assert out.read_text(encoding="utf-8") == "the earlier output\n" and errors.exists()

    assert main(_argv(best, source, out, "--force")) == 0
    assert f"removed: {errors}" in capsys.readouterr().out
    assert not errors.exists() and len(read_jsonl(out)) == len(texts())


# ---------------------------------------------------------------------------------------------- input fields


def test_an_input_field_named_predictions_is_refused_never_overwritten(best, tmp_path, capsys):
    records = [{"text": texts()[0]}, {"text": texts()[1], "predictions": "mine"}, {"text": texts()[2]}]
    source, out = write_jsonl(tmp_path / "in.jsonl", records), tmp_path / "out.jsonl"
    assert main(_argv(best, source, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {source}:2: field 'predictions': the output writes") and "\n" not in err
    assert not out.exists()

    summary = predict_file(best, source, out, on_error="skip", progress=False)
    assert (summary.read, summary.predicted, summary.skipped) == (3, 2, 1)
    assert [r["text"] for r in read_jsonl(out)] == [texts()[0], texts()[2]]
    [error] = read_jsonl(tmp_path / "out.errors.jsonl")
    assert error["line"] == 2 and error["field"] == "predictions" and '"mine"' in error["raw"]


# ---------------------------------------------------------------------------------------------- hostile records


def test_a_run_in_which_every_record_failed_exits_2_after_its_summary(best, tmp_path, capsys):
    source = tmp_path / "noise.jsonl"
    source.write_bytes(random.Random(0).randbytes(20_000))
    out = tmp_path / "out.jsonl"
    assert main(_argv(best, source, out, "--on-error", "skip")) == 2
    captured = capsys.readouterr()
    [line] = [line for line in captured.out.splitlines() if line.startswith("read ")]
    read = int(line.split()[1].replace(",", ""))
    assert read > 0 and f"read {read} records: predicted 0, skipped {read}," in line
    err = captured.err.strip()
    assert "\n" not in err and err.startswith(f"error: {source}: none of its {read} records could be predicted")
    assert len(read_jsonl(tmp_path / "out.errors.jsonl")) == read  # the reasons are kept
    assert read_jsonl(out) == []


def test_deep_nesting_is_one_bad_record_in_both_modes(best, tmp_path, capsys):
    lines = [json.dumps({"text": texts()[0]}), "[" * 1500, json.dumps({"text": texts()[1]}), '{"a":' * 1500]
    source, out = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    summary = predict_file(best, source, out, on_error="skip", progress=False)
    assert (summary.read, summary.predicted, summary.skipped) == (4, 2, 2)
    assert [e["line"] for e in read_jsonl(tmp_path / "out.errors.jsonl")] == [2, 4]
    assert all("nested deeper than" in e["reason"] for e in read_jsonl(tmp_path / "out.errors.jsonl"))
    assert main(_argv(best, source, tmp_path / "fail.jsonl")) == 2
    assert capsys.readouterr().err.strip() == f"error: {source}:2: JSON nested deeper than 64 levels"


def test_an_unclosed_csv_quote_is_reported_where_it_began_and_the_rows_after_it_are_read(best, tmp_path):
    source = write_lines(
        tmp_path / "in.csv", ["id,text", '1,"opened and never closed', *[f"{i},row {i}" for i in (2, 3, 4, 5)]]
    )
    summary = predict_file(best, source, tmp_path / "out.jsonl", on_error="skip", progress=False)
    assert (summary.read, summary.predicted, summary.skipped) == (5, 4, 1)
    assert [r["id"] for r in read_jsonl(tmp_path / "out.jsonl")] == ["2", "3", "4", "5"]
    [error] = read_jsonl(tmp_path / "out.errors.jsonl")
    assert error["line"] == 2 and "never closed" in error["reason"]


# ---------------------------------------------------------------------------------------------- checks first


def test_a_folder_given_as_input_is_called_a_folder(best, tmp_path, capsys):
    (tmp_path / "data").mkdir()
    assert main(_argv(best, tmp_path / "data", tmp_path / "out.jsonl")) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: {tmp_path / 'data'}: is a folder, not a file; give the path of a file in it"
    )
    with pytest.raises(DataError, match="is a folder"):
        predict_file(best, tmp_path / "data", tmp_path / "o.jsonl")


def test_an_output_under_a_regular_file_is_refused_before_the_model_is_loaded(best, tmp_path, monkeypatch, capsys):
    source = write_lines(tmp_path / "in.txt", texts())

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(loading_module, "load_model", no_model)
    assert main(_argv(best, source, source / "out.jsonl")) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --output {source / 'out.jsonl'}: {source} is a file, not a folder; choose another --output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
