"""Tiny random Hugging Face checkpoints (Llama, Qwen2, GPT-2) built from their config classes and saved to a
folder with a small byte-level BPE tokenizer: what a pretrained trunk is loaded from, with no download."""

from __future__ import annotations

import json
from pathlib import Path

import torch

FIXTURES = Path(__file__).parents[2] / "fixtures"
FAMILIES = ("llama", "qwen2", "gpt2")


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
