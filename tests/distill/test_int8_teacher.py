"""distill.teacher_precision=int8 through the CLI: a tiny frozen-trunk teacher quantised (W8A8 scales stored by
``mtl-decoder quantize``) labels the transfer set in int8, its targets cached under their own fingerprint and equal
to what ``predict --precision int8`` gives for the same texts."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from helpers import FIXTURES, TINY, tiny_tasks
from trunk_runs import trained

from mtl_decoder.cli import main
from mtl_decoder.config import DistillConfig
from mtl_decoder.distill.targets import TargetStore, teacher_fingerprint, text_key
from mtl_decoder.errors import ConfigError
from mtl_decoder.prediction import predict_texts

pytestmark = pytest.mark.slow


def test_an_int8_teacher_labels_as_predict_int8_does(tmp_path):
    teacher = trained(tmp_path / "teacher", "frozen").best
    quantize = ["quantize", "--model", str(teacher), "--calibration-texts", "8", "--min-tags", "0", "--min-labels", "0"]
    assert main(quantize) == 0
    body = copy.deepcopy(TINY) | {"tasks": tiny_tasks()}
    (tmp_path / "student.yaml").write_text(yaml.safe_dump(body), encoding="utf-8")
    cache, run = tmp_path / "targets", tmp_path / "student"
    argv = ["distill", "--teacher", str(teacher), "--config", str(tmp_path / "student.yaml"), "--output-dir", str(run),
            f"distill.cache_dir={cache}", "distill.teacher_precision=int8", "training.max_steps=2",
            "training.eval_every=2"]  # fmt: skip
    assert main(argv) == 0
    fingerprint = teacher_fingerprint(teacher, "int8")
    assert fingerprint != teacher_fingerprint(teacher) and [p.name for p in cache.iterdir()] == [fingerprint]
    record = json.loads((run / "distill.json").read_text())
    assert record["precision"] == "int8" and record["fingerprint"] == fingerprint
    assert f"(fingerprint `{fingerprint}`), labelling in int8" in (run / "best" / "README.md").read_text()

    texts = [json.loads(line)["text"] for line in (FIXTURES / "sentiment_train.jsonl").read_text().splitlines()[:6]]
    store = TargetStore(cache / fingerprint)
    store.load([text_key(t) for t in texts])
    for text, predicted in zip(texts, predict_texts(teacher, texts, precision="int8"), strict=True):
        target = store.get(text_key(text))["sentiment"].float().tolist()
        probs = predicted["sentiment"]["probs"]
        assert target == pytest.approx([probs["negative"], probs["positive"]], abs=2e-3)


def test_an_unknown_teacher_precision_names_the_key():
    with pytest.raises(ConfigError, match="teacher_precision"):
        DistillConfig(teacher_precision="bf16")
