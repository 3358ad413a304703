"""Peer: a linear-chain CRF over hand-made word features (sklearn-crfsuite), trained from scratch on CoNLL-2003 and
on SemEval-2014 restaurant aspect terms, scored with the project's entity metrics.

    pip install -e '.[peers]'          # sklearn-crfsuite (python-crfsuite), not part of the core install
    python benchmarks/peers/crf.py [--data-root ../shared/data] [--iterations 100]

Features of word i (word_features): the word as written and lower-cased, its first three and last two and three
characters, its shape (each character mapped to X, x, d or itself, runs of the same class collapsed: "McDonald's"
-> "XxXx'x"), whether it is all caps, capitalised, a number, punctuation; the lower-cased word, last three
characters, shape and case flags of words i-1 and i+1, and sentence start and end markers. No part-of-speech
tags, gazetteers or vectors.

Training: L-BFGS with L1 0.1 and L2 0.1 (sklearn-crfsuite's tutorial settings), every transition allowed, bound
by --iterations. CoNLL: train on train, report validation and test. SemEval: train on the 90% of train that the
project's semeval rows train on (benchmarks/quality.py's carve_semeval), report the carved validation and the
official test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peer_common.py beside this file

from peer_common import (
    RESULTS,
    conll2003,
    cpu_timed,
    default_data_root,
    entity_scores,
    run_facts,
    save_peer,
    semeval_splits,
)


def shape(word: str) -> str:
    """The word's character classes (X upper, x lower, d digit, anything else itself), runs collapsed."""
    out: list[str] = []
    for ch in word:
        c = "X" if ch.isupper() else "x" if ch.islower() else "d" if ch.isdigit() else ch
        if not out or out[-1] != c:
            out.append(c)
    return "".join(out)


def _case(word: str, prefix: str) -> dict[str, Any]:
    """The features a word and its neighbours share: identity, shape and case."""
    return {
        f"{prefix}lower": word.lower(),
        f"{prefix}suffix3": word[-3:],
        f"{prefix}shape": shape(word),
        f"{prefix}istitle": word.istitle(),
        f"{prefix}isupper": word.isupper(),
    }


def word_features(tokens: list[str], i: int) -> dict[str, Any]:
    """crfsuite features of ``tokens[i]``: the word itself, then its neighbours (i-1 and i+1)."""
    word = tokens[i]
    features: dict[str, Any] = {
        "bias": 1.0,
        **_case(word, ""),
        "word": word,
        "prefix3": word[:3],
        "suffix2": word[-2:],
        "isdigit": word.isdigit(),
        "ispunct": not any(ch.isalnum() for ch in word),
    }
    if i > 0:
        features.update(_case(tokens[i - 1], "-1:"))
    else:
        features["BOS"] = True
    if i + 1 < len(tokens):
        features.update(_case(tokens[i + 1], "+1:"))
    else:
        features["EOS"] = True
    return features


def sentence_features(tokens: list[str]) -> list[dict[str, Any]]:
    return [word_features(tokens, i) for i in range(len(tokens))]


def train_and_score(
    train: tuple[list[list[str]], list[list[str]]],
    evaluate: dict[str, tuple[list[list[str]], list[list[str]]]],
    iterations: int,
) -> dict[str, Any]:
    """Train a CRF on ``train`` (tokens, tags); the project's entity metrics on each ``evaluate`` split, and the
    CPU and wall seconds training took."""
    import sklearn_crfsuite

    crf = sklearn_crfsuite.CRF(
        algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=iterations, all_possible_transitions=True
    )
    x_train = [sentence_features(tokens) for tokens in train[0]]
    _, cpu, wall = cpu_timed(lambda: crf.fit(x_train, train[1]))
    out: dict[str, Any] = {"train_cpu_s": cpu, "train_wall_s": wall, "train_sentences": len(train[0])}
    for split, (tokens, tags) in evaluate.items():
        pred = crf.predict([sentence_features(t) for t in tokens])
        out[split] = entity_scores(tags, [list(p) for p in pred])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=default_data_root(), help="folder with conll2003/ etc.")
    parser.add_argument("--iterations", type=int, default=100, help="L-BFGS iterations (the training bound)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file to merge into")
    args = parser.parse_args(argv)
    try:
        import sklearn_crfsuite  # noqa: F401
    except ImportError:
        raise SystemExit("crf.py needs sklearn-crfsuite: pip install -e '.[peers]'") from None
    run = run_facts()
    conll = train_and_score(
        conll2003(args.data_root, "train"),
        {s: conll2003(args.data_root, s) for s in ("validation", "test")},
        args.iterations,
    )
    semeval = semeval_splits(args.data_root)

    def tagged(records: list[dict]) -> tuple[list[list[str]], list[list[str]]]:
        return [r["tokens"] for r in records], [r["aspect_tags"] for r in records]

    aspect = train_and_score(
        tagged(semeval["train"]), {s: tagged(semeval[s]) for s in ("validation", "test")}, args.iterations
    )
    entry = {
        "description": "linear-chain CRF (sklearn-crfsuite, L-BFGS, c1 = c2 = 0.1, "
        f"{args.iterations} iterations): word, 3-letter prefix, 2- and 3-letter suffix, shape and case of the word, "
        "and lower-cased word, 3-letter suffix, shape and case of its two neighbours",
        "source": "benchmarks/peers/crf.py",
        "conll2003": {
            "validation_f1": conll["validation"]["f1"],
            "test_f1": conll["test"]["f1"],
            "train_cpu_s": conll["train_cpu_s"],
            "train_wall_s": conll["train_wall_s"],
            "validation": conll["validation"],
            "test": conll["test"],
        },
        "semeval14_aspect": {
            "validation_f1": aspect["validation"]["f1"],
            "test_f1": aspect["test"]["f1"],
            "train_cpu_s": aspect["train_cpu_s"],
            "train_wall_s": aspect["train_wall_s"],
            "train_sentences": aspect["train_sentences"],
            "validation": aspect["validation"],
            "test": aspect["test"],
        },
        "settings": {"iterations": args.iterations, "c1": 0.1, "c2": 0.1},
    }
    save_peer("crf", entry, run, args.out)
    print(
        f"CRF: CoNLL val/test F1 {conll['validation']['f1']:.4f} / {conll['test']['f1']:.4f} "
        f"({conll['train_cpu_s']:.0f} CPU-s); SemEval aspect test F1 {aspect['test']['f1']:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
