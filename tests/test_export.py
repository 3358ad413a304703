"""mtl-decoder export --trunk: a saved model's (fine-tuned) trunk as a checkpoint that
AutoModelForCausalLM.from_pretrained loads, whose hidden states are the trunk's on the chosen expert's path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from helpers import tiny_config
from hf_testkit import tiny_checkpoint
from trunk_runs import batch, force_gates, overrides, trained

from mtl_decoder.cli import main
from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.export import export_trunk
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.saved import load_model, save_model

ITEMS = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."], "Peter Blackburn went home.",
         ["Rain"]]  # fmt: skip
LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "trunk-runs"


def _exported_states(folder: Path, ids: torch.Tensor, mask: torch.Tensor):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return lm, lm.base_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state


def _path_states(model, ids, mask, expert: str) -> dict[str, torch.Tensor]:
    """The trunk's hidden states of every route whose gates can all choose ``expert``, with them forced onto it."""
    force_gates(model, expert)
    layout = model.route_layout(mask, model.task_names, None)
    with torch.no_grad():
        hidden, _ = model.encode(ids, mask, layout, {})
    owner = expert.split("/")[0]
    routes = [r for r in layout.names if r != SHARED and owner in (SHARED, r)]
    assert routes
    out = {}
    for route in routes:
        rows = layout.rows(route)
        out[route] = hidden[rows][torch.argsort(layout.row_example[rows])]  # rows in example order
    return out


def _assert_close_on_real_tokens(got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> None:
    torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)


def _original_states(checkpoint: Path, ids, mask, causal: bool) -> torch.Tensor:
    from transformers import AutoModel

    with torch.no_grad():
        return AutoModel.from_pretrained(checkpoint)(input_ids=ids, attention_mask=mask.long(), is_causal=causal)[0]


@pytest.mark.parametrize(
    "mode, expert", [("frozen", None), ("lora", "shared/0"), ("upcycle", "shared/1"), ("upcycle", "ner/0")]
)
def test_the_exported_checkpoint_computes_the_trunk_on_the_experts_path(root, tmp_path, mode, expert):
    run = trained(root, mode)
    result = export_trunk(run.best, tmp_path / "hf", expert=expert)
    assert result.expert == expert and result.lm_head == "original"  # the tiny checkpoints do not tie
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"):
        assert (tmp_path / "hf" / name).is_file(), name
    saved = load_model(run.best, device="cpu")
    ids, mask = batch(saved.encoder, ITEMS)
    lm, got = _exported_states(tmp_path / "hf", ids, mask)
    causal = saved.config.model.attention == "causal" or mode == "frozen"
    assert getattr(lm.config, "is_causal", True) is causal  # bidirectional training: the config says so
    if mode == "frozen":
        with torch.no_grad():
            expected = saved.model.states.compute(ids, mask)
        _assert_close_on_real_tokens(got, expected, mask)
    else:
        for expected in _path_states(saved.model, ids, mask, expert).values():
            _assert_close_on_real_tokens(got, expected, mask)
        original = _original_states(run.checkpoint, ids, mask, causal)
        assert (got - original)[mask].abs().max() > 1e-4  # the export holds what training changed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    head = AutoModelForCausalLM.from_pretrained(run.checkpoint).get_output_embeddings().weight
    torch.testing.assert_close(lm.get_output_embeddings().weight, head, atol=0, rtol=0)  # the original LM head
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("Peter Blackburn went home.")["input_ids"] == saved.encoder.encode_text(ITEMS[1]).ids


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_lora_updates_merge_in_each_familys_layout(tmp_path, family):
    """GPT-2's Conv1D holds its weight as (in, out): the merged update must follow; a task's own expert too."""
    checkpoint = tiny_checkpoint(tmp_path / family, family)
    cfg = tiny_config(tmp_path / "run", overrides(checkpoint, tmp_path, "lora", "model.ffn=cgc"))
    encoder = TextEncoder.for_model(load_tokenizer(cfg.model.trunk), cfg.model, cfg.data.max_length)
    model = build_model(cfg, LABELS, encoder).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    save_model(tmp_path / "best", model, encoder, cfg, LABELS)
    export_trunk(tmp_path / "best", tmp_path / "hf", expert="sentiment/0")
    ids, mask = batch(encoder, ITEMS)
    _, got = _exported_states(tmp_path / "hf", ids, mask)
    expected = _path_states(load_model(tmp_path / "best", device="cpu").model, ids, mask, "sentiment/0")
    _assert_close_on_real_tokens(got, expected["sentiment"], mask)
    original = _original_states(checkpoint, ids, mask, causal=False)
    assert (got - original)[mask].abs().max() > 1e-3


