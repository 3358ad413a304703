"""Per-word evidence added to a word's sub-words: a character CNN, a shape embedding, hashed sparse features."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mtl_decoder.config import ModelConfig
from mtl_decoder.data.wordfeatures import N_CHAR_IDS, SHAPES, WORD_IDENTITY_FEATURES


class WordFeatures(nn.Module):
    """Per-word features added to every sub-word of the word.

    Evidence about each word beyond its sub-words, added to every sub-word of the word: a character CNN, an
    embedding of its shape class, and the sum of its hashed sparse features (word, prefixes, suffixes)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, char_dim = cfg.d_model, cfg.char_embedding
        self.char_emb = nn.Embedding(N_CHAR_IDS, char_dim, padding_idx=0) if char_dim else None
        self.conv = nn.Conv1d(char_dim, 2 * char_dim, kernel_size=3, padding=1) if char_dim else None
        self.char_proj = nn.Linear(2 * char_dim, d) if char_dim else None
        self.shape_emb = nn.Embedding(len(SHAPES), d) if cfg.word_features else None
        buckets = cfg.word_hash_buckets
        self.hash_emb = nn.Embedding(buckets, cfg.word_hash_dim, padding_idx=0) if buckets else None
        self.hash_proj = nn.Linear(cfg.word_hash_dim, d) if buckets else None
        self.hash_dropout = cfg.word_hash_dropout

    def forward(
        self,
        token_word: torch.Tensor,
        char_ids: torch.Tensor | None = None,
        shape_ids: torch.Tensor | None = None,
        hash_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Put the features of a batch's distinct words on their sub-words.

        Features of the batch's U distinct words -- char_ids (U, K), shape_ids (U,), hash_ids (U, F) -- put on
        every sub-word: token_word (B, T) is each sub-word's distinct word, -1 off words -> (B, T, C).

        Each distinct word is computed once: in a batch of CoNLL + SST-2 sentences about half the words are
        repeats ('the', ',', '.').
        """
        vectors = 0.0
        if self.char_emb is not None:
            c = self.conv(self.char_emb(char_ids).transpose(1, 2))  # (U, 2D, K)
            c = c.masked_fill(char_ids.unsqueeze(1) == 0, -1e4).amax(-1)  # (U, 2D): max over the word's characters
            vectors = vectors + self.char_proj(F.gelu(c))  # (U, C)
        if self.shape_emb is not None:
            vectors = vectors + self.shape_emb(shape_ids)
        if self.hash_emb is not None:
            if self.training and self.hash_dropout:
                hash_ids = self.drop_word_identity(hash_ids)
            vectors = vectors + self.hash_proj(self.hash_emb(hash_ids).sum(-2))
        U = vectors.shape[0]
        vectors = F.pad(vectors, (0, 0, 0, 1))  # (U + 1, C): a zero last row for the sub-words of no word
        # an embedding lookup, not vectors[token_word]: on a CPU the latter's backward adds repeated rows up in a
        # thread-dependent order, so one batch's gradients would differ between runs in the last bits
        return F.embedding(torch.where(token_word >= 0, token_word, U), vectors)  # (B, T, C)

    def drop_word_identity(self, hash_ids: torch.Tensor) -> torch.Tensor:
        """Hashed features with the word's own identity dropped for a random share of words.

        hash_ids (U, F) with the features naming the word itself set to padding (a zero vector) for a random
        ``hash_dropout`` of the U distinct words: those words look unseen, their affixes still there."""
        dropped = torch.rand(hash_ids.shape[0], device=hash_ids.device) < self.hash_dropout  # (U,)
        identity = torch.zeros_like(hash_ids, dtype=torch.bool)
        identity[:, :WORD_IDENTITY_FEATURES] = True
        return hash_ids.masked_fill(identity & dropped.unsqueeze(1), 0)  # (U, F)
