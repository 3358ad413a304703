"""The teacher's word states as a second distillation target (``distill.state_weight``, distill/states.py).

The loss against a float64 loop; the projection against numpy's PCA; through the CLI, the states the teacher stored
against its head's input read by a forward hook, the student pulled towards them (closer than the same student
without the loss), a saved student with exactly a plain student's weights, a second run that runs no teacher
batch, and the refusals in one line. The same for the sentence states (``distill.sentence_state_weight``): the
stored states against the classification head's pooled input, the pull towards them, the refusal.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import FIXTURES, TINY, tiny_tasks
from safetensors.torch import load_file

from mtl_decoder.cli import main
from mtl_decoder.config import load_config
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.distill.states import (
    SENTENCE_STATES_SUFFIX,
    STATES_SUFFIX,
    check_states,
    fit_projection,
    state_loss,
    state_part,
)
from mtl_decoder.distill.targets import TargetStore, text_key
from mtl_decoder.errors import ConfigError
from mtl_decoder.saved import load_model

STEPS = ["training.max_steps=3", "training.eval_every=3"]


def test_state_loss_is_a_float64_loop():
    gen = torch.Generator().manual_seed(0)
    hidden, teacher = torch.randn(3, 5, 4, generator=gen), torch.randn(3, 6, 4, generator=gen)
    words = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    has = torch.tensor([[1, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    per_text = []
    for n in range(3):
        both = [w for w in range(5) if words[n, w] and has[n, w]]
        if both:
            per_text.append(np.mean([np.mean((hidden[n, w].double() - teacher[n, w].double()).numpy() ** 2)
                                     for w in both]))  # fmt: skip
    got = state_loss(hidden, words, teacher, has)
    assert got is not None and abs(float(got) - np.mean(per_text)) < 1e-6
    assert state_loss(hidden, words, teacher, torch.zeros_like(has)) is None


def test_the_projection_is_numpy_pca_at_unit_root_mean_square():
    gen = torch.Generator().manual_seed(1)
    states = [torch.randn(n, 12, generator=gen) @ torch.randn(12, 12, generator=gen) for n in (7, 5, 9)]
    projection = fit_projection(states, 4)
    table = torch.cat(states).double().numpy()
    centred = table - table.mean(axis=0)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    directions = vt[:4] * np.sign(vt[np.arange(4), np.abs(vt[:4]).argmax(axis=1)])[:, None]
    want = centred @ directions.T
    want /= np.sqrt(np.mean(want**2))
    got = torch.cat([projection(s) for s in states]).double().numpy()
    assert got.shape == (21, 4) and np.allclose(got, want, atol=2e-3)  # stored in float16
    assert abs(projection.explained - (singular[:4] ** 2).sum() / (singular**2).sum()) < 1e-9


def write_config(path: Path, model: dict, tasks: list | None = None) -> Path:
    body = copy.deepcopy(TINY) | {"tasks": tasks or tiny_tasks()}
    body["model"].update(model)
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny teacher (d_model 32) trained a few steps, and a student config (d_model 16)."""
    root = tmp_path_factory.mktemp("states")
    config = write_config(root / "teacher.yaml", {})
    assert main(["train", "--config", str(config), "--output-dir", str(root / "teacher"),
                 "training.max_steps=10", "training.eval_every=10"]) == 0  # fmt: skip
    write_config(root / "student.yaml", {"d_model": 16, "expert_hidden": 16})
    return root


def distill(work: Path, out: Path, cache: Path, *extra: str) -> dict:
    args = ["distill", "--teacher", str(work / "teacher" / "best"), "--config", str(work / "student.yaml"),
            "--output-dir", str(out), f"distill.cache_dir={cache}", *STEPS, *extra]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "distill.json").read_text())


def head_inputs(model_dir: Path, sentences: list[list[str] | str], task: str = "ner") -> list[torch.Tensor]:
    """Each sentence's (W, C) states at its words' read positions, as the model's head for ``task`` receives them
    (a forward hook on the head)."""
    saved = load_model(model_dir, device="cpu")
    seen = []
    hook = saved.model.heads[task].register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    collate = collator_for(saved.config.model, saved.encoder.pad_id, {})
    encoded = saved.encoder.encode_batch(sentences)
    batch = collate([EncodedExample.unlabelled(e) for e in encoded])
    with torch.inference_mode():
        out = saved.model(**batch, tasks=[task])
    hook.remove()
    (hidden,), rows = seen, out.examples[task].tolist()
    result = [None] * len(sentences)
    for i, r in enumerate(rows):
        reads = batch["word_read"][r]
        result[r] = hidden[i, reads[reads >= 0]]
    return result


