"""Peer: spaCy 3.8's CNN pipeline, one model for both tasks (a shared tok2vec read by ``ner`` and ``textcat``),
trained from scratch on CoNLL-2003 and SST-2 train, scored on their validation and test splits.

    python benchmarks/peers/spacy_pipeline.py [--data-root ../shared/data] [--epochs 5] [--spacy-python PATH]

spaCy is not a dependency of this project: it runs in its own virtual environment, as a worker process of this
script (the same file, ``--worker``), exactly as benchmarks/spacy_throughput.py does:

    python -m venv ../scratch/spacy-venv && ../scratch/spacy-venv/bin/pip install "spacy==3.8.*"

The pipeline is spacy_throughput.py's (SPACY_CONFIG, imported from it: one definition of the architecture whose
speed and quality the project quotes): a blank English model, MultiHashEmbed of NORM, PREFIX, SUFFIX and SHAPE
with a MaxoutWindowEncoder (width 96, depth 4, no vectors), read by ``ner`` (TransitionBasedParser, hidden 64) and
``textcat`` (TextCatReduce, mean and max pooling). Words: CoNLL's own tokens, SST-2's text split on spaces (the data
is pre-tokenised).

Training (spaCy's defaults for everything this does not name): every epoch visits all of CoNLL train (14,041
sentences, entity annotation, no categories) and SST-2 train (67,349 phrases, categories, entities *missing*, not
"none"): ``ner`` learns nothing from a document without entity annotation, and ``textcat`` nothing from one
without categories (mask_missing_categories: spaCy's exclusive textcat would otherwise train such a document
towards no class at all, which breaks joint training); shuffled together with a fixed seed, in batches of 100
growing to 1,000 words (spaCy's default batcher), Adam at 0.001 with L2 0.01 and gradient clipping 1.0, dropout
0.1. Bound by --epochs. After each epoch the worker predicts the validation and test splits; this side scores them
with the project's metrics and reports the epoch with the best mean of CoNLL validation F1 and SST-2 validation
accuracy (the selection rule of the project's models: validation only). train_cpu_s counts the CPU seconds of the
updates up to that epoch, not the predictions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SPACY_PYTHON = HERE.parents[2] / "scratch" / "spacy-venv" / "bin" / "python"
SPACY_TASKS = {"conll2003": "validation_f1", "sst2": "validation_accuracy"}


# ---------------------------------------------------------------------------------------------- worker (spaCy's venv)


def to_iob2(doc) -> list[str]:
    """IOB2 tags of a spaCy Doc's entities, one per word."""
    tags = ["O"] * len(doc)
    for ent in doc.ents:
        tags[ent.start] = f"B-{ent.label_}"
        for i in range(ent.start + 1, ent.end):
            tags[i] = f"I-{ent.label_}"
    return tags


def build_examples(nlp, payload: dict) -> list:
    """spaCy Examples of both train sets: CoNLL with entities (all other words outside), SST-2 with categories."""
    from spacy.tokens import Doc, Span
    from spacy.training import Example
    from spacy_throughput import bio_spans

    examples = []
    for words, tags in payload["conll2003"]["train"]:
        reference = Doc(nlp.vocab, words=words)
        reference.ents = [Span(reference, s, e, label=label) for s, e, label in bio_spans(tags)]
        examples.append(Example(Doc(nlp.vocab, words=words), reference))
    labels = payload["sst2_labels"]
    for words, label in payload["sst2"]["train"]:
        reference = Doc(nlp.vocab, words=words)
        reference.cats = {name: float(name == label) for name in labels}
        examples.append(Example(Doc(nlp.vocab, words=words), reference))
    return examples


def predict(nlp, payload: dict, split: str) -> dict:
    """IOB2 tags of CoNLL ``split`` and labels of SST-2 ``split``."""
    from spacy.tokens import Doc

    conll = [Doc(nlp.vocab, words=words) for words, _ in payload["conll2003"][split]]
    sst2 = [Doc(nlp.vocab, words=words) for words, _ in payload["sst2"][split]]
    return {
        "conll2003": [to_iob2(doc) for doc in nlp.pipe(conll)],
        "sst2": [max(doc.cats, key=doc.cats.get) for doc in nlp.pipe(sst2)],
    }


def mask_missing_categories(nlp) -> None:
    """Make ``textcat`` learn nothing from a document without categories (a CoNLL sentence), as ``ner`` learns
    nothing from one without entities. spaCy's exclusive textcat has no missing values (its
    ``support_missing_values`` is False: a document without categories is trained towards "no class at all"), and
    trained jointly that way on CoNLL + SST-2 it stays at chance on SST-2 and drags NER to ~0.4 F1 (measured here);
    spaCy's own hook for this is that property, which a subclass overrides. The model and its predictions are the
    same component's."""
    from spacy.pipeline.textcat import TextCategorizer

    class MaskedTextCategorizer(TextCategorizer):
        @property
        def support_missing_values(self) -> bool:
            return True

    textcat = nlp.get_pipe("textcat")
    assert type(textcat) is TextCategorizer, type(textcat)
    textcat.__class__ = MaskedTextCategorizer


def worker(payload_path: str, out_path: str) -> None:
    """Train for the payload's epochs; after each, append one JSON line (the epoch, the CPU seconds of the updates so
    far, the losses and the validation and test predictions) to ``out_path``."""
    sys.path.insert(0, str(HERE.parent))  # benchmarks/spacy_throughput.py: the pipeline's one definition
    import spacy
    from spacy.training.batchers import minibatch_by_words
    from spacy_throughput import SPACY_CONFIG
    from thinc.api import Config, compounding, fix_random_seed

    payload = json.loads(Path(payload_path).read_text(encoding="utf-8"))
    seed = payload["seed"]
    fix_random_seed(seed)
    config = Config().from_str(SPACY_CONFIG.format(width=payload["width"], depth=payload["depth"]))
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    mask_missing_categories(nlp)
    examples = build_examples(nlp, payload)
    rng = random.Random(seed)
    sample = rng.sample(examples, min(len(examples), 2000))  # labels and shapes; both kinds are in 2,000
    optimizer = nlp.initialize(lambda: sample)
    train_cpu = train_wall = 0.0
    with open(out_path, "w", encoding="utf-8") as out:
        for epoch in range(1, payload["epochs"] + 1):
            rng.shuffle(examples)
            losses: dict[str, float] = {}
            cpu, wall = time.process_time(), time.perf_counter()
            batches = minibatch_by_words(examples, size=compounding(100.0, 1000.0, 1.001))
            for batch in batches:
                nlp.update(batch, drop=payload["dropout"], sgd=optimizer, losses=losses)
            train_cpu += time.process_time() - cpu
            train_wall += time.perf_counter() - wall
            line = {
                "epoch": epoch,
                "train_cpu_s": train_cpu,
                "train_wall_s": train_wall,
                "losses": {k: float(v) for k, v in losses.items()},
            }
            line["predictions"] = {split: predict(nlp, payload, split) for split in ("validation", "test")}
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(f"spaCy epoch {epoch}: {train_cpu:.0f} CPU-s, losses {losses}", file=sys.stderr, flush=True)
    info = {"spacy": spacy.__version__, "pipeline": nlp.pipe_names, "ner_labels": list(nlp.get_pipe("ner").labels)}
    Path(out_path + ".info").write_text(json.dumps(info), encoding="utf-8")


# ---------------------------------------------------------------------------------------------- this side


def payload_of(data_root: Path, args: argparse.Namespace) -> dict:
    """The words and labels of every split the worker needs (read and checked here, by the project's reader)."""
    from peer_common import conll2003, sst2

    data: dict = {"conll2003": {}, "sst2": {}}
    for split in ("train", "validation", "test"):
        tokens, tags = conll2003(data_root, split)
        texts, labels = sst2(data_root, split)
        limit = args.limit if split == "train" and args.limit else None
        data["conll2003"][split] = list(zip(tokens, tags, strict=True))[:limit]
        data["sst2"][split] = [(text.split(), label) for text, label in zip(texts, labels, strict=True)][:limit]
    sst2_labels = sorted({label for _, label in data["sst2"]["train"]})
    return {
        **data,
        "sst2_labels": sst2_labels,
        "seed": args.seed,
        "epochs": args.epochs,
        "width": args.width,
        "depth": args.depth,
        "dropout": args.dropout,
    }


def score_epoch(line: dict, payload: dict) -> dict:
    """The project's metrics on one epoch's predictions."""
    from peer_common import class_scores, entity_scores

    scores: dict = {}
    for split in ("validation", "test"):
        conll = entity_scores([t for _, t in payload["conll2003"][split]], line["predictions"][split]["conll2003"])
        gold = [label for _, label in payload["sst2"][split]]
        sst2 = class_scores(gold, line["predictions"][split]["sst2"], payload["sst2_labels"])
        scores[split] = {"conll2003": conll, "sst2": sst2}
    return scores


