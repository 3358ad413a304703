"""A student that inherits its teacher's lexicon (``model.lexicon``, distill/lexicon.py).

Through the CLI: a tiny native teacher distilled into a tiny student with ``model.lexicon.source=
teacher_embeddings`` starts (and, held for the whole run, ends) with the teacher's table projected by PCA as numpy
computes it in float64 here, reads with the teacher's tokenizer, and predicts the same with the teacher's folder
deleted. With ``projection: learned`` the saved table is a trained linear map of the teacher's whole rows
(least squares, here) folded into one lookup table. ``teacher_states``: a row is the teacher's state of that token
run alone, computed here by a float64 loop over the teacher's weights. A pretrained (Llama) teacher's table and
states against transformers' own. The pairs that cannot work are one-line errors naming the key, before any work.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import TINY, tiny_tasks
from safetensors.torch import load_file

from mtl_decoder.cli import main
from mtl_decoder.distill.lexicon import LEXICON_FILE, LEXICON_TABLE, resolve_lexicon, teacher_embeddings, teacher_states
from mtl_decoder.saved import read_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FROZEN_TEACHER = ROOT / "tests" / "fixtures" / "trunk_folders" / "frozen"
"""A saved model over a frozen 2-block Llama trunk of width 32 (model.trunk.save=full: trunk/ holds its weights)."""
STEPS = ["training.max_steps=3", "training.eval_every=3"]
TEXTS = ["EU rejects German call to boycott British lamb .", "A gripping , funny film .", "Peter went home"]


def write_config(path: Path, model: dict) -> Path:
    body = copy.deepcopy(TINY) | {"tasks": tiny_tasks()}
    body["model"].update(model)
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A tiny native teacher trained a few steps, and a student config.

    The teacher: hard sharing, d_model 32, 2 layers; the student: d_model 24."""
    root = tmp_path_factory.mktemp("lexicon")
    config = write_config(root / "teacher.yaml", {"ffn": "mlp", "mlp_hidden": 32})
    assert main(["train", "--config", str(config), "--output-dir", str(root / "teacher"),
                 "training.max_steps=8", "training.eval_every=8"]) == 0  # fmt: skip
    write_config(root / "student.yaml", {"d_model": 24, "expert_hidden": 16})
    return root


def distill_args(teacher: Path, config: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return ["distill", "--teacher", str(teacher), "--config", str(config), "--output-dir", str(out),
            f"distill.cache_dir={cache}", *STEPS, *extra]  # fmt: skip


def numpy_pca(table: np.ndarray, width: int, rms: float) -> np.ndarray:
    """The rows on their top ``width`` principal directions (centred), each direction's largest entry positive,
    scaled to root mean square ``rms``."""
    centred = table - table.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    directions = vt[:width]
    directions = directions * np.sign(directions[np.arange(width), np.abs(directions).argmax(axis=1)])[:, None]
    projected = centred @ directions.T
    return projected * (rms / np.sqrt(np.mean(projected**2)))


def predict(model: Path, source: Path, out: Path) -> list[dict]:
    assert main(["predict", "--model", str(model), "--input", str(source), "--output", str(out), "--force"]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_a_student_inherits_the_teachers_table_and_predicts_without_the_teacher(work, tmp_path):
    teacher = tmp_path / "teacher"  # a copy, deleted below
    shutil.copytree(work / "teacher" / "best", teacher)
    run = tmp_path / "student"
    args = distill_args(teacher, work / "student.yaml", run, tmp_path / "cache",
                        "model.lexicon.source=teacher_embeddings", "model.lexicon.freeze_steps=1000")  # fmt: skip
    assert main(args) == 0

    want = numpy_pca(load_file(teacher / "model.safetensors")["embed.weight"].double().numpy(), 24, 0.02)
    started = load_file(run / LEXICON_TABLE)["table"].numpy()
    saved = load_file(run / "best" / "model.safetensors")["embed.weight"].numpy()
    assert started.shape == want.shape and np.allclose(started, want, atol=1e-5, rtol=0)
    assert np.array_equal(saved, started)  # held for longer than the run: not one bit moved

    student_tok = json.loads((run / "best" / "tokenizer.json").read_text())
    assert student_tok["model"]["vocab"] == json.loads((teacher / "tokenizer.json").read_text())["model"]["vocab"]
    saved_cfg = read_config(run / "best" / "config.yaml")
    assert saved_cfg.tokenizer.kind == "pretrained" and not saved_cfg.model.words_as_text
    record = json.loads((run / LEXICON_FILE).read_text())
    fingerprint = json.loads((run / "distill.json").read_text())["fingerprint"]
    assert record["teacher_fingerprint"] == fingerprint and record["projection"] == "pca"
    assert record["rows"] == saved.shape[0] and 0 < record["explained_variance"] < 1
    card = (run / "best" / "README.md").read_text()
    assert "lexicon (teacher_embeddings)" in card and record["table_sha256"] in card

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    before = predict(run / "best", source, tmp_path / "before.jsonl")
    shutil.rmtree(teacher)
    assert predict(run / "best", source, tmp_path / "after.jsonl") == before


def unbroken_and_resumed(work: Path, tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    """A 4-step student run unbroken, and again killed after step 2's checkpoint and resumed: each one's step-4
    checkpoint weights."""
    teacher = work / "teacher" / "best"
    extra = ("model.lexicon.source=teacher_embeddings", *extra, "training.max_steps=4", "training.eval_every=2",
             "training.keep_checkpoints=2")  # fmt: skip
    runs = {name: distill_args(teacher, work / "student.yaml", tmp_path / name, tmp_path / "cache", *extra)
            for name in ("unbroken", "killed")}  # fmt: skip
    for args in runs.values():
        assert main(args) == 0
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "step-0000004")
    assert main(["distill", "--resume", *runs["killed"][1:]]) == 0
    last = Path("checkpoints") / "step-0000004" / "model.safetensors"
    return load_file(tmp_path / "unbroken" / last), load_file(tmp_path / "killed" / last)


def test_a_killed_run_resumes_to_the_unbroken_runs_weights(work, tmp_path):
    """Held for 3 of 4 steps, killed after step 2's checkpoint: the resumed run (its table from the checkpoint, the
    held group in its optimizer state) ends with the unbroken run's weights, the table moved only at step 4."""
    a, b = unbroken_and_resumed(work, tmp_path, "model.lexicon.freeze_steps=3")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    middle = load_file(tmp_path / "unbroken" / "checkpoints" / "step-0000002" / "model.safetensors")
    started = load_file(tmp_path / "unbroken" / LEXICON_TABLE)["table"]
    assert torch.equal(middle["embed.weight"], started) and not torch.equal(a["embed.weight"], started)
    assert "lexicon (teacher_embeddings)" in (tmp_path / "killed" / "best" / "README.md").read_text()


def rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x**2) + 1e-6) * weight


