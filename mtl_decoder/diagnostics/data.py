"""``debug-data``: what a config's task data holds, and what in it will hurt training, before training.

    mtl-decoder debug-data --config CFG [--json] [--max-overlap 0.05] [key=value ...]

Per task and split: examples, label distribution, sentence (word) and sub-word length percentiles, how many
examples ``data.max_length`` would truncate, invalid-IOB2 and unseen-label counts, unreadable records, repeats
within the split; per held-out split: overlap with train (exact and normalised, with examples) and the share of
entity strings never seen in train; and which tasks share files. The tokenizer is the one the config would build
(trained on the train split, as ``train`` does). Findings are ranked by how much they are likely to hurt; any
error-level finding makes the command exit 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtl_decoder.config import TAGGING, ExperimentConfig, TaskConfig
from mtl_decoder.data import iob
from mtl_decoder.data.tasks import Example, infer_labels
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.diagnostics.data_checks import data_findings
from mtl_decoder.diagnostics.defaults import MAX_MISLABELLED, MAX_OVERLAP
from mtl_decoder.diagnostics.findings import Finding, count, ranked
from mtl_decoder.diagnostics.overlap import overlap_with_train, repeats_within, shared_files, unseen_entities
from mtl_decoder.diagnostics.reading import SourceRead, read_all_splits, task_examples
from mtl_decoder.training.setup import make_recaser, make_tokenizer

GLOBAL_PREFIX = "@"
"""Top-level JSON keys that are not tasks start with this; task names cannot (letters, digits, _ and - only)."""
PERCENTILES = (50, 90, 95, 99)


@dataclass
class DataReport:
    tasks: dict[str, dict[str, Any]]
    """Task -> kind, label set, per-split statistics, overlap with train, unseen entity strings."""
    findings: list[Finding]
    """Ranked: errors, then warnings, then notes."""
    shared: list[dict[str, Any]]
    """Files read by more than one (task, split)."""
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return count(self.findings, "error")

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def to_json(self) -> dict[str, Any]:
        """One object: a key per task, and the global parts under '@'-prefixed keys no task name can take."""
        summary = {
            "ok": self.ok,
            "errors": self.errors,
            "warnings": count(self.findings, "warning"),
            "notes": count(self.findings, "info"),
            **self.settings,
        }
        return {
            **self.tasks,
            f"{GLOBAL_PREFIX}summary": summary,
            f"{GLOBAL_PREFIX}findings": [f.to_dict() for f in self.findings],
            f"{GLOBAL_PREFIX}shared_files": self.shared,
        }


def debug_data(
    config: ExperimentConfig,
    max_overlap: float = MAX_OVERLAP,
    max_mislabelled: float = MAX_MISLABELLED,
) -> DataReport:
    """Read and describe the data of a config's tasks.

    Read every split of ``config``'s tasks (counting problems instead of stopping), train the tokenizer as
    training would, and describe the data. ``max_overlap``: the share of a validation/test split that may repeat
    train exactly (same labels) before it is an error; ``max_mislabelled``: the share that may repeat train with
    other labels before it is an error (below it, a warning)."""
    reads, missing = read_all_splits(config.tasks)
    train_reads = [r for r in reads["train"] if r.error is None and r.source.examples]
    label_sets = {t.name: infer_labels(t, r.source.examples) for r in train_reads for t in r.source.tasks}
    encoder = _encoder(config, train_reads)
    tasks = {}
    for name, task in config.tasks.items():
        tasks[name] = describe_task(task, reads, label_sets.get(name), encoder, config.data.max_length)
    shared = shared_files(config.tasks)
    findings = data_findings(config, reads, tasks, missing, shared, max_overlap, max_mislabelled)
    settings = {
        "max_length": config.data.max_length,
        "repair_iob": config.data.repair_iob,
        "max_overlap": max_overlap,
        "max_mislabelled": max_mislabelled,
        "tokenizer": f"{_tokenizer_kind(config)}, {encoder.vocab_size} pieces" if encoder else None,
    }
    return DataReport(tasks, ranked(findings), shared, settings)


def _tokenizer_kind(config: ExperimentConfig) -> str:
    return "the pretrained trunk's" if config.model.trunk.enabled else config.tokenizer.kind


def _encoder(config: ExperimentConfig, train_reads: list[SourceRead]) -> TextEncoder | None:
    """The config's tokenizer without a length limit, or None.

    The config's tokenizer (trained on the readable train sources), with no length limit, so lengths are the
    untruncated ones; None when no train data could be read."""
    if not train_reads:
        return None
    sources = [r.source for r in train_reads]
    return TextEncoder.for_model(make_tokenizer(config, sources), config.model, 1 << 30, make_recaser(config, sources))


def describe_task(
    task: TaskConfig,
    reads: dict[str, list[SourceRead]],
    label_set: list[str] | None,
    encoder: TextEncoder | None,
    max_length: int,
) -> dict[str, Any]:
    """Kind, label set, per-split statistics, and for each held-out split its overlap with train."""
    out: dict[str, Any] = {"kind": task.kind, "labels": label_set, "splits": {}, "overlap": {}}
    if task.kind == TAGGING:
        out["unseen_entities"] = {}
    train_read, train = task_examples(reads["train"], task.name)
    for split, split_reads in reads.items():
        read, examples = task_examples(split_reads, task.name)
        if read is None:
            continue
        out["splits"][split] = split_stats(task, read, examples, label_set, encoder, max_length)
        if split == "train" or train_read is None or read.error is not None:
            continue
        out["overlap"][split] = overlap_with_train(train, examples, task.name, train_read.path, read.path).to_dict()
        if task.kind == TAGGING:
            out["unseen_entities"][split] = unseen_entities(train, examples, task.name)
    return out


def split_stats(
    task: TaskConfig,
    read: SourceRead,
    examples: list[Example],
    label_set: list[str] | None,
    encoder: TextEncoder | None,
    max_length: int,
) -> dict[str, Any]:
    """One task's statistics on one split."""
    stats: dict[str, Any] = {
        "source": read.path,
        "shared_with": [n for n in read.names if n != task.name],
        "examples": len(examples),
        "unreadable": read.error,
        "bad_records": read.bad_records,
        "bad_cases": [p.at(read.path) for p in read.bad_cases],
        "empty_lines": read.source.empty_lines,
        "invalid_iob": read.invalid_iob.get(task.name, 0),
        "invalid_iob_cases": [p.at(read.path) for p in read.iob_cases.get(task.name, [])],
    }
    stats.update(label_stats(task, examples, label_set, read.path))
    stats["words"] = percentiles([len(ex.words) if ex.words is not None else len(ex.text.split()) for ex in examples])
    if encoder is not None and examples:
        stats.update(length_stats(examples, encoder, max_length))
    stats["repeats"] = repeats_within(examples, task.name, read.path).to_dict(len(examples))
    return stats


