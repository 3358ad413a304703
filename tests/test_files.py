"""mtl_decoder.files: one temporary-name scheme, stale temporaries of dead processes only, SIGTERM that unwinds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from mtl_decoder.errors import UserError
from mtl_decoder.files import (
    AtomicFile,
    Terminated,
    check_writable_parent,
    stale_temporaries,
    temporary_sibling,
    terminate_unwinds,
)


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporary_names_carry_the_file_name_and_this_process(tmp_path):
    tmp = temporary_sibling(tmp_path / "out.jsonl")
    assert tmp.parent == tmp_path
    assert tmp.name.startswith(f".out.jsonl.mtl-tmp-{os.getpid()}-")


def test_stale_temporaries_are_those_of_dead_processes_for_that_file_only(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    names = [
        f".out.jsonl.mtl-tmp-{dead}-0a1b2c3d",  # a killed run's: stale
        f".out.jsonl.mtl-tmp-{alive}-0a1b2c3d",  # a running process's: not stale
        f".out.jsonl.mtl-tmp-{os.getpid()}-0a1b2c3d",  # this process's: not stale
        f".other.jsonl.mtl-tmp-{dead}-0a1b2c3d",  # another file's
        f".out.jsonl.tmp-{dead}",  # not our scheme
        "out.jsonl",
    ]
    for name in names:
        (tmp_path / name).write_text("x", encoding="utf-8")
    assert stale_temporaries(tmp_path / "out.jsonl") == [tmp_path / names[0]]
    assert stale_temporaries(tmp_path / "missing" / "out.jsonl") == []


def test_check_writable_parent_names_the_file_in_the_way(tmp_path):
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match=r"--output .*a\.txt/b/out\.jsonl: .*a\.txt is a file, not a folder"):
        check_writable_parent(tmp_path / "a.txt" / "b" / "out.jsonl", "--output")
    check_writable_parent(tmp_path / "new" / "deeper" / "out.jsonl", "--output")  # creatable: no error


def test_sigterm_unwinds_with_blocks_and_the_previous_handler_comes_back(tmp_path):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(Terminated), terminate_unwinds(), AtomicFile(tmp_path / "out.jsonl") as out:
            out.write_line("half")
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes: it raises here, not later
                pass
            pytest.fail("SIGTERM did not raise")
        assert list(tmp_path.iterdir()) == []  # the temporary was discarded, nothing committed
        os.kill(os.getpid(), signal.SIGTERM)  # after the block: the caller's handler again
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert Terminated.exit_code == 143


def test_sigterm_in_a_deferred_block_waits_for_its_end(tmp_path):
    done = []
    with pytest.raises(Terminated), terminate_unwinds() as unwinder, unwinder.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("renamed")  # not interrupted
    assert done == ["renamed"]


def test_outside_the_main_thread_nothing_changes():
    before = signal.getsignal(signal.SIGTERM)
    errors = []

    def work():
        try:
            with terminate_unwinds():
                pass
        except Exception as err:  # signal.signal would raise ValueError in a thread
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == [] and signal.getsignal(signal.SIGTERM) == before