def state_by_hand(weights: dict, token: int, layer: int, d: int) -> np.ndarray:
    """A hard-sharing native model's state of one token alone after block ``layer``, in float64.

    Through its final norm; attention over one key is its value (softmax of one score; RoPE rotates queries and
    keys only)."""
    w = {k: v.double().numpy() for k, v in weights.items()}
    h = w["embed.weight"][token]
    for i in range(layer):
        p = f"layers.{i}."
        v = w[p + "attn.qkv.weight"][2 * d :] @ rms_norm(h, w[p + "attn_norm.weight"])
        h = h + w[p + "attn.out.weight"] @ v
        gate, up = np.split(w[p + "ffn.up.weight"] @ rms_norm(h, w[p + "ffn_norm.weight"]), 2)
        h = h + w[p + "ffn.down.weight"] @ (gate / (1 + np.exp(-gate)) * up)
    return rms_norm(h, w["final_norm.weight"])


@pytest.mark.parametrize("layer", [1, 2])
def test_static_vectors_are_each_token_run_alone_through_the_teachers_blocks(work, layer):
    teacher = work / "teacher" / "best"
    weights = load_file(teacher / "model.safetensors")
    table = teacher_states(teacher, read_config(teacher / "config.yaml"), layer, 50)
    assert table.shape == (50, 32)
    for token in (0, 7, 49):
        assert np.allclose(table[token].numpy(), state_by_hand(weights, token, layer, 32), atol=1e-5, rtol=0)


def test_a_frozen_table_of_static_vectors_through_the_cli(work, tmp_path):
    """teacher_states at the teacher's width, unprojected and unscaled, frozen: the saved rows are the states."""
    teacher, run = work / "teacher" / "best", tmp_path / "student"
    args = distill_args(teacher, work / "student.yaml", run, tmp_path / "cache", "model.d_model=32",
                        "model.lexicon.source=teacher_states", "model.lexicon.projection=none",
                        "model.lexicon.rms=null", "model.lexicon.freeze_steps=-1")  # fmt: skip
    assert main(args) == 0
    saved = load_file(run / "best" / "model.safetensors")["embed.weight"]
    assert torch.equal(saved, teacher_states(teacher, read_config(teacher / "config.yaml"), 1, saved.shape[0]))
    assert json.loads((run / LEXICON_FILE).read_text())["layer"] == 1


def test_a_pretrained_teachers_table_and_states_are_its_checkpoints():
    from transformers import AutoModel

    teacher_cfg = read_config(FROZEN_TEACHER / "config.yaml")
    base = AutoModel.from_pretrained(str(FROZEN_TEACHER / "trunk")).eval()
    table, origin = teacher_embeddings(FROZEN_TEACHER, teacher_cfg)
    assert torch.equal(table, base.get_input_embeddings().weight.detach()) and "embed_tokens.weight" in origin
    states = teacher_states(FROZEN_TEACHER, teacher_cfg, 1, 40)
    with torch.no_grad():
        out = base(input_ids=torch.arange(40).unsqueeze(1), output_hidden_states=True)
        want = base.norm(out.hidden_states[1])[:, 0]  # block 1's output, through the final norm
    assert torch.allclose(states, want, atol=1e-5, rtol=0)


