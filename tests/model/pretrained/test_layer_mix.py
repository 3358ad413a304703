"""model.trunk.read_layers: several blocks of a frozen trunk, each cached on its own, mixed per route or concatenated.
Tiny random Llama / GPT-2 checkpoints of 3 blocks; AutoModel's own hidden states are the reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_config
from hf_testkit import assert_fp16_rounded, tiny_checkpoint
from trunk_runs import batch

from mtl_decoder.config import SHARED
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import ConfigError
from mtl_decoder.model import build_model
from mtl_decoder.model.pretrained.frozen import FrozenDecoder
from mtl_decoder.model.pretrained.hub import load_tokenizer
from mtl_decoder.model.pretrained.layermix import LayerMixDecoder

LABELS = {"ner": ["O", "B-ORG", "I-ORG"], "sentiment": ["negative", "positive"]}
ITEMS = [["EU", "rejects", "German", "call", "."], "Peter Blackburn went home.", ["Rain"]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "llama": tiny_checkpoint(root / "llama", "llama", layers=3),
        "gpt2": tiny_checkpoint(root / "gpt2", "gpt2", layers=3),
        "llama-other": tiny_checkpoint(root / "llama-other", "llama", seed=1, layers=3),
    }


def _model(checkpoint: Path, cache: Path, *overrides: str):
    cfg = tiny_config(
        cache.parent / "run", [f"model.trunk.pretrained={checkpoint}", f"model.trunk.cache_dir={cache}", *overrides]
    )
    encoder = TextEncoder(load_tokenizer(cfg.model.trunk), cfg.data.max_length, words_as_text=True)
    return build_model(cfg, LABELS, encoder).eval(), encoder


def _batch(encoder: TextEncoder) -> tuple[torch.Tensor, torch.Tensor]:
    return batch(encoder, ITEMS)


def _hidden_states(checkpoint: Path, ids, mask) -> tuple[torch.Tensor, ...]:
    """AutoModel's (all 3 blocks) hidden states: [i] is the residual stream after block i for i = 1, 2."""
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        return ref(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.trunk.read_layers=[2, 1]"], "model.trunk.read_layers"),
        (["model.trunk.read_layers=[1, 1]"], "model.trunk.read_layers"),
        (["model.trunk.read_layers=[0, 2]"], "model.trunk.read_layers"),
        (["model.trunk.read_layers=[1, 2]", "model.trunk.layers=3"], "model.trunk.read_layers"),
        (["model.trunk.read_layers=[1, 2]", "model.trunk.mode=lora"], "model.trunk.read_layers"),
        (["model.trunk.read_layers=[1, 2]", "model.trunk.layer_mix=sum"], "model.trunk.layer_mix"),
    ],
)
def test_bad_read_layers_name_the_key(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=rf"^config key '{key}'"):
        tiny_config(tmp_path, ["model.trunk.pretrained=some/model", *overrides])


def test_read_layers_sets_the_blocks_kept_to_the_highest_one_read(tmp_path):
    cfg = tiny_config(tmp_path, ["model.trunk.pretrained=some/model", "model.trunk.read_layers=[8, 16, 24]"])
    assert cfg.model.trunk.layers == 24 and cfg.model.trunk.mixes_layers


