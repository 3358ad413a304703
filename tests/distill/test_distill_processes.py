"""The teacher's labelling split between two processes (torchrun, gloo): together they fill the target cache and
the state caches with exactly the texts one process labels, each text once, each process its share of the words,
with the same targets; the run reports it, and a second launch finds every text cached and labels none."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY, needs_torchrun, tiny_tasks, torchrun_cli
from safetensors import safe_open

from mtl_decoder.cli import main
from mtl_decoder.distill.labelling import item_words
from mtl_decoder.distill.states import SENTENCE_STATES_SUFFIX, STATES_SUFFIX
from mtl_decoder.distill.targets import text_key

pytestmark = pytest.mark.slow

STATES = ["distill.state_weight=1.0", "distill.sentence_state_weight=1.0"]
STEPS = ["training.max_steps=2", "training.eval_every=2"]


def write_config(path: Path, model: dict) -> Path:
    body = copy.deepcopy(TINY) | {"tasks": tiny_tasks()}
    body["model"].update(model)
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


def shards(folder: Path) -> dict[Path, dict[str, torch.Tensor]]:
    """Every shard of a cache folder -> its tensors."""
    out = {}
    for shard in sorted(folder.glob("shard-*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            out[shard] = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    return out


def entries(folder: Path) -> dict[str, torch.Tensor]:
    return {name: t for tensors in shards(folder).values() for name, t in tensors.items()}


@needs_torchrun
def test_two_processes_label_the_transfer_set_once_between_them(tmp_path):
    teacher = write_config(tmp_path / "teacher.yaml", {})
    assert main(["train", "--config", str(teacher), "--output-dir", str(tmp_path / "teacher"), *STEPS]) == 0
    student = write_config(tmp_path / "student.yaml", {"d_model": 16, "expert_hidden": 16})
    args = ["distill", "--teacher", str(tmp_path / "teacher" / "best"), "--config", str(student), *STEPS, *STATES]
    assert main([*args, "--output-dir", str(tmp_path / "one"), f"distill.cache_dir={tmp_path / 'one-cache'}"]) == 0
    one = json.loads((tmp_path / "one" / "distill.json").read_text())

    cache = f"distill.cache_dir={tmp_path / 'two-cache'}"
    done = torchrun_cli(*args, cache, "--output-dir", str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "distill.json").read_text())
    texts = one["targets"]["computed"]
    assert texts > 100 and two["fingerprint"] == one["fingerprint"]
    assert two["targets"]["computed"] == texts and two["targets"]["processes"] == 2
    assert two["targets"]["teacher_forwards"] > 0 and two["targets"]["from_cache"] == 0
    log = done.stdout + done.stderr
    assert re.search(rf"targets of {one['targets']['texts']} texts, {texts} computed in \d+ teacher batches by 2 "
                     "processes", log), log[-2000:]  # fmt: skip

    for suffix in ("", STATES_SUFFIX, SENTENCE_STATES_SUFFIX):
        folder = f"{one['fingerprint']}{suffix}"
        reference, split = entries(tmp_path / "one-cache" / folder), shards(tmp_path / "two-cache" / folder)
        written = [name for tensors in split.values() for name in tensors]
        assert len(reference) > 100 and sorted(written) == sorted(reference)  # every text, and none twice
        pids = {int(re.search(r"-(\d+)\.safetensors$", p.name).group(1)) for p in split}
        assert len(pids) == 2  # each process wrote its share
        for tensors in split.values():  # the same values, whichever process (and batch) computed them: float16
            for name, t in tensors.items():
                assert t.shape == reference[name].shape
                assert torch.allclose(t.float(), reference[name].float(), atol=2e-3, rtol=2e-3), name

    # the shares: every other text, longest first (in words), so the two cost about the same
    ner, sentiment = (Path(task["data"]["train"]).read_text(encoding="utf-8").splitlines() for task in tiny_tasks())
    items = [json.loads(line)["tokens"] for line in ner] + [json.loads(line)["text"] for line in sentiment]
    words = {text_key(item): item_words(item) for item in items}
    by_pid: dict[str, set[str]] = {}
    split_targets = shards(tmp_path / "two-cache" / one["fingerprint"])
    for shard, tensors in split_targets.items():
        by_pid.setdefault(shard.name.rsplit("-", 1)[1], set()).update(name.split("/")[0] for name in tensors)
    a, b = by_pid.values()
    assert not a & b and a | b == set(words) and len(words) == texts
    assert abs(len(a) - len(b)) <= 1
    assert abs(sum(words[k] for k in a) - sum(words[k] for k in b)) <= max(words.values())

    # a second launch finds every text cached: both processes still meet at the barriers and none labels
    again = torchrun_cli(*args, cache, "--output-dir", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr[-3000:]
    counts = json.loads((tmp_path / "again" / "distill.json").read_text())["targets"]
    assert counts["computed"] == 0 and counts["teacher_forwards"] == 0 and counts["from_cache"] == counts["texts"]
    assert "seconds" not in counts and len(shards(tmp_path / "two-cache" / one["fingerprint"])) == len(split_targets)
