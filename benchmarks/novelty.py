"""Where CoNLL-2003's validation-to-test drop comes from: entity F1 on entities seen and unseen in training, by type,
and on the hard slices (all-caps lines, number-heavy lines, one-word lines), for the feature-CRF peer and any saved
models, with the scorer ``mtl-decoder evaluate`` uses (mtl_decoder/evaluation/novelty.py).

    pip install -e '.[peers]'                                   # the CRF peer (sklearn-crfsuite)
    python benchmarks/novelty.py                                # the CRF peer alone
    python benchmarks/novelty.py --model hybrid=runs/hybrid/best --model frozen=runs/frozen/best --no-crf
    python benchmarks/novelty.py --no-crf --transfer ../shared/data/unlabelled/news.txt   # names a transfer set holds

A model's CoNLL task is the one of its tagging tasks whose train file is CoNLL-2003's (``--task`` names it
otherwise); it is evaluated through ``evaluate(..., data=..., train_data=...)`` on ``--data-root``'s files. Entries
merge into benchmarks/results/novelty.json by name; ``report`` renders the table docs/benchmarks.md shows.
``--transfer`` counts, per split, the gold entities unseen in training whose words occur in a row in the given text
files (one text per line, words split on white space): the names a distilled student could meet in its transfer set
(``transfer_coverage`` in the results).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "peers"))  # crf.py and peer_common.py

from peer_common import conll2003, default_data_root, run_facts  # noqa: E402

from mtl_decoder.evaluation.metrics import tagging_metrics  # noqa: E402
from mtl_decoder.evaluation.novelty import (  # noqa: E402
    mentions,
    seen_surfaces,
    seen_unseen_metrics,
    slice_metrics,
    surface,
)
from mtl_decoder.files import atomic_write_text  # noqa: E402

RESULTS = HERE / "results" / "novelty.json"
SPLITS = ("validation", "test")


def analyse(words: list[list[str]], gold: list[list[str]], pred: list[list[str]], seen: set[str]) -> dict[str, Any]:
    """Overall F1, seen/unseen F1 (overall and per type) and the slices of one split's predictions."""
    return {
        "f1": tagging_metrics(gold, pred)["f1"],
        "novelty": seen_unseen_metrics(words, gold, pred, seen),
        "slices": slice_metrics(words, gold, pred),
    }


def crf_entry(root: Path, iterations: int, seen: set[str]) -> dict[str, Any]:
    import sklearn_crfsuite
    from crf import sentence_features

    words, tags = conll2003(root, "train")
    crf = sklearn_crfsuite.CRF(
        algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=iterations, all_possible_transitions=True
    )
    crf.fit([sentence_features(w) for w in words], tags)
    out: dict[str, Any] = {"description": f"feature CRF peer (benchmarks/peers/crf.py, {iterations} iterations)"}
    for split in SPLITS:
        w, g = conll2003(root, split)
        out[split] = analyse(w, g, [list(p) for p in crf.predict([sentence_features(s) for s in w])], seen)
    return out


def model_entry(folder: Path, root: Path, task: str | None) -> dict[str, Any]:
    from mtl_decoder.evaluation.evaluate import evaluate

    train = root / "conll2003" / "train.jsonl"
    task = task or _conll_task(folder)
    out: dict[str, Any] = {"description": f"saved model {folder}", "task": task}
    for split in SPLITS:
        data = {task: root / "conll2003" / f"{split}.jsonl"}
        result = evaluate(folder, split="test", tasks=[task], data=data, train_data={task: train},
                          output_dir=HERE / "runs" / "novelty" / folder.parent.name / split)  # fmt: skip
        analysis = result.metrics["analysis"][task]
        out[split] = {"f1": result.tasks[task]["f1"], **analysis}
    return out


def transfer_coverage(root: Path, seen: set[str], files: list[Path]) -> dict[str, Any]:
    """Per split: how many gold entities unseen in training occur, as a run of whole words, in ``files``."""
    # one text per line, lines kept apart (" \n "), so no name is found across two texts
    lines = [" ".join(line.split()) for f in files for line in f.read_text(encoding="utf-8").splitlines()]
    text = " " + " \n ".join(lines) + " "
    out: dict[str, Any] = {"files": [f.name for f in files]}
    for split in SPLITS:
        words, tags = conll2003(root, split)
        unseen = [surface(w, m) for w, t in zip(words, tags, strict=True) for m in mentions(t)]
        unseen = [name for name in unseen if name not in seen]
        found = sum(f" {name} " in text for name in unseen)
        out[split] = {"unseen": len(unseen), "in_transfer": found, "share": found / len(unseen) if unseen else 0.0}
    return out


def _conll_task(folder: Path) -> str:
    import yaml

    config = yaml.safe_load((folder / "config.yaml").read_text())
    for task in config["tasks"]:
        if task.get("kind") == "token_tagging" and "conll2003" in str(task.get("data", {}).get("train", "")):
            return task["name"]
    raise SystemExit(f"{folder}: no tagging task reads CoNLL-2003; name it with --task")


def report(results: dict[str, Any]) -> str:
    """The markdown table: per model and split, F1 overall, on seen and unseen entities, the unseen share and the
    slices' F1."""
    head = "| model | split | F1 | seen F1 | unseen F1 | unseen share | all-caps F1 | number-heavy F1 | one-word F1 |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, entry in results["entries"].items():
        for split in SPLITS:
            s = entry[split]
            n, sl = s["novelty"], s["slices"]
            cells = [f"{s['f1']:.3f}", f"{n['seen']['f1']:.3f}", f"{n['unseen']['f1']:.3f}", f"{n['unseen_share']:.0%}"]
            cells += [f"{sl[k]['f1']:.3f}" if k in sl else "–" for k in ("all_caps", "number_heavy", "one_word")]
            lines.append(f"| {name} | {split} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, default=default_data_root(), help="folder with conll2003/")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR", help="a saved model; repeatable")
    parser.add_argument("--task", help="the models' CoNLL task name (default: found in each config)")
    parser.add_argument("--iterations", type=int, default=100, help="the CRF's L-BFGS iterations")
    parser.add_argument("--no-crf", action="store_true", help="leave the CRF peer out")
    parser.add_argument("--transfer", type=Path, action="append", default=[], metavar="FILE",
                        help="a transfer-set text file (repeatable): count the unseen entities it holds")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    words, tags = conll2003(args.data_root, "train")
    seen = seen_surfaces(zip(words, tags, strict=True))
    entries: dict[str, Any] = {}
    if not args.no_crf:
        entries["CRF peer"] = crf_entry(args.data_root, args.iterations, seen)
    for spec in args.model:
        name, _, folder = spec.partition("=")
        entries[name] = model_entry(Path(folder), args.data_root, args.task)
    for entry in entries.values():
        entry["run"] = run_facts()
    # read just before writing: another novelty.py may have added entries while this one evaluated
    results = json.loads(args.out.read_text()) if args.out.exists() else {"entries": {}}
    results["entries"].update(entries)
    if args.transfer:
        results["transfer_coverage"] = transfer_coverage(args.data_root, seen, args.transfer)
        print(json.dumps(results["transfer_coverage"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(results, indent=2) + "\n")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
