"""The model card (README.md) written into every saved model folder.

What the model is, what it was trained and
selected on, how well it did, and what it is not for. Built from what the folder holds (the resolved config, the
label sets, the pretrained trunk's identity, info.json), so it never disagrees with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtl_decoder.config import TAGGING, ExperimentConfig
from mtl_decoder.model.trunks import trunk_for

MODEL_CARD_FILE = "README.md"

BENCHMARK_DATA = {
    "conll2003": "CoNLL-2003 (Reuters RCV1 text: research use under the NIST/Reuters agreement; Tjong Kim Sang & "
    "De Meulder, 2003)",
    "sst2": "SST-2 (research use, no explicit licence; Socher et al., 2013; Wang et al., 2018)",
    "semeval14": "SemEval-2014 task 4 restaurants (research use; Pontiki et al., 2014)",
}
"""Data sets this project benchmarks on, recognised by a task's data paths or hub id, and their terms."""

SPLIT_COUNT = {TAGGING: "sentences"}
"""The validation metric that counts a task's examples (classification: 'support')."""


def model_card(
    config: ExperimentConfig,
    label_sets: dict[str, list[str]],
    identity: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    parameters: int | None = None,
) -> str:
    """The card's Markdown (with a small metadata header, as model hubs read it)."""
    info = info or {}
    lines = _front_matter(config, identity)
    name = Path(config.training.output_dir).name or "model"
    lines += [
        f"# {name}: a multi-task model ({', '.join(config.tasks)})",
        "",
        f"Trained with mtl-decoder: one shared trunk with a `{config.model.ffn}` expert/gate block in every layer "
        f"and a head per task. Load it with `mtl_decoder.saved.load_model(FOLDER)`, or use it from the command line:",
        "",
        "```",
        "mtl-decoder predict --model FOLDER --input FILE --output OUT.jsonl",
        "mtl-decoder evaluate --model FOLDER --split test",
        "```",
        "",
        "## Base model",
        "",
        *_base_model(config, identity, parameters),
        "",
        "## Tasks and labels",
        "",
        "| task | kind | labels | primary metric |",
        "| --- | --- | --- | --- |",
    ]
    for task_name, task in config.tasks.items():
        labels = label_sets.get(task_name, [])
        shown = ", ".join(labels[:12]) + (f", ... ({len(labels)} in all)" if len(labels) > 12 else "")
        lines.append(f"| {task_name} | {task.kind} | {shown} | {task.primary_metric} |")
    if info.get("teacher"):
        lines += ["", "## Distilled from", "", *_teacher(info["teacher"])]
    lines += ["", "## Data", "", *_data(config, info), "", "## Validation metrics", "", *_metrics(config, info)]
    lines += ["", "## Configuration", "", *_configuration(config), "", "## Intended use and limits", ""]
    lines += _limits(config, identity)
    return "\n".join(lines) + "\n"


def _front_matter(config: ExperimentConfig, identity: dict[str, Any] | None) -> list[str]:
    kinds = {t.kind for t in config.tasks.values()}
    tags = ["mtl-decoder", "multi-task"]
    tags += ["token-classification"] if TAGGING in kinds else []
    tags += ["text-classification"] if kinds - {TAGGING} else []
    lines = ["---", "library_name: mtl-decoder", "tags:", *[f"- {t}" for t in tags]]
    source = str((identity or {}).get("source") or "")
    if source and _is_hub_id(source):
        lines.append(f"base_model: {source}")
    return [*lines, "---", ""]


def _is_hub_id(source: str) -> bool:
    return not source.startswith(("/", ".", "~")) and not source.lower().endswith(".gguf") and source.count("/") <= 1


def _base_model(config: ExperimentConfig, identity: dict[str, Any] | None, parameters: int | None) -> list[str]:
    trained = f" ({parameters:,} trained parameters)" if parameters else ""
    return trunk_for(config.model).card_lines(config, identity, trained)


