"""Distillation runs over the tiny fixtures with a teacher of a few steps: a student's label ids read in its own
order, damaged target shards labelled again, and the runs that cannot go on (a full disk, a read-only cache, a
killed labelling) ending in one line that leaves a rerun possible."""

from __future__ import annotations

import copy
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import FIXTURES, TINY, tiny_config, tiny_tasks

import mtl_decoder.distill.targets as targets_module
from mtl_decoder.cli import main
from mtl_decoder.distill.run import DistillTrainer, check_teacher
from mtl_decoder.distill.targets import TargetStore, text_key
from mtl_decoder.training import train

STEPS = ["training.max_steps=2", "training.eval_every=2"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("teacher") / "run"
    train(tiny_config(run, ["training.max_steps=4", "training.eval_every=4"]))
    return run / "best"


@pytest.fixture
def student(tmp_path) -> Path:
    body = copy.deepcopy(TINY) | {"tasks": tiny_tasks()}
    path = tmp_path / "student.yaml"
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


@pytest.fixture
def teacher_batches(monkeypatch) -> list[int]:
    calls = []
    real = targets_module.TeacherLabeller._run

    def counting(self, encoded):
        calls.append(len(encoded))
        return real(self, encoded)

    monkeypatch.setattr(targets_module.TeacherLabeller, "_run", counting)
    return calls


def args(teacher: Path, student: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return ["distill", "--teacher", str(teacher), "--config", str(student), "--output-dir", str(out),
            f"distill.cache_dir={cache}", *STEPS, *extra]  # fmt: skip


def one_line_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning: ")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_students_integer_label_ids_are_read_in_its_own_order(teacher, tmp_path):
    """The student lists sentiment's labels in the reverse of the teacher's order and its files hold ids: each
    gold label stays what the file means, and each target column is the teacher's probability of that label."""
    ids = {}
    for split in ("train", "validation", "test"):
        rows = [json.loads(line) for line in (FIXTURES / f"sentiment_{split}.jsonl").open(encoding="utf-8")]
        ids[split] = [r["label"] for r in rows]
        lines = [json.dumps({"text": r["text"], "label": ["positive", "negative"].index(r["label"])}) for r in rows]
        (tmp_path / f"sentiment_{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tasks = tiny_tasks()
    tasks[1] |= {"labels": ["positive", "negative"]}
    tasks[1]["data"] = {split: str(tmp_path / f"sentiment_{split}.jsonl") for split in ids}
    config = tiny_config(tmp_path / "run", [*STEPS, f"distill.cache_dir={tmp_path / 'cache'}"], tasks)
    assert json.loads((teacher / "labels.json").read_text())["sentiment"] == ["negative", "positive"]

    trainer = DistillTrainer(check_teacher(config, teacher))
    try:
        trainer.setup()
        data = trainer.data
    finally:
        trainer.cleanup()
    labels = data.label_sets["sentiment"]
    assert labels == ["positive", "negative"]
    sizes = data.dataset.source_sizes
    first = next(i for i, s in enumerate(data.train_sources) if s.tasks[0].name == "sentiment")
    start = sum(sizes[:first])
    examples = data.dataset.examples[start : start + sizes[first]]
    assert [labels[ex.labels["sentiment"]] for ex in examples] == ids["train"]

    store = TargetStore(tmp_path / "cache" / trainer.cfg.distill.teacher_hash)
    texts = [json.loads(line)["text"] for line in (FIXTURES / "sentiment_train.jsonl").open(encoding="utf-8")]
    teacher_probs = [store.get(text_key(text))["sentiment"] for text in texts]  # the teacher's order
    assert max(abs(p[0] - p[1]).item() for p in teacher_probs) > 1e-3  # a swap would show
    for ex, theirs in zip(examples, teacher_probs, strict=True):
        assert torch.equal(ex.targets["sentiment"], theirs.flip(0))


def test_damaged_target_shards_are_labelled_again(teacher, student, tmp_path, capsys, teacher_batches):
    cache = tmp_path / "cache"
    assert main(args(teacher, student, tmp_path / "first", cache)) == 0
    labelled = len(teacher_batches)
    shards = list(cache.glob("*/shard-*.safetensors"))
    for shard in shards:
        shard.write_bytes(shard.read_bytes()[:-9])  # truncated in place
    capsys.readouterr()
    teacher_batches.clear()
    assert main(args(teacher, student, tmp_path / "second", cache)) == 0
    assert len(teacher_batches) == labelled  # every text labelled again, none read from a damaged shard
    err = capsys.readouterr().err
    assert all(f"warning: {shard}: damaged cache shard" in err for shard in shards)
    counts = json.loads((tmp_path / "second" / "distill.json").read_text())["targets"]
    assert counts["from_cache"] == 0 and counts["computed"] > 0


def test_a_full_disk_while_caching_is_one_line_and_leaves_no_run(teacher, student, tmp_path, capsys, monkeypatch):
    def full(tensors, path, metadata=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full)  # under files.atomic_write_safetensors
    out, cache = tmp_path / "run", tmp_path / "cache"
    assert main(args(teacher, student, out, cache)) == 2
    line = one_line_error(capsys)
    assert f"{cache}/" in line and "No space left on device" in line and "removed" in line
    assert not out.exists()  # failed before its first step: nothing of it kept, so a plain rerun can start
    monkeypatch.undo()
    assert main(args(teacher, student, out, cache)) == 0


def test_a_read_only_cache_is_refused_before_the_teacher_runs(
    teacher, student, tmp_path, capsys, monkeypatch, teacher_batches
):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == cache else real_access(p, mode, **kw))
    try:
        assert main(args(teacher, student, tmp_path / "run", cache / "sub")) == 2
    finally:
        cache.chmod(0o755)
    line = one_line_error(capsys)
    assert "distill.cache_dir" in line and "not writable" in line
    assert teacher_batches == [] and not (tmp_path / "run").exists()


def test_after_a_kill_during_labelling_the_messages_say_overwrite(teacher, student, tmp_path, capsys):
    out, cache = tmp_path / "run", tmp_path / "cache"
    killed = (
        "import os, signal, sys\n"
        "import mtl_decoder.distill.targets as t\n"
        "from mtl_decoder.cli import main\n"
        "t.TeacherLabeller.label = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # the repository
    done = subprocess.run([sys.executable, "-c", killed, *args(teacher, student, out, cache)], env=env, check=False)
    assert done.returncode == -signal.SIGKILL and (out / "config.yaml").is_file()
    assert main(args(teacher, student, out, cache)) == 2
    assert "--overwrite" in one_line_error(capsys)
    assert main(["distill", "--resume", *args(teacher, student, out, cache)[1:]]) == 2
    assert "--overwrite" in one_line_error(capsys)
    assert main(["distill", "--overwrite", *args(teacher, student, out, cache)[1:]]) == 0
