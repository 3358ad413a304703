"""The ``distill_*`` rows of benchmarks/quality.py: students distilled from a trained teacher on CoNLL-2003 + SST-2.

    python benchmarks/quality.py --models distill_ple,distill_small --teacher benchmarks/runs/smollm2_frozen_ple/best

The teacher is a saved model folder with the tasks conll2003 and sst2 (by default the SmolLM2 ``ple`` run,
benchmarks/runs/smollm2_frozen_ple/best; --teacher or $MTL_DECODER_TEACHER for another). The transfer set is the
training texts of both tasks plus the unlabelled text in --data-root/unlabelled (news.txt for CoNLL, the movie
reviews for SST-2); the teacher labels every text once and its targets are cached (~/.cache/mtl-decoder/targets,
or $MTL_DECODER_CACHE/targets), so only the first row pays for the teacher. Every row is bound by its config's
training.max_steps, like the other rows. Each row also records ``words_per_cpu_s``: the student predicting the
first SPEED_SENTENCES CoNLL-2003 test sentences (every task) at one thread, timed as benchmarks/spacy_throughput.py
times it (its ``ours`` and ``timed``: one warm-up, then the median of SPEED_ROUNDS passes). The ``distill_small_lex_*``
rows are distill_small with the teacher's lexicon inherited (model.lexicon); they also record what lexicon.json says
(``lexicon``: the table's source, projection, explained variance, how long it was held):

    python benchmarks/quality.py --models distill_small_lex_embed,distill_small_lex_states --teacher TEACHER/best
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from distill_presets import LEX_EMBED, SMALL, at_seeds
from distill_state_rows import STATE_ROWS

REPO = Path(__file__).resolve().parents[1]
TEACHER_ENV = "MTL_DECODER_TEACHER"
DEFAULT_TEACHER = REPO / "benchmarks" / "runs" / "smollm2_frozen_ple" / "best"
UNLABELLED = ("unlabelled/news.txt", "unlabelled/movie_reviews.txt")
"""The transfer set's unlabelled files under --data-root."""
SPEED_SENTENCES, SPEED_ROUNDS = 1000, 3

