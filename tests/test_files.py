"""mtl_decoder.files: one temporary-name scheme, stale temporaries of dead processes only, SIGTERM that unwinds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from mtl_decoder.errors import UserError
from mtl_decoder.files import AtomicFile, check_writable_parent, stale_temporaries, temporary_sibling
from mtl_decoder.termination import Terminated, shielded, terminate_unwinds


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


def test_a_sigterm_during_clean_up_waits_until_every_temporary_is_gone(tmp_path):
    """A launcher's SIGTERM can land while an error is being unwound: the clean-up of the first file must not be
    cut short, nor the second file's skipped (the errors file's temporary was once left behind the output's)."""
    from mtl_decoder.prediction.writer import RunWriter

    class SignalsOnClose:  # the output's file: SIGTERM arrives as its clean-up begins
        closed = False

        def close(self):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # unshielded, the handler would raise here
                pass

    with pytest.raises(Terminated), terminate_unwinds():
        writer = RunWriter(tmp_path / "pred.jsonl", tmp_path / "pred.errors.jsonl", skip=True, part=False)
        writer.out.write_line("x")
        writer.bad.write_line("y")
        assert len(list(tmp_path.glob(".*mtl-tmp-*"))) == 2
        writer.out.file.close()
        writer.out.file = SignalsOnClose()
        writer.discard()
    assert [p.name for p in tmp_path.iterdir() if "mtl-tmp" in p.name] == []


def test_shielded_outside_terminate_unwinds_changes_nothing():
    done = []
    with shielded():
        done.append("cleaned")
    assert done == ["cleaned"]


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


# ------------------------------------------------------------------------------------------------ issue 27


def test_a_temporary_name_of_a_long_name_fits_name_max_and_is_still_found_stale(tmp_path):
    long = tmp_path / ("x" * 240 + ".jsonl")  # a legal name; with the suffix it would pass 255 bytes
    tmp = temporary_sibling(long)
    assert len(tmp.name.encode()) <= 255 and tmp.name.startswith(".xxxx")
    tmp.write_text("x", encoding="utf-8")  # the file system takes it
    other = temporary_sibling(tmp_path / ("x" * 240 + ".jsonm"))  # same start, another file: another name
    assert other.name.split(".mtl-tmp-")[0] != tmp.name.split(".mtl-tmp-")[0]
    dead = tmp.with_name(tmp.name.replace(f"-{os.getpid()}-", f"-{dead_pid()}-"))
    tmp.rename(dead)
    assert stale_temporaries(long) == [dead]


def test_discard_removes_the_temporary_even_when_closing_fails(tmp_path):
    out = AtomicFile(tmp_path / "out.jsonl")
    out.write_line("x")

    class FullDisk:
        closed = False

        def close(self):  # a full disk fails the final flush again
            raise OSError(28, "No space left on device")

    out.file.close()
    out.file = FullDisk()
    out.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_lock_held_by_another_process_names_its_pid_and_goes_with_it(tmp_path):
    from mtl_decoder.locks import PathLock, lock_path

    target = tmp_path / "out.jsonl"
    code = f"from mtl_decoder.locks import PathLock; lock = PathLock({str(target)!r}); print('held', flush=1); input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"by another mtl-decoder process \(PID {holder.pid}\)"):
            PathLock(target)
    finally:
        holder.kill()  # killed, not let go: the kernel drops its flock
        holder.wait()
    with PathLock(target):  # free again, although the killed holder left its lock file
        assert lock_path(target).read_text().strip() == str(os.getpid())
    assert not lock_path(target).exists()


def test_outputs_that_must_not_be_replaced_are_named(tmp_path):
    from mtl_decoder.files import FILE, NEW, STREAM, output_kind

    (tmp_path / "f").write_text("x", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    os.mkfifo(tmp_path / "fifo")
    assert output_kind(tmp_path / "new") == NEW and output_kind(tmp_path / "f") == FILE
    assert output_kind(tmp_path / "fifo") == STREAM and output_kind("/dev/null") == STREAM
    for name, reason in [("link", "symbolic link"), ("dangling", "missing path"), ("loop1", "link loop")]:
        with pytest.raises(UserError, match=reason):
            output_kind(tmp_path / name)
    with pytest.raises(UserError, match="folder"):
        output_kind(tmp_path)
    with pytest.raises(UserError, match="NUL"):
        check_writable_parent(tmp_path / "a\x00b", "--output")


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_a_safetensors_file_gets_the_permissions_of_any_new_file(tmp_path, mask):
    """Issue 38 case 15: safetensors writes 0600, so a shared model folder's weights could not be read."""
    import torch
    from safetensors.torch import load_file

    from mtl_decoder.files import atomic_write_safetensors

    previous = os.umask(mask)
    try:
        path = atomic_write_safetensors(tmp_path / "w.safetensors", {"a": torch.arange(3.0)}, {"k": "v"})
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    assert load_file(str(path))["a"].tolist() == [0.0, 1.0, 2.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "w.safetensors"]


def test_a_safetensors_write_that_fails_is_one_line_naming_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch
    import torch
    from safetensors import SafetensorError

    from mtl_decoder.files import atomic_write_safetensors

    def full_disk(tensors, filename, metadata=None):
        open(filename, "wb").close()
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, message: No space left on device })")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    target = tmp_path / "w.safetensors"
    with pytest.raises(UserError, match=f"^{target}: cannot write \\(Error while serializing") as caught:
        atomic_write_safetensors(target, {"a": torch.zeros(1)})
    assert "\n" not in str(caught.value) and list(tmp_path.iterdir()) == []


def test_a_checkpoint_replaced_by_a_failing_rename_stays_in_place(tmp_path, monkeypatch):
    """Issue 34: the checkpoint replace removed the old folder before renaming the new one in."""
    from accelerate import Accelerator

    from mtl_decoder.training import checkpoints

    root = tmp_path / "checkpoints"
    final = root / "step-0000002"
    final.mkdir(parents=True)
    (final / "trainer_state.json").write_text("{}")
    (final / "old-marker").write_text("the old checkpoint")
    replace = os.replace

    def failing(src, dst):
        if str(dst) == str(final) and not os.path.exists(os.path.join(src, "old-marker")):
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(UserError, match="cannot write the checkpoint"):
        checkpoints.save_checkpoint(Accelerator(cpu=True), root, 2, {"step": 2}, keep=3)
    assert (final / "old-marker").read_text() == "the old checkpoint"
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002"]
