"""The findings of ``debug-data``.

The statistics of ``diagnostics.data`` turned into ranked errors, warnings and
notes. Each rule is one small function; ``harm`` is the share of the data concerned, weighted by how directly the
problem reaches the model's training signal or its scores.

| code                 | severity                     | why it hurts                                            |
| -------------------- | ---------------------------- | ------------------------------------------------------- |
| source_unreadable    | error                        | training stops on it                                    |
| missing_split        | error (validation), info     | training needs validation; evaluate needs test          |
| bad_records          | error                        | training stops at the first                             |
| invalid_iob          | error (info with repair_iob) | training stops unless data.repair_iob=true              |
| unseen_labels        | error                        | training/evaluate stop: a label the heads do not have   |
| overlap_mislabelled  | error above --max-mislabelled| the model is scored against labels train contradicts    |
| overlap_exact        | error above --max-overlap    | held-out scores measure memory, not generalisation      |
| overlap_normalised   | warning                      | near-copies inflate held-out scores                     |
| conflicting_repeats  | warning                      | the same input with two labels in one split: noise      |
| truncation           | warning (info under 1%)      | words past max_length train without labels              |
| whitespace_pieces    | info                         | words led by a lone space piece are read past it        |
| label_imbalance      | warning                      | a class the model rarely or never sees                  |
| rare_entity_type     | warning                      | too few mentions to learn the type                      |
| shared_file_leak     | warning                      | one task's train file is another's held-out file        |
| repeats              | info                         | repeated inputs weigh more than others                  |
| unseen_entities      | info                         | most held-out entities must be recognised from context  |
| small_split          | info                         | selection on few examples is noisy                      |
"""

from __future__ import annotations

from typing import Any

from mtl_decoder.config import TAGGING, ExperimentConfig
from mtl_decoder.diagnostics.findings import Finding
from mtl_decoder.diagnostics.reading import SourceRead

RARE_ENTITY_MENTIONS = 10
MINORITY_SHARE = 0.02
MAJORITY_SHARE = 0.9
SMALL_SPLIT = 100


def data_findings(
    config: ExperimentConfig,
    reads: dict[str, list[SourceRead]],
    tasks: dict[str, dict[str, Any]],
    missing: list[tuple[str, str]],
    shared: list[dict[str, Any]],
    max_overlap: float,
    max_mislabelled: float,
) -> list[Finding]:
    """Every rule over every task and split (unranked)."""
    out = [f for split_reads in reads.values() for r in split_reads for f in source_findings(r)]
    out += [missing_split(task, split) for task, split in missing]
    for name, described in tasks.items():
        for split, stats in described["splits"].items():
            where = f"{name}/{split}"
            out += record_findings(where, stats, config.data.repair_iob)
            out += label_findings(where, split, stats, described["kind"])
            out += length_findings(where, stats, config.data.max_length)
            out += whitespace_findings(where, stats)
            out += repeat_findings(where, split, stats)
        for split, overlap in described["overlap"].items():
            out += overlap_findings(f"{name}/{split}", overlap, max_overlap, max_mislabelled)
        for split, unseen in described.get("unseen_entities", {}).items():
            if unseen["mentions"] and unseen["unseen_share"] > 0.5:
                share = unseen["unseen_share"]
                msg = (
                    f"{share:.0%} of the {unseen['mentions']} entity mentions never occur as an entity in train: "
                    "they must be recognised from context and spelling (char_embedding, word_features help)"
                )
                out.append(Finding("info", "unseen_entities", msg, f"{name}/{split}", share * 0.3, unseen["cases"]))
    out += shared_file_findings(shared)
    return out


def source_findings(read: SourceRead) -> list[Finding]:
    if read.error is None:
        return []
    tasks = ", ".join(read.names)
    return [Finding("error", "source_unreadable", read.error, f"{tasks}/{read.split}", 1.0)]