DISTILL_MODELS: dict[str, tuple[str, list[str], str]] = {  # name -> (config, overrides, what it is), as MODELS
    "distill_ple": ("ple.yaml", [], "the bench-size student distilled from the teacher, the whole transfer set"),
    "distill_small": ("ple.yaml", SMALL, "the small student (d_model 128, 2 layers), the whole transfer set"),
    "distill_ple_transfer_train": (
        "ple.yaml",
        [],
        "the bench-size student, transfer set: the training texts only (no unlabelled text)",
    ),
    "distill_ple_transfer_10k": (
        "ple.yaml",
        ["distill.unlabelled_limit=10000"],
        "the bench-size student, transfer set: the training texts + 10,000 unlabelled sentences per task",
    ),
    "distill_ple_hard": (
        "ple.yaml",
        ["distill.soft=false"],
        "the bench-size student on the teacher's hard labels (argmax) instead of its distributions",
    ),
    "distill_small_hard": ("ple.yaml", [*SMALL, "distill.soft=false"], "the small student on the hard labels"),
    # the temperature around its default (2), alpha 0.5: what distill.temperature's default rests on
    "distill_small_t1": ("ple.yaml", [*SMALL, "distill.temperature=1"], "the small student at temperature 1"),
    "distill_small_t4": ("ple.yaml", [*SMALL, "distill.temperature=4"], "the small student at temperature 4"),
    "distill_small_alpha09": ("ple.yaml", [*SMALL, "distill.alpha=0.9"], "the small student at alpha 0.9 (T 2)"),
    # the same student and settings at other seeds: how far one seed's figures can be trusted
    "distill_small_seed1": ("ple.yaml", [*SMALL, "training.seed=1"], "distill_small at seed 1"),
    "distill_small_seed2": ("ple.yaml", [*SMALL, "training.seed=2"], "distill_small at seed 2"),
    # the small student inheriting the teacher's lexicon (model.lexicon, docs/distillation.md): the teacher's tokenizer,
    # and its token-embedding table started from the teacher's (issue 35 item 2); against distill_small and its seeds
    "distill_small_lex_embed": (
        "ple.yaml",
        [*SMALL, *LEX_EMBED],
        "the small student, its table the teacher's token embeddings (PCA to 128), fine-tuned from the first step",
    ),
    "distill_small_lex_embed_held": (
        "ple.yaml",
        [*SMALL, *LEX_EMBED, "model.lexicon.freeze_steps=650"],
        "distill_small_lex_embed with the table held for the first 650 steps (a tenth of the run), then fine-tuned",
    ),
    "distill_small_lex_embed_frozen": (
        "ple.yaml",
        [*SMALL, *LEX_EMBED, "model.lexicon.freeze_steps=-1"],
        "distill_small_lex_embed with the table frozen for the whole run",
    ),
    "distill_small_lex_states": (
        "ple.yaml",
        [*SMALL, "model.lexicon.source=teacher_states"],
        "the small student, its table static vectors: each token alone through the teacher's first half of blocks "
        "(PCA to 128), fine-tuned from the first step",
    ),
    # issue 35's levers on the training texts alone (the teacher labels them from its state cache: no trunk pass), so
    # that each lever is measured against the same transfer set at a small labelling cost: the plain small student,
    # then with the teacher's token embeddings, then with its static block-8 vectors
    "distill_small_train": (
        "ple.yaml",
        SMALL,
        "the small student, transfer set: the training texts only (the baseline of the lexicon rows below)",
    ),
    "distill_small_train_lex_embed": (
        "ple.yaml",
        [*SMALL, *LEX_EMBED],
        "distill_small_train, its tokenizer and table the teacher's (token embeddings, PCA to 128)",
    ),
    "distill_small_train_lex_states": (
        "ple.yaml",
        [*SMALL, "model.lexicon.source=teacher_states"],
        "distill_small_train, its tokenizer the teacher's, its table static vectors (each token alone through the "
        "teacher's first half of blocks, PCA to 128)",
    ),
    # issue 35 item 1 on a CPU: the whole transfer set (training texts and the 113k unlabelled sentences) labelled by
    # the 16-block teacher in W8A8 int8 (distill.teacher_precision), about three times its float32 speed
    "distill_small_int8teacher": (
        "ple.yaml",
        [*SMALL, "distill.teacher_precision=int8"],
        "the small student, the whole transfer set labelled by the teacher in W8A8 int8",
    ),
    **at_seeds("distill_small_int8teacher", [*SMALL, "distill.teacher_precision=int8"]),
    # issue 35 item 1 with the best validation model: the bidirectional hybrid (issue 37) labels in W8A8 int8
    "distill_small_hybridteacher": (
        "ple.yaml",
        [*SMALL, "distill.teacher_precision=int8"],
        "the small student, the whole transfer set labelled by the bidirectional hybrid in W8A8 int8",
    ),
    **at_seeds("distill_small_hybridteacher", [*SMALL, "distill.teacher_precision=int8"]),
    **STATE_ROWS,
    # the better teacher issue 37 gave: the frozen trunk read in echo (0.864 / 0.906 test against 0.850 / 0.885),
    # in W8A8 int8, with and without its word states
    "distill_small_echoteacher_states": (
        "ple.yaml",
        [*SMALL, "distill.teacher_precision=int8", "distill.state_weight=1.0"],
        "distill_small_states taught by the echo-read 16-block model in W8A8 int8",
    ),
    "distill_small_echoteacher": (
        "ple.yaml",
        [*SMALL, "distill.teacher_precision=int8"],
        "distill_small_int8teacher taught by the echo-read 16-block model in W8A8 int8",
    ),
    "distill_small_int8teacher_lex_embed": (
        "ple.yaml",
        [*SMALL, *LEX_EMBED, "distill.teacher_precision=int8"],
        "distill_small_int8teacher, its tokenizer and table the teacher's (token embeddings, PCA to 128)",
    ),
    # the student's own validation-to-test drop (memorised training names?): the hashed features naming a word
    # blanked for half of a batch's distinct words in training (the affixes, characters and shape stay)
    "distill_small_hashdrop": (
        "ple.yaml",
        [*SMALL, "distill.teacher_precision=int8", "model.word_hash_dropout=0.5"],
        "distill_small_int8teacher with model.word_hash_dropout 0.5",
    ),
    "distill_small_train_seed1": ("ple.yaml", [*SMALL, "training.seed=1"], "distill_small_train at seed 1"),
    "distill_small_train_lex_embed_seed1": (
        "ple.yaml",
        [*SMALL, *LEX_EMBED, "training.seed=1"],
        "distill_small_train_lex_embed at seed 1",
    ),
}
TRAIN_TEXTS_ONLY = {"distill_ple_transfer_train", "distill_small_train", "distill_small_train_lex_embed",
                    "distill_small_train_lex_states", "distill_small_train_seed1",
                    "distill_small_train_lex_embed_seed1",
                    *(f"distill_b{n}_states_sent_echoteacher_train{s}"
                      for n in (1, 4) for s in ("", "_seed1"))}  # fmt: skip
