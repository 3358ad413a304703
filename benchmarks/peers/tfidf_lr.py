"""Peer: TF-IDF of word 1- and 2-grams with a logistic regression (scikit-learn), trained from scratch on SST-2 and
on SemEval-2014 restaurant sentence polarity, scored with the project's classification metrics.

    python benchmarks/peers/tfidf_lr.py [--data-root ../shared/data] [--C 8] [--iterations 1000]

Features: scikit-learn's TfidfVectorizer defaults (lower-cased, words of two or more word characters) over 1- and
2-grams, fitted on the train texts only. Classifier: LogisticRegression with C = 8 (lbfgs; multinomial over the
four SemEval classes), bound by --iterations. SST-2: train on train, report validation and test. SemEval: the
sentence's words joined by spaces; train on the 90% of train the project's semeval rows train on
(benchmarks/quality.py's carve_semeval), report the carved validation and the official test, accuracy and
macro-F1 over positive, negative, neutral and conflict.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peer_common.py beside this file

from peer_common import (
    RESULTS,
    SEMEVAL_POLARITY_LABELS,
    class_scores,
    cpu_timed,
    default_data_root,
    run_facts,
    save_peer,
    semeval_splits,
    sst2,
)


def build(c: float, iterations: int):
    """The TF-IDF 1-2 gram + logistic regression pipeline."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    return make_pipeline(TfidfVectorizer(ngram_range=(1, 2)), LogisticRegression(C=c, max_iter=iterations))


def train_and_score(
    train: tuple[list[str], list[str]],
    evaluate: dict[str, tuple[list[str], list[str]]],
    labels: list[str],
    c: float,
    iterations: int,
) -> dict[str, Any]:
    """Fit on ``train`` (texts, labels); the project's metrics on each ``evaluate`` split, and the CPU and wall
    seconds fitting took (the vectoriser's included)."""
    model = build(c, iterations)
    _, cpu, wall = cpu_timed(lambda: model.fit(train[0], train[1]))
    out: dict[str, Any] = {"train_cpu_s": cpu, "train_wall_s": wall, "train_texts": len(train[0])}
    out["iterations_used"] = int(max(model[-1].n_iter_))
    for split, (texts, gold) in evaluate.items():
        out[split] = class_scores(gold, [str(p) for p in model.predict(texts)], labels)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=default_data_root(), help="folder with sst2/ etc.")
    parser.add_argument("--C", dest="c", type=float, default=8.0, help="inverse L2 strength")
    parser.add_argument("--iterations", type=int, default=1000, help="lbfgs iterations at most (the bound)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file to merge into")
    args = parser.parse_args(argv)
    run = run_facts()
    sst = train_and_score(
        sst2(args.data_root, "train"),
        {s: sst2(args.data_root, s) for s in ("validation", "test")},
        ["negative", "positive"],
        args.c,
        args.iterations,
    )
    semeval = semeval_splits(args.data_root)

    def labelled(records: list[dict]) -> tuple[list[str], list[str]]:
        return [" ".join(r["tokens"]) for r in records], [r["label"] for r in records]

    polarity = train_and_score(
        labelled(semeval["train"]),
        {s: labelled(semeval[s]) for s in ("validation", "test")},
        SEMEVAL_POLARITY_LABELS,
        args.c,
        args.iterations,
    )
    entry = {
        "description": f"TF-IDF of word 1-2 grams + logistic regression (scikit-learn, C = {args.c:g})",
        "source": "benchmarks/peers/tfidf_lr.py",
        "sst2": {
            "validation_accuracy": sst["validation"]["accuracy"],
            "test_accuracy": sst["test"]["accuracy"],
            "train_cpu_s": sst["train_cpu_s"],
            "train_wall_s": sst["train_wall_s"],
            "iterations_used": sst["iterations_used"],
            "validation": sst["validation"],
            "test": sst["test"],
        },
        "semeval14_polarity": {
            "test_accuracy": polarity["test"]["accuracy"],
            "test_macro_f1": polarity["test"]["macro_f1"],
            "validation_accuracy": polarity["validation"]["accuracy"],
            "train_cpu_s": polarity["train_cpu_s"],
            "train_texts": polarity["train_texts"],
            "iterations_used": polarity["iterations_used"],
            "validation": polarity["validation"],
            "test": polarity["test"],
        },
        "settings": {"C": args.c, "iterations": args.iterations, "ngram_range": [1, 2]},
    }
    save_peer("tfidf_lr", entry, run, args.out)
    print(
        f"TF-IDF + LR: SST-2 val/test acc {sst['validation']['accuracy']:.4f} / {sst['test']['accuracy']:.4f} "
        f"({sst['train_cpu_s']:.0f} CPU-s); SemEval polarity test acc {polarity['test']['accuracy']:.4f}, "
        f"macro-F1 {polarity['test']['macro_f1']:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