def test_reading_only_the_last_kept_block_is_the_unchanged_frozen_model(checkpoints, tmp_path):
    """read_layers [N] is what the model did before read_layers: the same class, cache folder and outputs."""
    plain, encoder = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.layers=2")
    same, _ = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.read_layers=[2]")
    assert type(same) is FrozenDecoder and same.states.cache.directory == plain.states.cache.directory
    same.load_state_dict(plain.state_dict())
    ids, mask = _batch(encoder)
    with torch.no_grad():
        a, b = plain(ids, mask), same(ids, mask)
    for task in LABELS:
        torch.testing.assert_close(a.logits[task], b.logits[task], atol=0, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_each_read_block_holds_the_residual_stream_after_it(checkpoints, tmp_path, family):
    model, encoder = _model(checkpoints[family], tmp_path / "cache", "model.trunk.read_layers=[1, 2]")
    assert isinstance(model, LayerMixDecoder) and model.identity.layers == 2
    ids, mask = _batch(encoder)
    states = model.states(ids, mask)  # (B, T, 2H), through the cache (float16)
    expected = _hidden_states(checkpoints[family], ids, mask)
    H = model.identity.hidden_size
    for i, block in enumerate((1, 2)):
        for row in range(len(ITEMS)):
            got, want = states[row, mask[row], i * H : (i + 1) * H], expected[block][row, mask[row]]
            assert_fp16_rounded(got, want)  # measured: at most 0.99 of float16's rounding bound


def test_blocks_are_cached_apart_and_shared_by_models_reading_other_sets(checkpoints, tmp_path):
    """Block 2's states depend only on the weights up to block 2: a model cut at block 3 reuses what a model cut at
    block 2 cached for it, and computes (and writes) only block 3; other weights get other folders."""
    cache = tmp_path / "cache"
    first, encoder = _model(checkpoints["llama"], cache, "model.trunk.read_layers=[1, 2]")
    ids, mask = _batch(encoder)
    sequences = [row[m].tolist() for row, m in zip(ids, mask, strict=True)]
    assert first.states.precompute(sequences)[0] == len(ITEMS)
    block2 = first.states.cache.caches[2].directory
    shards = sorted(block2.glob("*.safetensors"))
    second, _ = _model(checkpoints["llama"], cache, "model.trunk.read_layers=[2, 3]")
    assert second.states.cache.caches[2].directory == block2
    assert second.states.cache.caches[3].directory != block2
    assert second.states.precompute(sequences)[0] == len(ITEMS)  # block 3 was missing
    assert sorted(block2.glob("*.safetensors")) == shards  # block 2 was not written again
    H = first.identity.hidden_size
    torch.testing.assert_close(second.states(ids, mask)[..., :H], first.states(ids, mask)[..., H:])
    other, _ = _model(checkpoints["llama-other"], cache, "model.trunk.read_layers=[1, 2]")
    assert other.states.cache.caches[2].directory != block2


def _manual_mix(model: LayerMixDecoder, states: torch.Tensor, route: str) -> torch.Tensor:
    """The route's mix in float64, from the definition: scale * sum_l softmax(w)_l * norm_l(h_l), projected."""
    H, mix = model.identity.hidden_size, model.mix
    r = mix.routes[route]
    weights = torch.softmax(mix.weights[r].double(), 0)
    total = 0
    for layer, norm in enumerate(mix.norms):
        h = states[..., layer * H : (layer + 1) * H].double()
        rms = h.pow(2).mean(-1, keepdim=True).add(norm.variance_epsilon).rsqrt()
        total = total + weights[layer] * norm.weight.double() * h * rms
    mixed = mix.scale[r].double() * total
    norm, proj = model.embed
    mixed = mixed * mixed.pow(2).mean(-1, keepdim=True).add(norm.eps).rsqrt() * norm.weight.double()
    return mixed @ proj.weight.double().T + proj.bias.double()


def test_each_route_reads_its_own_mix_of_the_blocks(checkpoints, tmp_path):
    """With ple every task route and the shared route mix the blocks with their own weights: set them apart and the
    first layer's rows of one example differ by route, each equal to its route's mix computed from the definition."""
    model, encoder = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.read_layers=[1, 2, 3]")
    assert model.per_route and set(model.mix.routes) == {"ner", "sentiment", SHARED}
    with torch.no_grad():
        model.mix.weights.copy_(torch.tensor([[3.0, 0.0, -1.0], [-2.0, 0.5, 2.0], [0.0, 0.0, 0.0]]))
        model.mix.scale.copy_(torch.tensor([1.5, 0.7, 1.0]))
        for norm in model.mix.norms:
            norm.weight.normal_(1.0, 0.3)
    ids, mask = _batch(encoder)
    layout = model.route_layout(mask, model.task_names, None)
    with torch.no_grad():
        x, gates = model.embed_routes(ids, mask, layout)
        states = model.states(ids, mask)
    assert x.shape == (len(layout.row_example), ids.shape[1], model.cfg.d_model) and gates == []
    for route in layout.names:
        rows = layout.rows(route)
        expected = _manual_mix(model, states, route)  # (B, T, C)
        for row, example in zip(range(rows.start, rows.stop), layout.row_example[rows].tolist(), strict=True):
            real = mask[example]
            torch.testing.assert_close(x[row][real].double(), expected[example][real], atol=1e-5, rtol=1e-4)
    ner, sentiment = layout.rows("ner").start, layout.rows("sentiment").start
    assert (x[ner] - x[sentiment]).abs().max() > 1e-2


def test_a_task_loss_trains_only_the_mixes_that_reach_it(checkpoints, tmp_path):
    """One native layer (no shared gate in it): a loss on ner alone reaches the ner route's mix and the shared
    route's (the ner gate mixes the shared experts, which read the shared route), never the sentiment route's."""
    model, encoder = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.read_layers=[1, 3]",
                            "model.n_layers=1")  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():  # off the zero-initialised expert outputs, through which no gradient flows at step 0
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.train()
    ids, mask = _batch(encoder)
    ner = torch.full(ids.shape, -100)
    ner[:, 0] = 1
    model(ids, mask, labels={"ner": ner}).loss.backward()
    grad = model.mix.weights.grad
    rows = model.mix.routes
    assert grad[rows["ner"]].abs().sum() > 0 and grad[rows[SHARED]].abs().sum() > 0
    assert grad[rows["sentiment"]].abs().sum() == 0


@pytest.mark.parametrize("ffn", ["cgc", "mlp"])
def test_variants_with_a_shared_bottom_read_one_mix(checkpoints, tmp_path, ffn):
    model, encoder = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.read_layers=[1, 2]",
                            f"model.ffn={ffn}")  # fmt: skip
    assert not model.per_route and list(model.mix.routes) == [SHARED]
    ids, mask = _batch(encoder)
    with torch.no_grad():
        x = model.embed_tokens(ids, mask)
        expected = _manual_mix(model, model.states(ids, mask), SHARED)
    torch.testing.assert_close(x[mask].double(), expected[mask], atol=1e-5, rtol=1e-4)


def test_concat_projects_the_normed_blocks_side_by_side(checkpoints, tmp_path):
    model, encoder = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.read_layers=[1, 2]",
                            "model.trunk.layer_mix=concat")  # fmt: skip
    H = model.identity.hidden_size
    assert model.embed[1].in_features == 2 * H and not model.per_route
    ids, mask = _batch(encoder)
    with torch.no_grad():
        states = model.states(ids, mask)
        parts = [norm(states[..., i * H : (i + 1) * H]) for i, norm in enumerate(model.mix.norms)]
        torch.testing.assert_close(model.embed_tokens(ids, mask), model.embed(torch.cat(parts, -1)))
        out = model(ids, mask)
    assert out.logits["ner"].shape[:2] == ids.shape and out.logits["sentiment"].shape == (len(ITEMS), 2)


def test_the_precompute_report_gives_the_cache_cost_per_token_and_block(checkpoints, tmp_path):
    from mtl_decoder.model.pretrained.layermix import cache_footprint

    model, encoder = _model(checkpoints["llama"], tmp_path / "cache", "model.trunk.read_layers=[1, 3]")
    ids, mask = _batch(encoder)
    sequences = [row[m].tolist() for row, m in zip(ids, mask, strict=True)]
    model.states.precompute(sequences)
    shards = [p for c in model.states.cache.caches.values() for p in c.directory.glob("shard-*.safetensors")]
    assert len(shards) == 2  # one per block
    tokens = sum(map(len, sequences))
    line = cache_footprint(model.states, tokens)
    H = model.identity.hidden_size
    assert line.startswith(f"block(s) 1, 3 cached, {2 * H} bytes per token per block (float16)")
    assert f"{tokens * 2 * 2 * H / 2**20:,.1f} MiB in memory" in line
    assert f"{sum(p.stat().st_size for p in shards) / 2**20:,.1f} MiB on disk" in line
