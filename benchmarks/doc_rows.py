"""Which quality.json runs each results table of docs/benchmarks.md shows, in its order (doc_tables.py renders them).

A new row of a table is one more name here; its figures come from the run's entry.
"""

from __future__ import annotations

SCRATCH = [
    "ple",
    "cgc",
    "mmoe",
    "mlp",
    "single_conll2003",
    "single_sst2",
    "ple_causal",
    "ple_softmax",
    "ple_subwords_only",
    "ple_equal",
]
RERUN = ["ple", "cgc", "mmoe", "mlp", "single_conll2003", "single_sst2", "ple_linear_pos"]
PRETRAINED = [
    "smollm2_frozen_ple",
    "smollm2_single_conll2003",
    "smollm2_single_sst2",
    "smollm2_b12_ple",
    "smollm2_b8_ple",
    "smollm2_b4_ple",
]
PRETRAINED_DEFAULT = ["smollm2_default_ple", "smollm2_default_single_conll2003", "smollm2_default_single_sst2"]
"""Issue 23's candidate default (configs/bench/smollm2_default.yaml: blocks 8/16/24 by a per-route scalar mix)."""
PRETRAINED_READS = [
    "smollm2_frozen_ple",
    "smollm2_b12_ple",
    "smollm2_default_ple",
    "smollm2_mix_16_24_ple",
    "smollm2_concat_8_16_24_ple",
]
"""Which blocks the PLE layers read, on one CPU and one build: block 16 or 12 alone, two mixes, a concatenation."""
ECHO_3K_SEEDS = ("", "_seed1", "_seed2", "_seed3")
"""The echo recipe's rows at 3,000 steps and its single-task pair's: the seeds' suffixes."""
RECIPE_SEEDS = ("", "_seed1")
"""The echo recipe's rows at 6,500 steps (configs/bench/smollm2_echo_hybrid.yaml) and its single-task pair's: the
seeds' suffixes."""
PRETRAINED_TOP = [
    "smollm2_frozen_ple",
    "smollm2_hashdrop_ple",
    "smollm2_truecase_ple",
    "smollm2_echo_ple",
    "smollm2_hybrid2_on16_ple",
    "smollm2_hybrid2_on16_bidir_ple",
    "smollm2_hybrid2_on16_bidir_seed1_ple",
    "smollm2_hybrid2_on16_bidir_short_ple",
    "smollm2_hybrid2_on16_bidir_truecase_short_ple",
    "smollm2_echo_hybrid2_on16_bidir_short_ple",
    "smollm2_echo_hybrid2_on16_bidir_short_seed1_ple",
    "smollm2_echo_hybrid2_on16_bidir_short_noclip_ple",
    *[f"smollm2_echo_hybrid2_on16_bidir_3k{s}_ple" for s in ECHO_3K_SEEDS],
    "smollm2_echo_hybrid2_on16_short_ple",
    "smollm2_echo_hybrid2_on16_short_seed1_ple",
    *[f"smollm2_echo_hybrid2_on16_bidir_3k_single_{t}{s}" for t in ("conll2003", "sst2") for s in ECHO_3K_SEEDS],
    "smollm2_echo_hybrid2_on16_bidir_3k_conll2x_ple",
    "smollm2_echo_hybrid2_on16_bidir_3k_conll2x_seed1_ple",
    "smollm2_echo_hybrid2_on16_bidir_3k_equal_ple",
    "smollm2_echo_hybrid2_on16_bidir_3k_equal_seed1_ple",
    *[f"smollm2_echo_hybrid2_on16_bidir_full{s}_ple" for s in RECIPE_SEEDS],
    *[f"smollm2_echo_hybrid2_on16_bidir_full_single_{t}{s}" for t in ("conll2003", "sst2") for s in RECIPE_SEEDS],
]
"""On block 16's cached states: the recipe, its word-identity features dropped in training, its all-caps lines
truecased, each text read twice (echo), the top blocks trained (causal, and with the causal mask lifted, also on a
1,500-step schedule, with and without the all-caps lines truecased, and over echo states on 1,500 steps, also
without the gradient clip, and on 3,000 steps, the last with its single-task pair, four seeds each, with CoNLL drawn
twice as often, two seeds, and with both losses at weight 1, two seeds; then on 6,500 steps, the recipe, with its
single-task pair, two seeds)."""
PRETRAINED_READS_SEMEVAL = [
    "smollm2_semeval_ple",
    "smollm2_default_semeval_ple",
    "smollm2_semeval_concat_8_16_24_ple",
    "smollm2_semeval_b24_ple",
    "smollm2_semeval_b30_ple",
]
"""The same question on SemEval-2014: block 16 alone, the 8/16/24 mix, the three blocks concatenated, and how deep
(block 24 or all 30 alone)."""
PRETRAINED_TOP_SEMEVAL = [
    "smollm2_semeval_ple",
    "smollm2_semeval_hybrid2_on16_ple",
    "smollm2_semeval_hybrid2_on16_seed1_ple",
    "smollm2_semeval_hybrid2_on16_seed2_ple",
    "smollm2_semeval_hybrid4_on16_ple",
    "smollm2_semeval_hybrid2_on16_bidir_ple",
    "smollm2_semeval_hybrid2_on16_bidir_seed1_ple",
    "smollm2_semeval_echo_hybrid2_on16_bidir_ple",
    "smollm2_semeval_echo_hybrid2_on16_bidir_seed1_ple",
    *[f"smollm2_semeval_echo_hybrid2_on16_bidir_single_{t}" for t in ("aspect", "polarity")],
    "smollm2_semeval_echo_hybrid2_on16_bidir_single_aspect_seed1",
    "smollm2_semeval_echo_hybrid2_on16_bidir_single_polarity_seed1",
    "smollm2_semeval_hybrid2_on16_single_aspect",
    "smollm2_semeval_hybrid2_on16_single_polarity",
    "smollm2_semeval_hybrid2_on16_bidir_single_aspect",
    "smollm2_semeval_hybrid2_on16_bidir_single_aspect_seed1",
    "smollm2_semeval_hybrid2_on16_bidir_single_polarity",
    "smollm2_semeval_hybrid2_on16_bidir_single_polarity_seed1",
]
"""On block 16's states on SemEval-2014: frozen, two top blocks trained (three seeds) or four, the two with the
causal mask lifted (two seeds) and over echo states (one), the single-task pair of each (the bidirectional polarity
model at two seeds)."""
PRETRAINED_ABLATIONS = [
    "smollm2_conll_first_causal",
    "smollm2_conll_last_causal",
    "smollm2_conll_first_bidirectional",
    "smollm2_conll_last_bidirectional",
    "smollm2_conll_no_hashed_words",
    "smollm2_conll_trunk_only",
    "smollm2_single_conll2003_trunk_only",
]
