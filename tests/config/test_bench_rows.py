"""benchmarks/smollm2_rows.py's and distill_rows.py's rows (benchmarks/quality.py trains them): each config with its
overrides loads and validates, so a row cannot fail only after the hours of the rows before it."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml

from mtl_decoder.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _rows(name: str = "smollm2_rows"):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROWS = _rows()
DISTILL = _rows("distill_rows")


@pytest.mark.parametrize("name", sorted(ROWS.ROWS))
def test_each_row_validates(name):
    config, overrides, _ = ROWS.ROWS[name]
    cfg = load_config(REPO / "configs" / "bench" / config, overrides)
    trunk = cfg.model.trunk
    assert trunk.enabled and trunk.caches_states
    if "default" in name:
        assert trunk.read_layers == [8, 16, 24] and trunk.mixes_layers  # the chosen default recipe
    if "hybrid" in name:
        assert trunk.mode == ("echo_hybrid" if "echo" in name else "hybrid") and trunk.train_top in (2, 4)
        # blocks 15-16 or 13-16 trained over blocks 1-12/14, or (on16) k more blocks over the 16 cached ones
        assert trunk.layers == (16 + trunk.train_top if "on16" in name else 16)


def test_every_pair_names_two_rows():
    for first, second in ROWS.PAIRS.values():
        assert first in ROWS.ROWS and second in ROWS.ROWS


@pytest.mark.parametrize(
    "recipe, row",
    [
        ("bench/smollm2_hybrid.yaml", "smollm2_hybrid2_on16_ple"),
        ("bench/smollm2_echo_hybrid.yaml", "smollm2_echo_hybrid2_on16_bidir_full_ple"),
        ("bench/smollm2_hybrid_semeval.yaml", "smollm2_semeval_hybrid2_on16_ple"),
        ("distill_fast.yaml", "distill_small_states_long_sent"),
        ("distill_fast_lexicon.yaml", "distill_small_states_sent_bidirteacher_lex_learned_6pass"),
        ("distill_first_blocks.yaml", "distill_b4_states_long_sent_bidirteacher"),
    ],
)
def test_the_recipe_files_are_the_rows_that_measured_them(recipe, row):
    """The docs' figures for a recipe file come from a row built as a base config plus overrides: the same run."""
    config, overrides, _ = {**ROWS.ROWS, **DISTILL.DISTILL_MODELS}[row]
    same_dir = ["training.output_dir=runs/x"]
    if row in DISTILL.DISTILL_MODELS:
        same_dir.append("training.max_minutes=200")  # the cap: quality.py's --minutes
    measured = _as_tree(REPO / "configs" / "bench" / config, [*overrides, *same_dir])
    assert _as_tree(REPO / "configs" / recipe, same_dir) == measured


def _as_tree(path: Path, overrides: list[str]) -> dict:
    """The loaded config as a tree, model.trunk.pretrained read against the file's folder: the loader makes a path
    absolute only where the checkpoint exists (not on CI), so files in two folders name one checkpoint apart."""
    tree = yaml.safe_load(load_config(path, overrides).to_yaml())
    trunk = tree["model"]["trunk"]
    if trunk.get("pretrained") and not os.path.isabs(trunk["pretrained"]):
        trunk["pretrained"] = os.path.normpath(path.parent / trunk["pretrained"])
    return tree


@pytest.mark.parametrize("name", sorted(DISTILL.DISTILL_MODELS))
def test_each_distill_row_validates(name):
    """A distill row's student config (the teacher is the script's argument: checked when the row runs)."""
    config, overrides, _ = DISTILL.DISTILL_MODELS[name]
    lexicon = load_config(REPO / "configs" / "bench" / config, overrides).model.lexicon
    assert lexicon.enabled == ("_lex_" in name)
    if "_lex_" in name:  # distill_small's student plus the lexicon's keys (and seed, teacher precision, states, steps)
        kept = (
            "model.lexicon.",
            "training.seed=",
            "distill.teacher_",
            "distill.state_weight=",
            "distill.sentence_state_weight=",
            "training.max_steps=",
        )
        rest = [o for o in overrides if not o.startswith(kept)]
        small = DISTILL.DISTILL_MODELS["distill_small"][1]
        changed = next((keys for part, keys in STUDENT_LEVERS.items() if part in name), ())
        if changed:  # a row named for a lever sets exactly that lever's keys on top of the small student
            assert sorted(o.split("=")[0] for o in rest if o.startswith(changed)) == sorted(k[:-1] for k in changed)
            rest = [o for o in rest if not o.startswith(changed)]
            small = [o for o in small if not o.startswith(changed)]
        assert rest == small


STUDENT_LEVERS = {
    "_hashdrop": ("model.word_hash_dropout=",),
    "_char64": ("model.char_embedding=",),
    "distill_w160_": ("model.d_model=", "model.expert_hidden=", "training.lr="),
}
"""The student keys a lexicon row named for a lever changes (every other key is distill_small's)."""


def test_a_distill_row_keeps_both_kinds_of_state_record(tmp_path):
    """A row's result keeps what distill.json says of each kind of state target, and no kind the run did not use."""
    word = {"weight": 1.0, "teacher_width": 256, "width": 128}
    sentence = {"weight": 3.0, "teacher_width": 256, "width": 128}
    facts = {"folder": "t", "fingerprint": "f", "temperature": 2.0, "alpha": 0.5, "soft": True, "unlabelled": {}}
    facts["targets"] = {"texts": 10, "computed": 0}
    (tmp_path / "distill.json").write_text(json.dumps({**facts, "states": word, "sentence_states": sentence}))
    row = DISTILL.distill_facts(tmp_path)
    assert (row["states"], row["sentence_states"]) == (word, sentence)
    (tmp_path / "distill.json").write_text(json.dumps({**facts, "states": word}))
    assert "sentence_states" not in DISTILL.distill_facts(tmp_path)
