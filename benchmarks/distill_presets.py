"""The students' shared settings: the small student's overrides, the inherited lexicon, a row at other seeds."""

from __future__ import annotations

SMALL = [
    "model.d_model=128",
    "model.n_layers=2",
    "model.n_heads=4",
    "model.expert_hidden=256",
    "model.word_hash_buckets=32768",
    "model.word_hash_dim=32",
]
"""The small fast student: configs/bench/ple.yaml's model at d_model 128 and 2 layers, fewer hashed features."""
LEX_EMBED = ["model.lexicon.source=teacher_embeddings"]
"""The student's tokenizer and token-embedding table inherited from the teacher's (its checkpoint's input
embeddings, PCA to the student's width)."""
LEX_LEARNED = [*LEX_EMBED, "model.lexicon.projection=learned"]
"""The teacher's whole token-embedding table kept frozen, and its projection to the student's width trained (started
at the PCA directions, folded into one table when the student is saved)."""


def at_seeds(name: str, overrides: list[str], seeds: tuple[int, ...] = (1, 2)) -> dict[str, tuple[str, list[str], str]]:
    """Row ``name`` (configs/bench/ple.yaml with ``overrides``) at other seeds: ``NAME_seedN`` for each N."""
    return {f"{name}_seed{n}": ("ple.yaml", [*overrides, f"training.seed={n}"], f"{name} at seed {n}") for n in seeds}


def with_seeds(
    name: str, overrides: list[str], what: str, seeds: tuple[int, ...] = (0, 1), config: str = "ple.yaml"
) -> dict[str, tuple[str, list[str], str]]:
    """Row ``name`` (configs/bench/``config`` with ``overrides``) at each seed: seed 0 as ``name``, the others as
    ``NAME_seedN``."""
    return {
        name + (f"_seed{n}" if n else ""): (
            config,
            [*overrides, *([f"training.seed={n}"] if n else [])],
            what + (f", seed {n}" if n else ""),
        )
        for n in seeds
    }