def missing_split(task: str, split: str) -> Finding:
    if split == "validation":
        msg = f"no validation data: training needs it for selection (set tasks.{task}.data.validation)"
        return Finding("error", "missing_split", msg, f"{task}/{split}", 1.0)
    if split == "test":
        msg = f"no test data: evaluate --split test will need --data {task}=PATH"
        return Finding("info", "missing_split", msg, f"{task}/{split}", 0.1)
    return Finding("error", "missing_split", f"no {split} data", f"{task}/{split}", 1.0)


def record_findings(where: str, stats: dict[str, Any], repair_iob: bool) -> list[Finding]:
    out = []
    n = stats["examples"]
    if stats["bad_records"]:
        bad = stats["bad_records"]
        msg = f"{bad} record(s) cannot be read; training stops at the first"
        out.append(Finding("error", "bad_records", msg, where, 0.5 + 0.5 * bad / (bad + n), stats["bad_cases"]))
    if stats["unreadable"] is None and n == 0 and not stats["bad_records"]:
        out.append(Finding("error", "empty_split", "no examples for this task", where, 1.0))
    invalid = stats["invalid_iob"]
    if invalid:
        share = invalid / max(n, 1)
        if repair_iob:
            msg = f"{invalid} example(s) ({share:.1%}) break IOB2; data.repair_iob=true repairs them (I-X -> B-X)"
            out.append(Finding("info", "invalid_iob", msg, where, share * 0.2, stats["invalid_iob_cases"]))
        else:
            msg = (
                f"{invalid} example(s) ({share:.1%}) break IOB2 (an I-X with no B-X/I-X before it); training stops "
                "at the first: fix the file or set data.repair_iob=true"
            )
            out.append(Finding("error", "invalid_iob", msg, where, 0.5 + 0.5 * share, stats["invalid_iob_cases"]))
    return out


def label_findings(where: str, split: str, stats: dict[str, Any], kind: str) -> list[Finding]:
    out = []
    unseen = stats["unseen_labels"]
    if unseen:
        labels = ", ".join(f"'{k}' x{v}" for k, v in sorted(unseen.items(), key=lambda kv: -kv[1]))
        whose = "the task's labels list" if split == "train" else "the train label set"
        msg = f"labels not in {whose}: {labels}; training and evaluate stop on them"
        out.append(Finding("error", "unseen_labels", msg, where, 0.8, stats["unseen_label_cases"]))
    if kind == TAGGING:
        if split == "train":
            for kind_name, mentions in stats["entities"].items():
                if mentions < RARE_ENTITY_MENTIONS:
                    msg = f"entity type {kind_name} has only {mentions} mention(s) in train: too few to learn it"
                    out.append(Finding("warning", "rare_entity_type", msg, where, 0.3))
        return out
    counts = stats["label_counts"]
    total = sum(counts.values())
    if not total:
        return out
    for label, n in counts.items():
        if split == "train" and n / total < MINORITY_SHARE:
            msg = f"class '{label}' has {n} of {total} train examples ({n / total:.1%}): rarely learned or predicted"
            out.append(Finding("warning", "label_imbalance", msg, where, 0.4 * (1 - n / total)))
    top, top_n = max(counts.items(), key=lambda kv: kv[1])
    if split == "train" and top_n / total > MAJORITY_SHARE:
        msg = f"class '{top}' is {top_n / total:.0%} of train: accuracy rewards always predicting it"
        out.append(Finding("warning", "label_imbalance", msg, where, 0.4 * top_n / total))
    return out


def length_findings(where: str, stats: dict[str, Any], max_length: int) -> list[Finding]:
    cut = stats.get("truncated", 0)
    if not cut:
        return []
    share = stats["truncated_share"]
    p99 = stats["subwords"]["p99"]
    msg = (
        f"{cut} example(s) ({share:.1%}) are longer than data.max_length={max_length} sub-words "
        f"({stats['words_cut']} words cut; p99 length {p99:.0f}): raise data.max_length or accept the loss"
    )
    lines = [f"{stats['source']}:{line}" for line in stats["truncated_lines"]]
    return [Finding("warning" if share >= 0.01 else "info", "truncation", msg, where, share, lines)]


