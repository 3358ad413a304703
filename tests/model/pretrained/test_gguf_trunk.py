"""A .gguf file as model.trunk.pretrained: a tiny random Llama written with the gguf package loads through
transformers, trains, saves, loads and exports. The dev extra installs gguf, so CI runs
it; skipped only where gguf is missing (a plain `pip install -e .`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("gguf")

from helpers import tiny_config
from hf_testkit import tiny_tokenizer
from trunk_runs import batch, force_gates

from mtl_decoder.export import export_trunk
from mtl_decoder.saved import load_model
from mtl_decoder.training import train

GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _permute(w, n_head: int):
    """transformers' rotate-half rows of q/k -> llama.cpp's interleaved rows (transformers undoes it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path) -> tuple[Path, torch.nn.Module]:
    """A random 2-block Llama with tied embeddings (no output tensor, as SmolLM2's GGUF) and the test kit's
    byte-level BPE tokenizer, as an F32 GGUF file; returns it and the model it holds."""
    import gguf
    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    spec = json.loads(tok.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    torch.manual_seed(0)
    c = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=128, vocab_size=len(tokens), bos_token_id=0,
                    eos_token_id=0, pad_token_id=0, tie_word_embeddings=True, rms_norm_eps=1e-5)  # fmt: skip
    model = LlamaForCausalLM(c)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(tokens) - 1))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    for i in range(c.num_hidden_layers):
        for hf, name in GGUF_NAMES.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if name in ("attn_q", "attn_k"):
                t = _permute(t, c.num_attention_heads if name == "attn_q" else c.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, model.eval()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


@pytest.mark.parametrize("mode", ["frozen", "upcycle"])
def test_a_gguf_trunk_trains_saves_loads_and_exports(tiny_gguf, tmp_path, mode):
    path, source = tiny_gguf
    overrides = [f"model.trunk.pretrained={path}", f"model.trunk.mode={mode}", "training.max_steps=2"]
    overrides += ["training.eval_every=2", f"model.trunk.cache_dir={tmp_path / 'cache'}"]
    result = train(tiny_config(tmp_path / "run", overrides))
    assert result.steps == 2
    saved = load_model(tmp_path / "run" / "best", device="cpu")  # frozen: the GGUF loaded again, hash checked
    assert saved.model.identity.source == str(path) and saved.model.identity.architecture == "llama"
    ids, mask = batch(saved.encoder, [["EU", "rejects", "German", "call"], "Peter Blackburn went home."])
    with torch.no_grad():  # the file's weights (F32: exactly the source model's) are the trunk's
        expected = source.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        if mode == "frozen":
            torch.testing.assert_close(saved.model.states.compute(ids, mask)[mask], expected[mask])

    exported = export_trunk(tmp_path / "run" / "best", tmp_path / "hf")
    assert exported.lm_head == "tied"  # the GGUF has no output tensor: the head is the embeddings
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    with torch.no_grad():
        got = lm.base_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        if mode == "frozen":
            torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-5)
        else:
            force_gates(saved.model, "shared/0")
            layout = saved.model.route_layout(mask, saved.model.task_names, None)
            hidden, _ = saved.model.encode(ids, mask, layout, {})
            rows = layout.rows("sentiment")
            path_states = hidden[rows][torch.argsort(layout.row_example[rows])]
            torch.testing.assert_close(got[mask], path_states[mask], atol=1e-5, rtol=1e-5)