def test_without_the_original_checkpoint_the_head_is_tied_and_says_so(root, tmp_path):
    run = trained(root, "upcycle")
    folder = tmp_path / "best"
    shutil.copytree(run.best, folder)
    identity = json.loads((folder / "trunk.json").read_text())
    identity["source"] = str(tmp_path / "gone")  # the upcycled folder needs no original, the untied head does
    (folder / "trunk.json").write_text(json.dumps(identity))
    result = export_trunk(folder, tmp_path / "hf")
    assert result.lm_head == "tied" and any("LM head" in n and "tied to the embeddings" in n for n in result.notes)
    saved = load_model(folder, device="cpu")
    ids, mask = batch(saved.encoder, ITEMS)
    lm, got = _exported_states(tmp_path / "hf", ids, mask)
    assert lm.config.tie_word_embeddings
    assert lm.get_output_embeddings().weight.data_ptr() == lm.get_input_embeddings().weight.data_ptr()
    _assert_close_on_real_tokens(got, _path_states(saved.model, ids, mask, "shared/0")["ner"], mask)


def test_export_errors_name_the_fix(root, tmp_path, tiny_run):
    lora, frozen = trained(root, "lora").best, trained(root, "frozen").best
    with pytest.raises(
        UserError, match=r"--expert shared/7: not an expert of this model .*: shared/0, shared/1, ner/0"
    ):
        export_trunk(lora, tmp_path / "a", expert="shared/7")
    with pytest.raises(UserError, match="in mode frozen the trunk holds no experts"):
        export_trunk(frozen, tmp_path / "b", expert="shared/0")
    with pytest.raises(UserError, match="trained from scratch"):
        export_trunk(tiny_run / "best", tmp_path / "c")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="not empty; add --force"):
        export_trunk(lora, tmp_path / "d")
    assert (tmp_path / "d" / "keep.txt").is_file()


def test_the_export_command(root, tmp_path, capsys):
    lora = trained(root, "lora").best
    assert main(["export", "--model", str(lora), "--output", str(tmp_path / "hf")]) == 2
    assert "--trunk" in capsys.readouterr().err
    assert main(["export", "--model", str(lora), "--trunk", "--output", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'hf'} (mode lora, expert shared/0, LM head original)" in out and "is_causal" in out
    assert main(["export", "--model", str(lora), "--trunk", "--output", str(tmp_path / "hf")]) == 2
    args = ["export", "--model", str(lora), "--trunk", "--output", str(tmp_path / "hf"), "--force", "--expert", "ner/0"]
    assert main(args) == 0
    assert "expert `ner/0`" in (tmp_path / "hf" / "README.md").read_text()


def test_force_never_replaces_a_folder_that_is_not_an_export(root, tmp_path):
    """Issue 38 case 7: ``export --force`` emptied a folder holding src/, data/ and notes."""
    lora = trained(root, "lora").best
    other = tmp_path / "work"
    (other / "src").mkdir(parents=True)
    (other / "data").mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"is not an export of mtl-decoder \(data/, notes.txt, src/\)") as caught:
        export_trunk(lora, other, force=True)
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in other.iterdir()) == ["data", "notes.txt", "src"]
    first = export_trunk(lora, tmp_path / "hf")
    assert (tmp_path / "hf" / ".mtl-decoder-export").is_file() and not first.notes[-1].startswith("--force")
    again = export_trunk(lora, tmp_path / "hf", force=True)
    assert again.notes[-1].startswith(f"--force replaced the earlier export in {tmp_path / 'hf'}, removing: ")
    assert "model.safetensors" in again.notes[-1] and ".mtl-decoder-export" in again.notes[-1]


def test_a_full_disk_in_export_is_one_line_naming_the_output(root, tmp_path, monkeypatch):
    """Issue 38 case 10: a SafetensorError traceback."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full_disk(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    out = tmp_path / "hf"
    with pytest.raises(UserError, match=f"^{out}: cannot write the export \\(Error while serializing") as caught:
        export_trunk(trained(root, "lora").best, out)
    assert "\n" not in str(caught.value) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("manifest", [True, False])
def test_a_model_folder_without_its_trunk_config_is_named(root, tmp_path, manifest):
    """Issue 38 case 10: ``ValueError: Unrecognized model``."""
    folder = Path(shutil.copytree(trained(root, "upcycle").best, tmp_path / "best"))
    (folder / "trunk" / "config.json").unlink()
    if not manifest:
        (folder / "manifest.json").unlink()
    with pytest.raises(UserError, match=f"^{folder / 'trunk' / 'config.json'}: missing") as caught:
        export_trunk(folder, tmp_path / "hf")
    assert "\n" not in str(caught.value)