def run_worker(python: Path, payload: dict) -> tuple[list[dict], dict]:
    """Run the worker in spaCy's interpreter on ``payload``; its per-epoch lines and its info."""
    if not Path(python).exists():
        raise SystemExit(
            f"{python}: no spaCy interpreter; create one with\n  python -m venv {Path(python).parents[1]} && "
            f'{Path(python).parent}/pip install "spacy==3.8.*"\nor pass --spacy-python'
        )
    with tempfile.TemporaryDirectory(prefix="peers-spacy-") as folder:
        payload_path, out_path = Path(folder) / "payload.json", Path(folder) / "epochs.jsonl"
        payload_path.write_text(json.dumps(payload), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        done = subprocess.run([str(python), __file__, "--worker", str(payload_path), str(out_path)], env=env)
        if done.returncode != 0:
            raise SystemExit(f"the spaCy worker stopped (exit status {done.returncode})")
        lines = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines() if line]
        info = json.loads(Path(str(out_path) + ".info").read_text(encoding="utf-8"))
    return lines, info


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return 0
    from peer_common import RESULTS, default_data_root, run_facts, save_peer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=default_data_root(), help="folder with conll2003/, sst2/")
    parser.add_argument("--spacy-python", default=os.environ.get("SPACY_PYTHON", str(DEFAULT_SPACY_PYTHON)))
    parser.add_argument("--epochs", type=int, default=5, help="passes over both train sets (the training bound)")
    parser.add_argument("--width", type=int, default=96, help="tok2vec width (spaCy's default CNN: 96)")
    parser.add_argument("--depth", type=int, default=4, help="tok2vec depth (spaCy's default CNN: 4)")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="only the first N train lines of each (0: all; a smoke)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file to merge into")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")
    run = run_facts()
    payload = payload_of(args.data_root, args)
    lines, info = run_worker(Path(args.spacy_python), payload)
    epochs = [
        {
            "epoch": line["epoch"],
            "train_cpu_s": line["train_cpu_s"],
            "train_wall_s": line["train_wall_s"],
            "losses": line["losses"],
            **score_epoch(line, payload),
        }
        for line in lines
    ]
    best = max(epochs, key=lambda e: (e["validation"]["conll2003"]["f1"] + e["validation"]["sst2"]["accuracy"]) / 2)
    entry = {
        "description": f"spaCy {info['spacy']}, one pipeline: a shared CNN tok2vec (MultiHashEmbed NORM/PREFIX/"
        f"SUFFIX/SHAPE + MaxoutWindowEncoder, width {args.width}, depth {args.depth}, no vectors) -> ner "
        "(TransitionBasedParser) + textcat (TextCatReduce mean+max), trained from scratch on CoNLL-2003 + SST-2 "
        f"train together, {args.epochs} epochs, epoch chosen on validation",
        "source": "benchmarks/peers/spacy_pipeline.py",
        "conll2003": {
            "validation_f1": best["validation"]["conll2003"]["f1"],
            "test_f1": best["test"]["conll2003"]["f1"],
            "test_f1_strict": best["test"]["conll2003"]["f1_strict"],
        },
        "sst2": {
            "validation_accuracy": best["validation"]["sst2"]["accuracy"],
            "test_accuracy": best["test"]["sst2"]["accuracy"],
            "test_macro_f1": best["test"]["sst2"]["macro_f1"],
        },
        "train_cpu_s": best["train_cpu_s"],
        "train_wall_s": best["train_wall_s"],
        "threads": int(os.environ.get("OMP_NUM_THREADS", "1")),
        "selected_epoch": best["epoch"],
        "epochs": epochs,
        "settings": {k: payload[k] for k in ("seed", "epochs", "width", "depth", "dropout")} | {"limit": args.limit},
        "pipeline": info["pipeline"],
        "ner_labels": info["ner_labels"],
        "speed": "benchmarks/results/spacy_throughput.json (the same pipeline, untrained: speed does not depend on "
        "the weights)",
    }
    save_peer("spacy", entry, run, args.out)
    print(json.dumps({k: entry[k] for k in ("conll2003", "sst2", "train_cpu_s", "selected_epoch")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))  # peer_common.py beside this file
    sys.exit(main())