def whitespace_findings(where: str, stats: dict[str, Any]) -> list[Finding]:
    """Findings on words whose first sub-word is a lone whitespace piece.

    Words whose first sub-word is a lone whitespace piece (byte-level BPE's 'Ġ' before a number, a SentencePiece
    '▁'): never read (data/alignment.py), but the share says how much 'first' sub-word reading depends on it."""
    led = stats.get("whitespace_led_words", 0)
    if not led:
        return []
    msg = (
        f"{led} word(s) ({stats['whitespace_led_share']:.1%}) start with a lone whitespace piece (e.g. 'Ġ' before a "
        "number): their tags are read from the word's first real piece (model.word_token=first) or its last "
        "(last; auto under causal attention)"
    )
    return [Finding("info", "whitespace_pieces", msg, where, 0.0)]


def repeat_findings(where: str, split: str, stats: dict[str, Any]) -> list[Finding]:
    rep, n = stats["repeats"], stats["examples"]
    out = []
    if rep["conflicting_labels"]:
        c = rep["conflicting_labels"]
        msg = f"{c} input(s) occur again in this split with other labels (label noise the model cannot fit)"
        out.append(Finding("warning", "conflicting_repeats", msg, where, 0.3 + c / max(n, 1), rep["cases"]))
    if rep["duplicates"]:
        msg = f"{rep['duplicates']} example(s) ({rep['share']:.1%}) repeat an earlier one of the {split} split"
        out.append(Finding("info", "repeats", msg, where, rep["share"] * 0.3, rep["cases"]))
    if split != "train" and 0 < n < SMALL_SPLIT:
        msg = f"only {n} examples: a score on them moves by about {100 * 0.5 / n**0.5:.0f} points by chance"
        out.append(Finding("info", "small_split", msg, where, 0.1))
    return out


def overlap_findings(where: str, overlap: dict[str, Any], max_overlap: float, max_mislabelled: float) -> list[Finding]:
    out = []
    n = overlap["examples"]
    wrong = overlap["exact_other_labels"]
    if wrong:
        share = wrong / n
        msg = (
            f"{wrong} example(s) ({share:.1%}, limit --max-mislabelled {max_mislabelled:.0%}) repeat a train input "
            "with OTHER labels: one copy is mislabelled, and the model is scored against the label train contradicts"
        )
        severity = "error" if share > max_mislabelled else "warning"
        cases = overlap["other_label_cases"]
        out.append(Finding(severity, "overlap_mislabelled", msg, where, 0.6 + 0.4 * share, cases))
    same = overlap["exact"] - wrong
    if same:
        share = same / n
        severity = "error" if share > max_overlap else "warning"
        msg = (
            f"{same} example(s) ({share:.1%}) repeat a train input exactly (limit --max-overlap {max_overlap:.0%}): "
            "held-out scores partly measure memory"
        )
        out.append(Finding(severity, "overlap_exact", msg, where, share, overlap["exact_cases"]))
    if overlap["normalised_only"]:
        share = overlap["normalised_share"]
        msg = (
            f"{overlap['normalised_only']} more example(s) ({share:.1%}) repeat a train input up to case, "
            "punctuation and spacing"
        )
        sev = "warning" if share >= 0.01 else "info"
        out.append(Finding(sev, "overlap_normalised", msg, where, share * 0.8, overlap["normalised_cases"]))
    return out


def shared_file_findings(shared: list[dict[str, Any]]) -> list[Finding]:
    out = []
    for group in shared:
        readers = group["read_by"]
        owners = {r.split("/")[0] for r in readers}
        if group["leak"] and len(owners) > 1:
            msg = (
                f"{group['file']} is train data for one task and held-out data for another ({', '.join(readers)}): "
                "the shared trunk has seen the held-out inputs"
            )
            out.append(Finding("warning", "shared_file_leak", msg, ", ".join(readers), 0.5))
        elif len(owners) > 1:
            msg = f"read by {', '.join(readers)}: one example per record carries every task's labels"
            out.append(Finding("info", "shared_file", msg, group["file"], 0.0))
    return out
