"""A frozen trunk at inference: memory bounded, the shared cache folder untouched unless asked, states keyed by how
they were computed (never a bf16-autocast or int8 state served to fp32) and by the checkpoint's config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import tiny_checkpoint
from trunk_runs import batch, trained

from mtl_decoder.cli import main
from mtl_decoder.data.tasks import load_split
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.inference import Predictor
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained import frozen, state_cache
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.prediction import predict_texts
from mtl_decoder.saved import load_model

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
WORDS = [
    "the",
    "EU",
    "rejects",
    "German",
    "call",
    "to",
    "boycott",
    "British",
    "lamb",
    "Peter",
    "went",
    "home",
    "rain",
    "fell",
    "on",
    "Monday",
]


def _texts(n: int) -> list[str]:
    """``n`` distinct short texts (word i, then the words of i's digits in base 16)."""
    return [" ".join([WORDS[i % len(WORDS)]] + [WORDS[int(d, 16)] for d in f"{i:x}"]) for i in range(n)]


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("inference-cache"), "frozen")


def test_predicting_many_records_keeps_memory_bounded_and_the_folder_untouched(run, tmp_path, monkeypatch):
    folder = run.run_dir.parent / "state-cache"
    before = _snapshot(folder)
    assert before  # training wrote its states there
    monkeypatch.setattr(frozen, "INFERENCE_ENTRIES", 16)
    saved = load_model(run.best)
    texts = _texts(300) + _texts(40)  # 40 repeats, long after their first occurrence (evicted by then)
    resident = []

    def items():
        for text in texts:
            resident.append(len(saved.model.states.cache.memory))
            yield text

    preds = list(predict_texts(saved, items(), batch_size=8, workers=1))
    assert len(preds) == len(texts)
    cache = saved.model.states.cache
    assert max(resident) <= 16 and len(cache.memory) <= 16
    assert cache.misses == 340 and cache.hits == 0  # the repeats came back after eviction: recomputed
    assert _snapshot(folder) == before  # nothing written, nothing added
    assert not cache.pending


def test_cache_states_writes_new_states_that_a_later_run_reads(run, tmp_path):
    source = tmp_path / "in.txt"
    texts = _texts(30)
    source.write_text("\n".join(texts + texts[:5]) + "\n", encoding="utf-8")
    root = tmp_path / "states"
    args = ["predict", "--model", str(run.best), "--input", str(source), "--force", "--cache-dir", str(root)]
    assert main([*args, "--output", str(tmp_path / "a.jsonl")]) == 0
    assert not root.exists()  # --cache-dir without --cache-states: read only
    assert main([*args, "--output", str(tmp_path / "b.jsonl"), "--cache-states"]) == 0
    shards = list(root.glob("*/shard-*.safetensors"))
    assert len(shards) == 1
    saved = load_model(run.best)
    summary_texts = texts + texts[:5]
    Predictor.from_saved(saved, cache_dir=root)
    assert len(saved.model.states.cache) == 30  # every distinct text once (the repeats were computed once)
    preds = list(predict_texts(saved, summary_texts, cache_dir=root))
    cache = saved.model.states.cache
    assert (cache.hits, cache.repeats, cache.misses) == (30, 5, 0)  # read from the folder written above
    first = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [p["sentiment"]["label"] for p in preds] == [r["predictions"]["sentiment"]["label"] for r in first]


