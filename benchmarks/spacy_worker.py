"""spaCy's side of ``spacy_throughput.py``: the pipeline's definition (also the peer's,
``benchmarks/peers/spacy_pipeline.py``), the worker that times it inside spaCy's own virtual environment, and the
process handle that starts and asks it.

spaCy is not a dependency of this project, so this module imports it only inside the worker; the rest is standard
library, as is ``bench_timing.py``, which the worker uses from that environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_timing import REPO, read_sentences, timed

DEFAULT_SPACY_PYTHON = REPO.parent / "scratch" / "spacy-venv" / "bin" / "python"

SPACY_CONFIG = """
[nlp]
lang = "en"
pipeline = ["tok2vec", "ner", "textcat"]

[components]

[components.tok2vec]
factory = "tok2vec"

[components.tok2vec.model]
@architectures = "spacy.Tok2Vec.v2"

[components.tok2vec.model.embed]
@architectures = "spacy.MultiHashEmbed.v2"
width = {width}
attrs = ["NORM", "PREFIX", "SUFFIX", "SHAPE"]
rows = [5000, 1000, 2500, 2500]
include_static_vectors = false

[components.tok2vec.model.encode]
@architectures = "spacy.MaxoutWindowEncoder.v2"
width = {width}
depth = {depth}
window_size = 1
maxout_pieces = 3

[components.ner]
factory = "ner"

[components.ner.model]
@architectures = "spacy.TransitionBasedParser.v2"
state_type = "ner"
extra_state_tokens = false
hidden_width = 64
maxout_pieces = 2
use_upper = true

[components.ner.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = {width}
upstream = "*"

[components.textcat]
factory = "textcat"

[components.textcat.model]
@architectures = "spacy.TextCatReduce.v1"
exclusive_classes = true
use_reduce_first = false
use_reduce_last = false
use_reduce_max = true
use_reduce_mean = true

[components.textcat.model.tok2vec]
@architectures = "spacy.Tok2VecListener.v1"
width = {width}
upstream = "*"
"""


def bio_spans(tags: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, label) word spans of IOB/BIO tags."""
    spans, start, label = [], None, None
    for i, tag in enumerate([*tags, "O"]):
        if tag == "O" or tag.startswith("B-") or tag[2:] != label:
            if start is not None:
                spans.append((start, i, label))
            start, label = (i, tag[2:]) if tag != "O" else (None, None)
    return spans


def spacy_worker(options: dict) -> None:
    """Build the pipeline, say 'ready' (one JSON line), then time ``nlp.pipe`` over the sentences on every 'run'."""
    import spacy
    from spacy.tokens import Doc
    from spacy.training import Example
    from thinc.api import Config

    config = Config().from_str(SPACY_CONFIG.format(width=options["width"], depth=options["depth"]))
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    data_root = Path(options["data_root"])
    with open(data_root / "conll2003" / "test.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    examples = []
    for k, record in enumerate(records[:50]):
        reference = Doc(nlp.vocab, words=record["tokens"])
        reference.ents = [
            spacy.tokens.Span(reference, s, e, label=label) for s, e, label in bio_spans(record["ner_tags"])
        ]
        reference.cats = {"positive": float(k % 2), "negative": float(1 - k % 2)}
        examples.append(Example(Doc(nlp.vocab, words=record["tokens"]), reference))
    nlp.initialize(lambda: examples)
    items = read_sentences(data_root, options["sentences"])

    def run(sentences: list[list[str]]) -> int:
        docs = list(nlp.pipe(Doc(nlp.vocab, words=words) for words in sentences))
        assert all(d.cats for d in docs)
        return sum(len(d) for d in docs)

    run(items[:300])  # warm-up
    macs = 0  # multiply-adds per token, from the weight shapes of every layer that multiplies (not the lookups)
    for name in nlp.pipe_names:
        for node in nlp.get_pipe(name).model.walk():
            if node.has_param("W") and node.name != "hashembed":
                macs += int(node.get_param("W").size)
    info = {
        "ready": True,
        "spacy": spacy.__version__,
        "pipeline": nlp.pipe_names,
        "ner_moves": nlp.get_pipe("ner").moves.n_moves,
        "textcat_labels": list(nlp.get_pipe("textcat").labels),
        "mflop_per_word_estimate": round(2 * macs / 1e6, 2),
        "blas": _blas_threads(),
    }
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(json.dumps(timed(lambda: run(items))), flush=True)


def _blas_threads() -> list[dict]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: pool.get(k) for k in ("internal_api", "num_threads")} for pool in threadpool_info()]


class SpacyProcess:
    """The spaCy worker, started from spaCy's own virtual environment."""

    def __init__(self, python: Path, options: dict):
        if not Path(python).exists():
            raise SystemExit(
                f"{python}: no spaCy interpreter; create one with\n  python -m venv {Path(python).parents[1]} && "
                f'{Path(python).parent}/pip install "spacy==3.8.*"\nor pass --spacy-python'
            )
        self.proc = subprocess.Popen(
            [str(python), __file__, "--spacy-worker", json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the spaCy worker stopped (exit status {self.proc.wait()})")
        return json.loads(line)

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


if __name__ == "__main__":  # the worker, started by SpacyProcess from spaCy's interpreter
    if len(sys.argv) > 2 and sys.argv[1] == "--spacy-worker":
        spacy_worker(json.loads(sys.argv[2]))