"""Rows whose transfer set is the training texts alone (no --unlabelled)."""


BIDIR_HYBRID = REPO / "benchmarks" / "runs" / "smollm2_hybrid2_on16_bidir_ple" / "best"
ECHO = REPO / "benchmarks" / "runs" / "smollm2_echo_ple" / "best"
BIDIR_SHORT_PER_TOKEN = REPO / "benchmarks" / "runs" / "smollm2_hybrid2_on16_bidir_short_pertoken" / "best"
"""smollm2_hybrid2_on16_bidir_short_ple's model quantized with ``mtl-decoder quantize --per-token all``."""
ECHO_RECIPE = REPO / "benchmarks" / "runs" / "smollm2_echo_hybrid2_on16_bidir_full_ple" / "best"
"""The echo recipe's model (configs/bench/smollm2_echo_hybrid.yaml, 6,500 steps, seed 0), the best teacher."""
ROW_TEACHERS = {
    **{name: BIDIR_HYBRID for name in ("distill_small_hybridteacher", "distill_small_hybridteacher_seed1",
                                       "distill_small_hybridteacher_seed2")},
    **{name: ECHO for name in ("distill_small_echoteacher_states", "distill_small_echoteacher")},
    **{f"distill_small_states_long_sent_bidirteacher{s}": BIDIR_SHORT_PER_TOKEN
       for s in ("", "_seed1", "_seed2", "_lex_embed", "_lex_learned", "_lex_learned_seed1", "_lex_learned_seed2")},
    **{f"distill_small_states_sent_bidirteacher_lex_learned_6pass{s}": BIDIR_SHORT_PER_TOKEN
       for s in ("", "_seed1", "_seed2")},
    **{f"distill_small_states_long_sent_bidirteacher_lex_learned_{lever}": BIDIR_SHORT_PER_TOKEN
       for lever in ("aug", "hashdrop", "char64", "char64_seed1")},
    **{f"distill_w160_states_long_sent_bidirteacher_lex_learned{s}": BIDIR_SHORT_PER_TOKEN for s in ("", "_seed1")},
    **{f"distill_b{n}_states_long_sent_bidirteacher{s}": BIDIR_SHORT_PER_TOKEN
       for n in (1, 4) for s in ("", "_seed1", "_seed2")},
    **{f"distill_b1_states_sent_bidirteacher_6pass{s}": BIDIR_SHORT_PER_TOKEN for s in ("", "_seed1", "_seed2")},
    **{name: ECHO_RECIPE for name in STATE_ROWS if "_states_sent_echoteacher" in name},
}  # fmt: skip
"""Rows taught by their own teacher (the others by --teacher, $MTL_DECODER_TEACHER or the 16-block model)."""


def teacher_folder(flag: str | None, row: str | None = None) -> Path:
    if row in ROW_TEACHERS:
        return ROW_TEACHERS[row]
    return Path(flag or os.environ.get(TEACHER_ENV) or DEFAULT_TEACHER)


def distill_command(name: str, config: Path, run_dir: Path, teacher: Path, data_root: Path) -> list[str]:
    """The ``mtl-decoder`` arguments of a distill row, before its overrides."""
    if not (teacher / "model.safetensors").is_file():
        raise SystemExit(
            f"[{name}] no teacher at {teacher}: train benchmarks/quality.py --models smollm2_frozen_ple first, or "
            f"pass --teacher (or ${TEACHER_ENV})"
        )
    cmd = ["distill", "--teacher", str(teacher), "--config", str(config), "--output-dir", str(run_dir)]
    if name in AUGMENTED:
        cmd += [arg for f in UNLABELLED for arg in ("--unlabelled", str(augmented_file(data_root / f)))]
    elif name not in TRAIN_TEXTS_ONLY:
        cmd += [arg for f in UNLABELLED for arg in ("--unlabelled", str(data_root / f))]
    return cmd


