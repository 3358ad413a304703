"""Tiny random Hugging Face checkpoints (Llama, Qwen2, GPT-2) built from their config classes and saved to a
folder with a small byte-level BPE tokenizer: what a pretrained trunk is loaded from, with no download."""

from __future__ import annotations

import json
from pathlib import Path

import torch

FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = ("llama", "qwen2", "gpt2")
# float16 keeps 11 significant bits: rounding to nearest moves a normal value x by at most 2**-11 * |x| (a subnormal,
# |x| < 6.1e-5, by at most 2**-25). The bound a state stored in float16 must meet against its float32 value.
FP16_ROUNDING = 2.0**-11
# Two float32 computations of the same states (one sequence at a time, or a padded batch) differ by float32 noise,
# about 1e-6 at these widths: the absolute slack beside FP16_ROUNDING.
FP32_NOISE = 1e-5


def assert_fp16_rounded(got: torch.Tensor, want: torch.Tensor, ulps: float = 1.0) -> None:
    """``got`` is the float32 ``want`` stored in float16 and read back: every value is exactly representable in
    float16 and within ``ulps`` x float16's rounding bound of ``want``, elementwise (not a loose atol)."""
    assert torch.equal(got, got.half().to(got.dtype)), "not float16 values"
    err, bound = (got - want).abs(), ulps * FP16_ROUNDING * want.abs() + FP32_NOISE
    worst = int((err - bound).argmax())
    assert (err <= bound).all(), f"off by {err.flatten()[worst]:.3g} at {want.flatten()[worst]:.4g}: over fp16's bound"


def _texts() -> list[str]:
    out = []
    for name in ("ner_train.jsonl", "sentiment_train.jsonl"):
        for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            out.append(" ".join(record["tokens"]) if "tokens" in record else record["text"])
    return out


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_texts(), trainer=trainer)
    return tok


def tiny_checkpoint(folder: Path, family: str = "llama", seed: int = 0, layers: int = 2) -> Path:
    """A random ``family`` model of width 32 with ``layers`` blocks, and its tokenizer, saved in ``folder``."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tok = tiny_tokenizer()
    vocab = tok.get_vocab_size()
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    if family == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=128, **common)
        )  # fmt: skip
    elif family == "qwen2":
        model = Qwen2ForCausalLM(
            Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=128, **common)
        )  # fmt: skip
    elif family == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=128, **common))
    else:
        raise ValueError(family)
    with torch.no_grad():  # larger weights than the default init, so that every block visibly changes its input
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder
