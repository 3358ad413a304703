"""Texts packed end to end into the trunk's rows (model/pretrained/packing.py): the plan against brute-force
invariants, and the packed pass against Hugging Face's own model run on each text alone, for the frozen, the
several-block and the echo readings."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import tiny_checkpoint
from trunk_runs import batch

from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.model.pretrained.packing import PackPlan

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
    "Peter Blackburn went home.",
    ["Rain"],
    "A gripping , funny and moving film about nothing much at all",
    ["6-3"],
]


@pytest.mark.parametrize("seed", range(5))
def test_a_plan_puts_every_text_whole_in_one_row_without_overlap(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
    plan = PackPlan.of(lengths, 48)
    cells: dict[tuple[int, int], int] = {}
    for i, n in enumerate(lengths):
        for k in range(plan.start[i], plan.start[i] + n):
            assert (plan.row[i], k) not in cells  # no two texts share a position
            cells[(plan.row[i], k)] = i
    assert plan.row_length == max(
        max(plan.start[i] + n for i, n in enumerate(lengths) if plan.row[i] == r) for r in range(plan.rows)
    )
    assert plan.rows == min(len(lengths), -(-sum(lengths) // 48))  # as few rows as 48 ids each need
    assert plan.row_length <= sum(lengths) / plan.rows + max(lengths)  # LPT's bound: the mean plus one text
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.arange(1, n + 1) + 100 * i
    packed, positions = plan.pack(ids)
    for i, n in enumerate(lengths):
        r, s = plan.row[i], plan.start[i]
        assert packed[r, s : s + n].tolist() == ids[i, :n].tolist()
        assert positions[r, s : s + n].tolist() == list(range(n))
    back = plan.unpack(packed.unsqueeze(-1).float(), ids.shape[1]).squeeze(-1).long()
    assert torch.equal(back, ids)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("hf") / "llama", "llama", layers=3)


def _states(checkpoint: Path, root: Path, mode: str, *extra: str):
    overrides = [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={root}", f"model.trunk.mode={mode}"]
    cfg = tiny_config(root.parent / "run", [*overrides, *extra])
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    return build_model(cfg, LABELS, encoder).eval().states, encoder


def _hf_alone(checkpoint: Path, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per text: Hugging Face's last hidden states over that text alone."""
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return [
            ref(input_ids=row[:n].unsqueeze(0)).last_hidden_state[0]
            for row, n in zip(ids, mask.sum(1).tolist(), strict=True)
        ]


@pytest.mark.parametrize(
    ("mode", "extra"), [("frozen", []), ("frozen", ["model.trunk.read_layers=[1,3]"]), ("echo", [])]
)
def test_a_packed_pass_gives_each_text_its_own_states(checkpoint, tmp_path, mode, extra):
    """Each text's packed states against the same trunk over that text alone (no padding, no neighbour): for the
    frozen reading also against Hugging Face's model (tests/model/pretrained hold the others' references)."""
    states, encoder = _states(checkpoint, tmp_path / "cache", mode, *extra)
    ids, mask = batch(encoder, ITEMS)
    lengths = mask.sum(1).tolist()
    alone = [states.compute(ids[i : i + 1, :n], mask[i : i + 1, :n])[0] for i, n in enumerate(lengths)]
    read = [2 * n for n in lengths] if mode == "echo" else lengths  # echo packs each text twice over
    states.pack_tokens = 2 * 24 if mode == "echo" else 24  # short texts share a row, the long ones have their own
    plan = PackPlan.of(read, states.pack_tokens)
    assert plan.rows < len(ITEMS) and plan.padded_tokens() < len(ITEMS) * max(read)
    packed = states.compute(ids, mask)
    assert packed.shape == (*ids.shape, states.width)
    for i, want in enumerate(alone):
        n = lengths[i]
        torch.testing.assert_close(packed[i, :n], want, rtol=1e-5, atol=1e-5)
        assert (packed[i, n:] == 0).all()
    if mode == "frozen" and not extra:
        for i, want in enumerate(_hf_alone(checkpoint, ids, mask)):
            torch.testing.assert_close(packed[i, : lengths[i]], want, rtol=1e-5, atol=1e-5)