AUGMENTED = {"distill_small_states_long_sent_bidirteacher_lex_learned_aug"}
"""Rows whose unlabelled files each hold their texts and one altered copy of each (``mtl-decoder augment
--keep-inputs``, its default rules and seed 0): the same four sources, each source's texts about doubled."""


def augmented_file(source: Path) -> Path:
    """``source`` and one altered copy of each of its texts, made once under benchmarks/runs/data."""
    target = REPO / "benchmarks" / "runs" / "data" / f"{source.stem}_aug1.txt"
    if not target.is_file():
        augment = ["augment", "--input", str(source), "--output", str(target), "--keep-inputs"]
        subprocess.run([sys.executable, "-m", "mtl_decoder", *augment], check=True, cwd=REPO)
    return target


def distill_facts(run_dir: Path) -> dict:
    """What distill.json says of the row: the teacher, the transfer set and the targets' cost."""
    facts = json.loads((run_dir / "distill.json").read_text())
    targets = facts["targets"]
    return {
        "teacher": facts["folder"],
        "teacher_fingerprint": facts["fingerprint"],
        "temperature": facts["temperature"],
        "alpha": facts["alpha"],
        "soft": facts["soft"],
        "transfer_texts": targets["texts"],
        "unlabelled": facts["unlabelled"],
        "targets_computed": targets["computed"],
        "teacher_minutes": targets.get("seconds", 0.0) / 60,
        **{key: facts[key] for key in ("states", "sentence_states") if key in facts},
        **lexicon_facts(run_dir),
    }


def lexicon_facts(run_dir: Path) -> dict:
    """What lexicon.json says of a row whose student inherited the teacher's lexicon (nothing for the others)."""
    path = run_dir / "lexicon.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    keys = ("source", "read", "layer", "projection", "explained_variance", "rms", "freeze_steps", "rows", "seconds")
    return {"lexicon": {key: record.get(key) for key in keys}}


def words_per_cpu_s(best: Path, data_root: Path) -> dict:
    """The student's prediction speed at one thread, measured as benchmarks/spacy_throughput.py measures ours.

    A student on a frozen pretrained trunk reads an empty state cache, as benchmarks/pretrained_throughput.py times
    such models: every sentence runs through the trunk as a new text does (its training cache, which holds no test
    sentence, would only add the cost of indexing its shards)."""
    from pretrained_throughput import runner
    from spacy_throughput import ours, read_sentences, timed

    from mtl_decoder.saved import load_model

    saved = load_model(best, device="cpu")
    items = read_sentences(data_root, SPEED_SENTENCES)
    with tempfile.TemporaryDirectory() as empty:
        run = runner(saved, items, "fp32", Path(empty)) if (best / "trunk.json").is_file() else ours(saved, items, 1)
        run()  # warm-up
        rounds = [timed(run) for _ in range(SPEED_ROUNDS)]
    return {
        "words_per_cpu_s": statistics.median(r["words_per_cpu_s"] for r in rounds),
        "words_per_s": statistics.median(r["words_per_s"] for r in rounds),
        "speed_sentences": len(items),
    }


def distill_table(results: dict) -> list[str]:
    """The distill rows' own facts beside the main table: speed, transfer set, teacher's targets."""
    rows = [n for n in DISTILL_MODELS if n in results]
    if not rows:
        return []
    lines = [
        "| distilled student | words/CPU-s (1 thread) | transfer texts | targets | T | alpha | teacher |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in rows:
        run = results[name]
        kind = "soft" if run.get("soft", True) else "hard"
        lines.append(
            f"| {name} | {run.get('words_per_cpu_s', 0):,.0f} | {run.get('transfer_texts', 0):,} | {kind} | "
            f"{run.get('temperature')} | {run.get('alpha')} | `{run.get('teacher')}` |"
        )
    return lines