def test_the_student_reads_with_the_teachers_tokenizer_as_the_teacher_reads(work):
    student = read_config(work / "teacher" / "best" / "config.yaml")  # any native config will do
    for teacher, joined in ((work / "teacher" / "best", False), (FROZEN_TEACHER, True)):
        cfg = copy.deepcopy(student)
        cfg.model.d_model = 16
        cfg.model.lexicon.source = "teacher_states"
        resolved = resolve_lexicon(cfg, teacher, read_config(teacher / "config.yaml"))
        assert resolved.tokenizer.kind == "pretrained" and resolved.model.words_as_text is joined
        assert Path(resolved.tokenizer.pretrained) == (teacher / "tokenizer.json").resolve()
        assert resolved.model.lexicon.layer == 1  # the middle of 2 blocks
    assert resolve_lexicon(student, FROZEN_TEACHER, read_config(FROZEN_TEACHER / "config.yaml")) is student


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["model.lexicon.source=teacher_embeddings", "model.lexicon.projection=none"], "model.lexicon.projection"),
        (["model.lexicon.source=teacher_embeddings", "model.d_model=64"], "model.lexicon.projection"),
        (["model.lexicon.source=teacher_states", "model.lexicon.layer=3"], "model.lexicon.layer"),
        (["model.lexicon.source=teacher_states", "tokenizer.kind=pretrained", "tokenizer.pretrained=gpt2"],
         "tokenizer.pretrained"),
    ],
)  # fmt: skip
def test_options_that_cannot_work_are_refused_before_any_work(work, tmp_path, capsys, extra, key):
    out = tmp_path / "run"
    assert main(distill_args(work / "teacher" / "best", work / "student.yaml", out, tmp_path / "cache", *extra)) == 2
    assert f"config key '{key}'" in one_line_error(capsys) and not out.exists()


def test_plain_train_refuses_a_lexicon(work, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--config", str(work / "student.yaml"), "--output-dir", str(out)]
    assert main([*args, "model.lexicon.source=teacher_embeddings"]) == 2
    assert "config key 'model.lexicon.source'" in one_line_error(capsys) and not out.exists()


def span_residual(centred: np.ndarray, table: np.ndarray) -> float:
    """How far ``table`` lies from every linear map of the teacher's ``centred`` rows: the least-squares residual
    of table = centred @ P, relative to the table's norm (0: a projection of the rows)."""
    p, *_ = np.linalg.lstsq(centred, table, rcond=None)
    return float(np.linalg.norm(centred @ p - table) / np.linalg.norm(table))


def test_a_learned_projection_trains_a_map_of_the_teachers_rows_and_saves_one_table(work, tmp_path):
    """projection learned: it starts at the PCA table; trained, the saved table moved yet is still a linear map of
    the teacher's whole (centred) rows, which a fine-tuned PCA table is not; the saved student is a plain lookup."""
    teacher = work / "teacher" / "best"
    rows = load_file(teacher / "model.safetensors")["embed.weight"].double().numpy()
    centred = rows - rows.mean(axis=0)
    saved = {}
    for name, extra in (("learned", ["model.lexicon.projection=learned"]), ("pca", [])):
        run = tmp_path / name
        args = distill_args(teacher, work / "student.yaml", run, tmp_path / "cache",
                            "model.lexicon.source=teacher_embeddings", *extra)  # fmt: skip
        assert main(args) == 0
        saved[name] = load_file(run / "best" / "model.safetensors")
    started = load_file(tmp_path / "learned" / LEXICON_TABLE)
    want = numpy_pca(rows, 24, 0.02)
    assert np.allclose(started["table"].numpy(), want, atol=1e-5, rtol=0)
    assert np.allclose(started["rows"].numpy(), centred, atol=1e-6, rtol=0)
    assert np.allclose((started["rows"] @ started["projection"]).numpy(), want, atol=1e-5, rtol=0)

    table = saved["learned"]["embed.weight"].double().numpy()
    assert "embed.projection" not in saved["learned"] and table.shape == want.shape
    assert np.abs(table - want).max() > 1e-4  # it trained
    assert span_residual(centred, table) < 1e-5
    assert span_residual(centred, saved["pca"]["embed.weight"].double().numpy()) > 1e-3  # each row moved alone
    assert json.loads((tmp_path / "learned" / LEXICON_FILE).read_text())["projection"] == "learned"
    card = (tmp_path / "learned" / "best" / "README.md").read_text()
    assert "their projection fine-tuned from the first step" in card

    source = tmp_path / "texts.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert len(predict(tmp_path / "learned" / "best", source, tmp_path / "out.jsonl")) == len(TEXTS)


def test_a_learned_projection_resumes_to_the_unbroken_runs_weights(work, tmp_path):
    """The checkpoint holds the projection, the run folder the rows: killed after step 2, resumed, the same end."""
    a, b = unbroken_and_resumed(work, tmp_path, "model.lexicon.projection=learned")
    assert "embed.projection" in a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    best = [load_file(tmp_path / n / "best" / "model.safetensors")["embed.weight"] for n in ("unbroken", "killed")]
    assert torch.equal(*best)