def sentences(n: int = 6) -> list[list[str]]:
    lines = (FIXTURES / "ner_train.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["tokens"] for line in lines]


def transfer_set() -> list[list[str] | str]:
    """Every text the run's teacher labels, in the run's order: the tagging task's sentences, then the
    classification task's texts (the teacher tags those too)."""
    lines = (FIXTURES / "sentiment_train.jsonl").read_text(encoding="utf-8").splitlines()
    return sentences(60) + [json.loads(line)["text"] for line in lines]


def test_the_teacher_stores_its_heads_word_states_and_the_student_learns_them(work, tmp_path):
    cache = tmp_path / "cache"
    record = distill(work, tmp_path / "student", cache, "distill.state_weight=1.0")
    assert record["states"]["teacher_width"] == 32 and record["states"]["width"] == 16
    assert 0 < record["states"]["explained_variance"] < 1 and record["states"]["weight"] == 1.0

    store = TargetStore(cache / f"{record['fingerprint']}{STATES_SUFFIX}", check=check_states)
    texts = sentences()
    store.load([text_key(t) for t in texts])
    for text, want in zip(texts, head_inputs(work / "teacher" / "best", texts), strict=True):
        got = store.get(text_key(text))[state_part("ner")]
        assert got.dtype == torch.float16 and got.shape == want.shape and want.shape[1] == 32  # words kept: max_length
        assert torch.allclose(got.float(), want, atol=2e-3, rtol=2e-3)

    plain = tmp_path / "plain"
    again = distill(work, plain, cache)  # the targets from the cache; no states asked
    assert again["targets"]["teacher_forwards"] == 0 and "states" not in again
    a, b = (
        load_file(tmp_path / "student" / "best" / "model.safetensors"),
        load_file(plain / "best" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)  # nothing of the loss is saved
    assert "the teacher's word states" in (tmp_path / "student" / "best" / "README.md").read_text()
    rerun = distill(work, tmp_path / "rerun", cache, "distill.state_weight=1.0")
    assert rerun["targets"]["teacher_forwards"] == 0 and rerun["targets"]["from_cache"] == rerun["targets"]["texts"]


def test_the_loss_pulls_the_students_states_towards_the_teachers(work, tmp_path):
    """Trained 30 steps with and without the loss (same seed): the student with it ends closer to the projected
    teacher states of the training sentences."""
    cache, steps = tmp_path / "cache", ["training.max_steps=30", "training.eval_every=30"]
    record = distill(work, tmp_path / "with", cache, "distill.state_weight=5.0", *steps)
    distill(work, tmp_path / "without", cache, *steps)
    texts = transfer_set()
    teacher = head_inputs(work / "teacher" / "best", texts)
    projection = fit_projection(teacher, 16)  # as the run fitted it (there on the float16-stored states)
    assert abs(projection.explained - record["states"]["explained_variance"]) < 1e-3

    def distance(run: str) -> float:
        student = head_inputs(tmp_path / run / "best", texts)
        return float(
            np.mean([(s - projection(t).float()).square().mean() for s, t in zip(student, teacher, strict=True)])
        )

    assert distance("with") < 0.8 * distance("without")


def test_refusals_are_one_line_before_any_work(work, tmp_path, capsys):
    with pytest.raises(ConfigError, match="state_weight"):
        load_config(work / "student.yaml", ["distill.state_weight=-1"])
    only_sentiment = [t for t in tiny_tasks() if t["name"] == "sentiment"]
    classify = write_config(tmp_path / "classify.yaml", {"d_model": 16}, only_sentiment)
    wide = write_config(tmp_path / "wide.yaml", {"d_model": 48, "n_heads": 2})
    for config, out, says in ((classify, "a", "has no tagging task"),
                              (wide, "b", "narrower than the student's model.d_model 48")):  # fmt: skip
        cache = f"distill.cache_dir={tmp_path / 'cache'}"
        args = ["distill", "--teacher", str(work / "teacher" / "best"), "--config", str(config), "--output-dir",
                str(tmp_path / out), cache, "distill.state_weight=1", *STEPS]  # fmt: skip
        assert main(args) == 2
        err = capsys.readouterr().err
        assert says in err and "distill.state_weight" in err and not (tmp_path / out / "best").exists()


# --- sentence states (distill.sentence_state_weight): the classification heads' pooled inputs, per text


def pooled_inputs(model_dir: Path, texts: list[str], task: str = "sentiment") -> torch.Tensor:
    """(n, C) each text's pooled state as the model's classification head receives it (a forward hook)."""
    saved = load_model(model_dir, device="cpu")
    seen = []
    hook = saved.model.heads[task].register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    collate = collator_for(saved.config.model, saved.encoder.pad_id, {})
    batch = collate([EncodedExample.unlabelled(e) for e in saved.encoder.encode_batch(texts)])
    with torch.inference_mode():
        out = saved.model(**batch, tasks=[task])
    hook.remove()
    (hidden,) = seen
    return hidden[torch.argsort(out.examples[task])]  # in the texts' order


def reviews(n: int | None = None) -> list[str]:
    lines = (FIXTURES / "sentiment_train.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["text"] for line in lines]


def test_the_teacher_stores_its_pooled_sentence_states_apart(work, tmp_path):
    cache = tmp_path / "cache"
    record = distill(work, tmp_path / "student", cache, "distill.sentence_state_weight=1.0")
    assert "states" not in record and record["sentence_states"]["teacher_width"] == 32
    assert record["sentence_states"]["width"] == 16 and 0 < record["sentence_states"]["explained_variance"] < 1
    store = TargetStore(cache / f"{record['fingerprint']}{SENTENCE_STATES_SUFFIX}", check=check_states)
    texts = reviews(8)
    store.load([text_key(t) for t in texts])
    want = pooled_inputs(work / "teacher" / "best", texts)
    for text, row in zip(texts, want, strict=True):
        entry = store.get(text_key(text))
        assert set(entry) == {state_part("sentiment")}  # no word state in the sentence store
        got = entry[state_part("sentiment")]
        assert got.dtype == torch.float16 and got.shape == (1, 32)
        assert torch.allclose(got[0].float(), row, atol=2e-3, rtol=2e-3)
    assert not (cache / f"{record['fingerprint']}{STATES_SUFFIX}").exists()  # word states were not asked for
    card = (tmp_path / "student" / "best" / "README.md").read_text()
    assert "sentence states (its classification heads' pooled inputs, 32 wide)" in card
    # both kinds at once: the teacher runs again for the missing word states; the sentence states' projection is
    # fitted on the same cached states
    both = distill(work, tmp_path / "both", cache, "distill.sentence_state_weight=1.0", "distill.state_weight=1.0")
    assert both["targets"]["computed"] == both["targets"]["texts"] - both["targets"]["repeated"]
    assert both["sentence_states"] == record["sentence_states"] and both["states"]["width"] == 16


def test_the_sentence_state_loss_pulls_the_students_pooled_states_towards_the_teachers(work, tmp_path):
    cache, steps = tmp_path / "cache", ["training.max_steps=30", "training.eval_every=30"]
    record = distill(work, tmp_path / "with", cache, "distill.sentence_state_weight=5.0", *steps)
    distill(work, tmp_path / "without", cache, *steps)
    texts = transfer_set()
    teacher = pooled_inputs(work / "teacher" / "best", texts)
    projection = fit_projection([teacher], 16)  # as the run fitted it, on the same texts' float16-stored states
    assert abs(projection.explained - record["sentence_states"]["explained_variance"]) < 1e-3
    target = projection(teacher).float()

    def distance(run: str) -> float:
        return float((pooled_inputs(tmp_path / run / "best", texts) - target).square().mean())

    assert distance("with") < 0.8 * distance("without")


def test_sentence_states_are_refused_without_a_classification_task(work, tmp_path, capsys):
    with pytest.raises(ConfigError, match="sentence_state_weight"):
        load_config(work / "student.yaml", ["distill.sentence_state_weight=-0.5"])
    only_ner = write_config(tmp_path / "ner.yaml", {"d_model": 16}, [t for t in tiny_tasks() if t["name"] == "ner"])
    args = ["distill", "--teacher", str(work / "teacher" / "best"), "--config", str(only_ner), "--output-dir",
            str(tmp_path / "out"), f"distill.cache_dir={tmp_path / 'cache'}", "distill.sentence_state_weight=1",
            *STEPS]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "distill.sentence_state_weight" in err and "has no classification task" in err
    assert not (tmp_path / "out" / "best").exists()