def _data(config: ExperimentConfig, info: dict[str, Any]) -> list[str]:
    train_counts = {}
    for entry in (info.get("data") or {}).get("train", []):
        for task in entry.get("tasks", []):
            train_counts[task] = entry.get("examples")
    validation = info.get("validation") or {}
    lines = ["| task | split | source | examples |", "| --- | --- | --- | --- |"]
    for name, task in config.tasks.items():
        data = task.data
        hub = f"hub dataset `{data.hub_id}`" + (f" ({data.hub_config})" if data.hub_config else "") + ", split "
        for split in ("train", "validation", "test"):
            where = getattr(data, split)
            if where is None:
                continue
            count: Any = "not counted here"
            if split == "train" and name in train_counts:
                count = f"{train_counts[name]:,}"
            elif split == "validation" and name in validation:
                counted = validation[name].get(SPLIT_COUNT.get(task.kind, "support"))
                count = f"{counted:,}" if isinstance(counted, int) else count
            elif split == "test":
                count = "not used in training or selection"
            source = f"{hub}`{where}`" if data.hub_id else f"`{where}`"
            lines.append(f"| {name} | {split} | {source} | {count} |")
    return lines


def _teacher(teacher: dict[str, Any]) -> list[str]:
    """A distilled student's teacher (``mtl-decoder distill``): where it was, its fingerprint, the loss mix."""
    unlabelled = teacher.get("unlabelled") or {}
    transfer = ", ".join(f"`{path}` ({n:,} texts)" for path, n in unlabelled.items()) or "none"
    kind = "soft targets" if teacher.get("soft", True) else "hard labels"
    return [
        f"- teacher: `{teacher.get('folder')}` (fingerprint `{teacher.get('fingerprint')}`), labelling in "
        f"{teacher.get('precision', 'fp32')}",
        f"- trained on the teacher's {kind} at temperature {teacher.get('temperature')}, mixed with the gold "
        f"labels (alpha {teacher.get('alpha')} on the teacher's term)",
        f"- unlabelled transfer texts: {transfer}",
        *_lexicon(teacher.get("lexicon")),
        *_states(teacher.get("states"), "word states (its tagging heads' inputs"),
        *_states(teacher.get("sentence_states"), "sentence states (its classification heads' pooled inputs"),
    ]


def _states(record: dict[str, Any] | None, what: str) -> list[str]:
    """The teacher's states as a second target (distill.state_weight, sentence_state_weight; distill/states.py)."""
    if not record:
        return []
    return [
        f"- the teacher's {what}, {record.get('teacher_width')} wide) as a second "
        f"target of weight {record.get('weight')}, on a fixed PCA to {record.get('width')} "
        f"({record.get('explained_variance', 0):.1%} of their variance): learned into the weights, nothing kept",
    ]


def _lexicon(record: dict[str, Any] | None) -> list[str]:
    """What a student inherited of its teacher's lexicon (model.lexicon; the run folder's lexicon.json)."""
    if not record:
        return []
    explained = record.get("explained_variance")
    share = f", {explained:.1%} of its variance kept" if isinstance(explained, float) else ""
    steps = record.get("freeze_steps")
    held = {-1: "frozen for the whole run", 0: "fine-tuned from the first step"}.get(
        steps, f"held for {steps} steps, then fine-tuned"
    )
    if record.get("projection") == "learned":  # the rows stay the teacher's; what trains is their projection
        held = f"the teacher's rows kept whole and frozen, their projection {held} and folded into the saved table"
    return [
        f"- lexicon ({record.get('source')}): the teacher's tokenizer, and the token-embedding table started as "
        f"{record.get('rows')} rows of `{record.get('read')}` ({record.get('teacher_width')} wide), projection "
        f"{record.get('projection')} to {record.get('width')}{share}, scaled to root mean square "
        f"{record.get('rms')}; {held} (table sha256 `{record.get('table_sha256')}`)",
    ]