def test_summary_counts_repeats_inside_the_data_apart_from_cache_hits(run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    texts = _texts(20)
    source.write_text("\n".join(texts + texts[:7]) + "\n", encoding="utf-8")
    args = ["predict", "--model", str(run.best), "--input", str(source), "--output", str(tmp_path / "o.jsonl")]
    assert main([*args, "--cache-dir", str(tmp_path / "empty")]) == 0
    report = capsys.readouterr().out
    assert "trunk states: 20 texts computed, 0 from the state cache, 7 repeats inside the input" in report
    assert "words/s" in report and "tokens/s" not in report


def _models(checkpoint: Path, cache: Path):
    cfg = tiny_config(
        cache.parent / "run",
        [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={cache}", "model.trunk.mode=frozen"],
    )
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    torch.manual_seed(0)
    return build_model(cfg, LABELS, encoder).eval(), encoder


def test_bf16_autocast_states_are_never_served_to_fp32(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "llama")
    model, encoder = _models(checkpoint, tmp_path / "cache")
    ids, mask = batch(encoder, _texts(6))
    with torch.no_grad():
        reference = model.states.compute(ids, mask)  # float32, no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.states(ids, mask)  # computed and cached under bf16 autocast
    model.states.cache.flush()
    again, _ = _models(checkpoint, tmp_path / "cache")
    served = again.states(ids, mask)
    assert again.states.cache.misses == 0  # read from the folder the first model wrote
    for i in range(len(ids)):
        real = mask[i]
        assert torch.equal(served[i][real], reference[i][real].to(state_cache.STORE_DTYPE).float())
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():  # what autocast would have given the trunk
        reached = model.states.base(input_ids=ids, attention_mask=mask.long()).last_hidden_state.float()
    assert (reached - reference)[mask].abs().max() > 1e-2  # so the equality above is not a coincidence


def test_int8_states_live_in_their_own_folder(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "llama")
    model, encoder = _models(checkpoint, tmp_path / "cache")
    ids, mask = batch(encoder, _texts(6))
    fp32_folder = model.states.cache.directory
    fp32 = model.states(ids, mask)
    predictor = Predictor(model, encoder, LABELS, precision="int8")
    assert predictor.precision == "int8"
    int8_folder = model.states.cache.directory
    assert int8_folder != fp32_folder and int8_folder.parent == fp32_folder.parent and "-int8-" in int8_folder.name
    quantised = [n for n, m in model.states.base.named_modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert sorted({n.rsplit(".", 1)[-1] for n in quantised}) == ["gate_proj", "up_proj"]
    int8 = model.states(ids, mask)
    assert model.states.cache.misses == len(ids)  # computed again, not served from the fp32 states
    assert not torch.equal(int8[mask], fp32[mask])
    with pytest.raises(UserError, match="quantised to int8"):
        Predictor(model, encoder, LABELS, precision="fp32")


def test_the_checkpoint_config_is_part_of_the_key(tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "llama")
    other = tmp_path / "llama-theta"
    shutil.copytree(checkpoint, other)
    config = json.loads((other / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_parameters" in config:
        config["rope_parameters"] = {**rope, "rope_theta": 500.0}
    else:
        config["rope_theta"] = 500.0
    (other / "config.json").write_text(json.dumps(config))
    a, _ = _models(checkpoint, tmp_path / "cache")
    b, _ = _models(other, tmp_path / "cache")
    assert a.identity.sha256 == b.identity.sha256  # the same weights
    assert a.states.cache.directory != b.states.cache.directory
    assert a.states.cache.directory.parent == b.states.cache.directory.parent


def test_evaluate_reads_the_training_states_and_writes_nothing(run, tmp_path, capsys):
    folder = run.run_dir.parent / "state-cache"
    before = _snapshot(folder)
    out = tmp_path / "eval"
    assert main(["evaluate", "--model", str(run.best), "--split", "validation", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = load_model(run.best)
    items = [ex.words if ex.words is not None else ex.text for s in load_split(saved.config.tasks, "validation")
             for ex in s.examples]  # fmt: skip
    whole = sum(not e.truncated for e in saved.encoder.encode_batch(items))
    assert 0 < whole < len(items)
    # training cached every validation text that fits; the windows of the longer ones are computed here
    assert "from the state cache, 0 repeats inside the data" in printed
    assert f"texts computed, {whole} from the state cache" in printed
    assert _snapshot(folder) == before
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["precision"] == "fp32"


def test_progress_counts_every_item_once_windows_included(run):
    saved = load_model(run.best)
    long = " ".join(_texts(40))  # far past data.max_length: tagged in several windows
    items = [*_texts(9), long, *_texts(3)]
    predictor = Predictor.from_saved(saved, batch_size=4, workers=1)
    counts: list[int] = []
    predictor.progress = counts.append
    preds = list(predictor.predict(items))
    assert preds[9].windows > 1
    assert sum(counts) == len(items) and len(counts) > 1


def test_a_distillation_teacher_reads_its_trunk_states_but_never_writes_them(run, tmp_path, monkeypatch):
    """A frozen-trunk teacher labelling a transfer set is inference: its shared state folder stays as it was, even
    when its cache is flushed, and it keeps a bounded number of states (before, every text's states were kept in
    memory and written to the folder, 1,024 at a time: 3.1 GB in the first 70 minutes of the SmolLM2 teacher on
    the transfer set)."""
    import mtl_decoder.distill.targets as targets_module

    monkeypatch.setattr(frozen, "INFERENCE_ENTRIES", 16)
    teachers = []
    real = targets_module.TeacherLabeller.__init__

    def keeping(self, saved, batch_size, **options):
        teachers.append(saved)
        real(self, saved, batch_size, **options)

    monkeypatch.setattr(targets_module.TeacherLabeller, "__init__", keeping)
    folder = run.run_dir.parent / "state-cache"
    before = _snapshot(folder)
    (tmp_path / "student.yaml").write_text(tiny_config(tmp_path / "student").to_yaml(), encoding="utf-8")
    (tmp_path / "news.txt").write_text("\n".join(_texts(120)) + "\n", encoding="utf-8")
    args = ["distill", "--teacher", str(run.best), "--config", str(tmp_path / "student.yaml"),
            "--unlabelled", str(tmp_path / "news.txt"), "--output-dir", str(tmp_path / "student"),
            f"distill.cache_dir={tmp_path / 'targets'}", "training.max_steps=2", "training.eval_every=2"]  # fmt: skip
    assert main(args) == 0
    assert any((tmp_path / "targets").rglob("*.safetensors"))  # the teacher did label the texts
    (teacher,) = teachers
    cache = teacher.model.states.cache
    assert cache.misses >= 120 and len(cache.memory) <= 16
    cache.flush()
    assert _snapshot(folder) == before
