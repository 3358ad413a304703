"""Two tiny pretrained-style tokenizers built in the tests, and a brute-force reading of where words lie in them.

- ``byte_level``: Qwen2-style byte-level BPE (digits split one by one, the space before a number a lone 'Ġ'), no
  special tokens.
- ``metaspace``: SentencePiece-style BPE ('▁' word marks, digits split: a lone '▁' before a number), with a
  Llama-like '<s>' prefix.

``brute_reads`` says, from the tokenizer's own offsets (or word ids) and decoder only, where each word of a word list
should be read and whether it reached the model whole: an independent reference for ``WordAlignment``.
"""

from __future__ import annotations

import random
from functools import cache

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

WORDS = ["The", "cats", "sat", "on", "12", "7", "1999", "Paris", "U.S.", "3.5", "well-known", "(", ")", ",", "Müller",
         "x", "42nd", "2024", "€5", "Blackburn", "said", "0", "km"]  # fmt: skip
QWEN2_SPLIT = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) for _ in range(n)]


def words_of_length(n: int) -> list[str]:
    rng = random.Random(n)
    return [rng.choice(WORDS) for _ in range(n)]


def byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(corpus(), trainer)
    return tok


def metaspace() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"), pre_tokenizers.Digits(True)]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


TOKENIZERS = {"byte_level": (byte_level, 0), "metaspace": (metaspace, 1)}
"""name -> (builder, special tokens before the text)."""


def brute_reads(
    tok: Tokenizer, words: list[str], as_text: bool, word_token: str, max_length: int, lead: int
) -> tuple[list[int | None], int]:
    """Per word: the position (in the encoding with special tokens) its tag must be read from, or None when not all
    of its pieces fit in ``max_length``; and how many of its pieces are whitespace-only pieces before a real one.

    A piece belongs to a word when its characters overlap the word's (joined text) or the tokenizer's word id says
    so (word lists); it is real when the tokenizer's decoder gives it a non-space character."""
    if as_text:
        enc = tok.encode(" ".join(words), add_special_tokens=False)
        bounds, pos = [], 0  # each word's [start, end) characters in the joined text
        for w in words:
            bounds.append((pos, pos + len(w)))
            pos += len(w) + 1
        pieces: list[list[int]] = [[] for _ in words]
        k = 0
        for t, (s, e) in enumerate(enc.offsets):  # both in text order: sweep the words along the pieces
            while k < len(words) and bounds[k][1] <= s:
                k += 1
            j = k
            while j < len(words) and bounds[j][0] < e:  # every word the piece's characters overlap
                pieces[j].append(t)
                j += 1
    else:
        enc = tok.encode(words, is_pretokenized=True, add_special_tokens=False)
        pieces = [[] for _ in words]
        for t, wid in enumerate(enc.word_ids):
            pieces[wid].append(t)
    real_piece = [_is_real(tok, i) for i in enc.ids]
    budget = max_length - tok.num_special_tokens_to_add(False)
    reads: list[int | None] = []
    blank_firsts = 0
    for own in pieces:
        real = [t for t in own if real_piece[t]]
        blank_firsts += bool(own) and own[0] not in real
        if as_text and own and own[0] > 0 and not real_piece[own[0] - 1]:
            blank_firsts += 1  # the lone space piece before the word (its offsets cover only the space)
        whole = bool(own) and max(own) < budget
        pick = (real[0] if word_token == "first" else real[-1]) if real else own[-1]
        reads.append(lead + pick if whole else None)
    return reads, blank_firsts


@cache
def _decoded(tok_id: int, vocab: str) -> str:
    return _TOKENIZERS[vocab].decode([tok_id])


_TOKENIZERS: dict[str, Tokenizer] = {}


def _is_real(tok: Tokenizer, tok_id: int) -> bool:
    """The piece decodes to something other than whitespace (the tokenizer's own decoder says so)."""
    key = str(id(tok))
    _TOKENIZERS.setdefault(key, tok)
    return bool(_decoded(tok_id, key).strip())