def test_a_trunk_that_lets_packed_texts_see_each_other_is_run_padded(checkpoint, tmp_path):
    states, encoder = _states(checkpoint, tmp_path / "cache", "frozen")
    ids, mask = batch(encoder, ITEMS)
    lengths = mask.sum(1).tolist()
    alone = [states.compute(ids[i : i + 1, :n], mask[i : i + 1, :n])[0] for i, n in enumerate(lengths)]
    faithful = states.hidden
    states.hidden = lambda input_ids, attention_mask, position_ids: faithful(input_ids, attention_mask, None)
    states.pack_tokens = 24  # positions counted on across the row, no mask between texts: one causal stream
    assert not states.packs()
    packed = states.compute(ids, mask)
    for i, want in enumerate(alone):
        torch.testing.assert_close(packed[i, : lengths[i]], want, rtol=1e-5, atol=1e-5)


def test_predict_packs_by_default_and_gives_what_padded_batches_give(tmp_path, capsys):
    import json

    from trunk_runs import trained

    from mtl_decoder.cli import main
    from mtl_decoder.inference.options import InferenceOptions
    from mtl_decoder.inference.predictor import Predictor
    from mtl_decoder.model.pretrained.packing import PACK_TOKENS
    from mtl_decoder.saved import load_model

    run = trained(tmp_path / "frozen", "frozen")
    saved = load_model(run.best)
    assert Predictor.from_saved(saved).model.trunk_kind.cached_states().pack_tokens == PACK_TOKENS > 0
    assert (
        Predictor.from_saved(saved, InferenceOptions(pack_tokens=0)).model.trunk_kind.cached_states().pack_tokens == 0
    )
    source = tmp_path / "in.txt"
    source.write_text("EU rejects German call .\nA gripping film\nRain\nPeter Blackburn went home today .\n")
    outputs = {}
    for name, extra in (("packed", []), ("padded", ["--pack-tokens", "0"]), ("rows8", ["--pack-tokens", "8"])):
        out = tmp_path / f"{name}.jsonl"
        argv = ["predict", "--model", str(run.best), "--input", str(source), "--output", str(out), *extra]
        assert main(argv) == 0
        outputs[name] = [json.loads(line) for line in out.read_text().splitlines()]
    for name in ("packed", "rows8"):
        for got, want in zip(outputs[name], outputs["padded"], strict=True):
            assert got["predictions"]["ner"]["tags"] == want["predictions"]["ner"]["tags"]
            probs, ref = got["predictions"]["sentiment"]["probs"], want["predictions"]["sentiment"]["probs"]
            assert all(abs(probs[k] - ref[k]) < 1e-5 for k in ref)
    capsys.readouterr()
    argv = ["predict", "--model", str(run.best), "--input", str(source), "--output", str(tmp_path / "x.jsonl")]
    assert main([*argv, "--pack-tokens", "-1"]) == 2
    assert "--pack-tokens must be 0 (padded batches) or a positive row length, got -1" in capsys.readouterr().err


def test_a_batch_that_packing_would_barely_shrink_stays_padded(checkpoint, tmp_path):
    from mtl_decoder.model.pretrained.packing import MIN_SAVING

    states, encoder = _states(checkpoint, tmp_path / "cache", "frozen")
    states.pack_tokens = 24
    passes = []
    faithful = states.hidden
    states.hidden = lambda ids, mask, positions: passes.append(positions is not None) or faithful(ids, mask, positions)
    assert states.packs() and passes == [True, False, False]  # the check: the probes packed, then each alone
    passes.clear()
    even = [["EU", "rejects", "German", "call"], ["Peter", "went", "home", "today"]]  # about equal lengths
    ids, mask = batch(encoder, even)
    plan = PackPlan.of(mask.sum(1).tolist(), 24)
    assert plan.padded_tokens() > (1 - MIN_SAVING) * ids.numel()
    states.compute(ids, mask)
    ragged = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."], ["Rain"], ["6-3"]]
    states.compute(*batch(encoder, ragged))
    assert passes == [False, True]  # the even batch as given, the ragged one packed