def label_stats(task: TaskConfig, examples: list[Example], label_set: list[str] | None, path: str) -> dict[str, Any]:
    """Label distribution (entity mentions per type for tagging) and labels outside the train label set."""
    allowed = set(label_set) if label_set is not None else None
    unseen: dict[str, int] = {}
    cases: list[str] = []
    counts: dict[str, int] = {}
    out: dict[str, Any] = {}
    for ex in examples:
        value = ex.labels[task.name]
        values = value if isinstance(value, list) else [value]
        for v in values:
            if allowed is not None and v not in allowed:
                unseen[v] = unseen.get(v, 0) + 1
                if len(cases) < 5:
                    cases.append(f"{path}:{ex.line}: label '{v}'")
        if task.kind == TAGGING:
            for kind, _, _ in iob.entities(value):
                counts[kind] = counts.get(kind, 0) + 1
        else:
            counts[value] = counts.get(value, 0) + 1
    if task.kind == TAGGING:
        tags = [t for ex in examples for t in ex.labels[task.name]]
        out["entities"] = dict(sorted(counts.items()))
        out["outside_share"] = tags.count("O") / len(tags) if tags else 0.0
        out["without_entities"] = sum(all(t == "O" for t in ex.labels[task.name]) for ex in examples)
    else:
        order = label_set or sorted(counts)
        out["label_counts"] = {k: counts.get(k, 0) for k in order} | {k: v for k, v in counts.items() if k not in order}
    out["unseen_labels"] = unseen
    out["unseen_label_cases"] = cases
    return out


def length_stats(examples: list[Example], encoder: TextEncoder, max_length: int) -> dict[str, Any]:
    """Sub-word length percentiles (special tokens included, before truncation) and what max_length cuts."""
    items = [ex.words if ex.words is not None else ex.text for ex in examples]
    encoded = encoder.encode_batch(items)
    lengths = [len(e.ids) for e in encoded]
    words = sum(e.alignment.kept for e in encoded)  # the encoder has no length limit here: every word
    cut = [i for i, n in enumerate(lengths) if n > max_length]
    words_cut = 0
    if cut:
        limited = TextEncoder(encoder.tokenizer, max_length, encoder.words_as_text, encoder.word_token, encoder.recaser)
        kept = limited.encode_batch([items[i] for i in cut])
        words_cut = sum(k.alignment.truncated_words for k in kept)
    return {
        "subwords": percentiles(lengths),
        "truncated": len(cut),
        "truncated_share": len(cut) / len(examples),
        "words_cut": words_cut,
        "whitespace_led_words": sum(e.alignment.blank_led for e in encoded),
        "whitespace_led_share": sum(e.alignment.blank_led for e in encoded) / max(words, 1),
        "truncated_lines": [examples[i].line for i in cut[:5]],
    }


def percentiles(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    out = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    return {"mean": float(arr.mean()), **out, "max": float(arr.max())}