def _metrics(config: ExperimentConfig, info: dict[str, Any]) -> list[str]:
    validation = info.get("validation")
    if not validation:
        return ["No validation metrics were saved with this model (no info.json)."]
    step, score = info.get("step"), info.get("score")
    lines = [
        f"On the validation splits at step {step} (selection score {score:.4f}: the weighted mean of the tasks' "
        "primary metrics). The model was chosen on these splits, so they are an optimistic estimate: report test "
        "metrics from `mtl-decoder evaluate --split test`.",
        "",
        "| task | metric | value |",
        "| --- | --- | --- |",
    ]
    for name, metrics in validation.items():
        for key, value in metrics.items():
            if isinstance(value, float):
                lines.append(f"| {name} | {key} | {value:.4f} |")
    return lines


def _configuration(config: ExperimentConfig) -> list[str]:
    m, t, d = config.model, config.training, config.data
    experts = (
        f"{m.n_shared_experts} shared + {m.n_task_experts} per task, initial shared weight {m.initial_shared_weight}"
        if m.ffn != "mlp"
        else "none (hard sharing)"
    )
    steps = f"{t.max_steps:,} steps" if t.max_steps else f"{t.epochs} epochs"
    return [
        f"- model.ffn {m.ffn}; experts per expert block: {experts}; tagging decoder {m.tagging_decoder}; "
        f"dropout {m.dropout}",
        f"- data: max_length {d.max_length} sub-words, batch size {d.batch_size}, sampling {d.sampling}",
        f"- training: {steps}, lr {t.lr}, schedule {t.schedule} (warmup {t.warmup_ratio}), weight decay "
        f"{t.weight_decay}, precision {t.mixed_precision}, seed {t.seed}",
        f"- loss balancing: {config.balancing.method}",
        *_all_caps(m.all_caps),
        "- the whole resolved configuration: config.yaml in this folder",
    ]


def _all_caps(mode: str) -> list[str]:
    """How the model reads headlines (model.all_caps), when not as they are."""
    if mode == "keep":
        return []
    shown = {"truecase": "in each word's usual case from the training texts (truecase.json)", "title": "title-cased",
             "lower": "lower-cased"}[mode]  # fmt: skip
    return [f"- all-caps lines (headlines) reach the tokenizer {shown}; outputs keep the line's own words"]


def _limits(config: ExperimentConfig, identity: dict[str, Any] | None) -> list[str]:
    paths = " ".join(
        f"{t.data.hub_id or ''} {t.data.train or ''} {t.name}".lower().replace("-", "") for t in config.tasks.values()
    )
    benchmark = [text for key, text in BENCHMARK_DATA.items() if key in paths]
    kinds = {t.kind for t in config.tasks.values()}
    jobs = " and ".join(["entity tagging"] * (TAGGING in kinds) + ["sentence classification"] * bool(kinds - {TAGGING}))
    lines = [
        f"- Intended use: research and prototyping of {jobs} on text like the training data (its language, domain "
        "and label definitions).",
    ]
    if benchmark:
        lines.append(
            "- Research use only: trained on benchmark data distributed for research ("
            + "; ".join(benchmark)
            + "). A model trained on it inherits those terms."
        )
    else:
        lines.append("- The terms of use of the training data apply to the model: check them before any use.")
    if identity is not None:
        lines.append(
            f"- The pretrained trunk (`{identity.get('source')}`) brings its own licence, biases and training data: "
            "read its model card."
        )
    lines += [
        "- Not evaluated on: other domains, genres or languages; inputs longer than "
        f"{config.data.max_length} sub-words (tagging runs in windows, classification reads the first window only); "
        "noisy or adversarial text; fairness or bias across groups of people. Class probabilities are softmax "
        "outputs, not calibrated.",
        "- Not for decisions about people, or any use where an error has serious consequences, without an "
        "evaluation of its own on the data it will meet.",
    ]
    return lines
