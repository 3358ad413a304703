"""A student on a frozen pretrained trunk (issue 35's mid student: the first blocks of a checkpoint, cached, with
native layers on top) distils through the CLI: the trunk reads every transfer text into the student's state cache,
and the saved student predicts the same with its teacher's folder gone."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml
from helpers import TINY, tiny_tasks
from trunk_runs import trained

from mtl_decoder.cli import main
from mtl_decoder.model.pretrained.state_cache import StateCache
from mtl_decoder.prediction import predict_texts
from mtl_decoder.saved import load_model

pytestmark = pytest.mark.slow

TRANSFER = ["Anna Berg flew to Oslo on Monday .", "The film was dull and far too long .", "Kreuzberg beat Lyon 2-1 ."]


def test_a_frozen_trunk_student_reads_its_transfer_texts_and_stands_alone(tmp_path):
    teacher_run = trained(tmp_path / "teacher", "frozen")
    teacher = tmp_path / "teacher-copy"
    shutil.copytree(teacher_run.best, teacher)
    (tmp_path / "news.txt").write_text("\n".join(TRANSFER) + "\n", encoding="utf-8")
    body = copy.deepcopy(TINY) | {"tasks": tiny_tasks()}
    (tmp_path / "student.yaml").write_text(yaml.safe_dump(body), encoding="utf-8")
    run, cache = tmp_path / "student", tmp_path / "student-states"
    argv = ["distill", "--teacher", str(teacher), "--config", str(tmp_path / "student.yaml"),
            "--unlabelled", str(tmp_path / "news.txt"), "--output-dir", str(run),
            f"distill.cache_dir={tmp_path / 'targets'}", "distill.state_weight=1.0",
            f"model.trunk.pretrained={teacher_run.checkpoint}", "model.trunk.mode=frozen", "model.trunk.layers=1",
            f"model.trunk.cache_dir={cache}", "data.word_dropout=0", "training.max_steps=2",
            "training.eval_every=2"]  # fmt: skip
    assert main(argv) == 0

    saved = load_model(run / "best", device="cpu")
    assert saved.model.identity.layers == 1  # the checkpoint's first block only, as the config asked
    folder = saved.model.states.cache.directory
    assert folder.parent == cache
    on_disk = StateCache(folder, write=False)
    for encoded in saved.encoder.encode_batch(TRANSFER):
        assert StateCache.key(encoded.ids) in on_disk, "a transfer text the student never read through its trunk"

    items = [*TRANSFER, ["Anna", "Berg", "lives", "in", "Oslo"]]
    before = list(predict_texts(run / "best", items))
    shutil.rmtree(teacher)
    after = list(predict_texts(run / "best", items))
    assert after == before
    assert set(before[-1]) == {"ner", "sentiment"} and len(before[-1]["ner"]["tags"]) == 5
