"""Multi-task batches: encoded examples, a batch sampler that mixes task sources, and the collator.

The sampler yields lists of dataset indices, so Accelerate's ``prepare`` can shard the batches across
processes and ``skip_first_batches`` can resume mid-epoch; it is deterministic given (seed, epoch).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mtl_decoder.config import TAGGING, ModelConfig
from mtl_decoder.data.tasks import Example
from mtl_decoder.data.tokenization import TextEncoder, word_labels
from mtl_decoder.data.wordfeatures import MAX_WORD_CHARS, N_HASHED, char_ids, hashed_features, shape_id


@dataclass
class EncodedExample:
    ids: list[int]
    word_index: list[int]
    words: list[str]
    labels: dict[str, list[int] | int] = field(default_factory=dict)
    truncated_words: int = 0


def encode_example(
    ex: Example, encoder: TextEncoder, label_ids: dict[str, dict[str, int]], kinds: dict[str, str]
) -> EncodedExample:
    enc = encoder.encode_words(ex.words) if ex.words is not None else encoder.encode_text(ex.text)
    labels: dict[str, list[int] | int] = {}
    for task, value in ex.labels.items():
        ids = label_ids[task]
        labels[task] = word_labels(enc, [ids[t] for t in value]) if kinds[task] == TAGGING else ids[value]
    return EncodedExample(enc.ids, enc.word_index, enc.words, labels, len(enc.words) - enc.kept_words)


class MultiTaskDataset(torch.utils.data.Dataset):
    """The encoded examples of all training sources, source after source."""

    def __init__(self, sources: list[list[EncodedExample]]):
        self.examples = [ex for src in sources for ex in src]
        self.source_sizes = [len(src) for src in sources]
        self.lengths = np.array([len(ex.ids) for ex in self.examples], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> EncodedExample:
        return self.examples[index]


def source_probabilities(sizes: list[int], strategy: str, temperature: float = 2.0) -> np.ndarray:
    """Chance that a drawn example comes from each source."""
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    if strategy == "proportional":
        weights = sizes_arr
    elif strategy == "temperature":
        weights = sizes_arr ** (1.0 / temperature)
    elif strategy == "round_robin":
        weights = np.ones_like(sizes_arr)
    else:
        raise ValueError(f"unknown sampling strategy {strategy!r}")
    return weights / weights.sum()


class MultiTaskBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches that mix the sources: each example's source is drawn by the strategy ('round_robin' takes the
    sources in turn); within a source, examples come without replacement in a fresh order each pass."""

    def __init__(
        self,
        source_sizes: list[int],
        batch_size: int,
        strategy: str = "proportional",
        temperature: float = 2.0,
        lengths: np.ndarray | None = None,
        group_by_length: bool = True,
        seed: int = 0,
        num_batches: int | None = None,
        window: int = 64,
    ):
        self.sizes = list(source_sizes)
        self.offsets = np.cumsum([0, *self.sizes[:-1]])
        self.batch_size, self.strategy, self.temperature = batch_size, strategy, temperature
        self.lengths = lengths if group_by_length else None
        self.seed, self.epoch, self.window = seed, 0, window
        self.num_batches = num_batches or math.ceil(sum(self.sizes) / batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def draw_sources(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if self.strategy == "round_robin":
            return np.arange(count) % len(self.sizes)
        return rng.choice(
            len(self.sizes), size=count, p=source_probabilities(self.sizes, self.strategy, self.temperature)
        )

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        count = self.num_batches * self.batch_size
        sources = self.draw_sources(rng, count)
        indices = np.empty(count, dtype=np.int64)
        for k, size in enumerate(self.sizes):
            picks = np.flatnonzero(sources == k)
            passes = math.ceil(len(picks) / size) if len(picks) else 0
            order = np.concatenate([rng.permutation(size) for _ in range(passes)]) if passes else np.empty(0, int)
            indices[picks] = self.offsets[k] + order[: len(picks)]
        batches = indices.reshape(self.num_batches, self.batch_size)
        if self.lengths is not None:
            batches = self._group_by_length(batches, rng)
        for batch in batches:
            yield batch.tolist()

    def _group_by_length(self, batches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Within each window of batches, sort examples by length, re-cut, and shuffle the batch order."""
        out = []
        for start in range(0, len(batches), self.window):
            chunk = batches[start : start + self.window].reshape(-1)
            order = np.lexsort((rng.random(len(chunk)), self.lengths[chunk]))
            regrouped = chunk[order].reshape(-1, self.batch_size)
            out.append(regrouped[rng.permutation(len(regrouped))])
        return np.concatenate(out)


def collator_for(model_cfg: ModelConfig, pad_id: int, task_kinds: dict[str, str]) -> Collator:
    """The collator that gives a model the per-word inputs its config asks for."""
    word_features = bool(model_cfg.char_embedding or model_cfg.word_features)
    return Collator(pad_id, task_kinds, word_features, model_cfg.word_hash_buckets)


def drop_words(input_ids: torch.Tensor, word_index: torch.Tensor, p: float, unk_id: int) -> torch.Tensor:
    """Word dropout: every sub-word of a dropped word becomes [UNK] (its label is kept). Draws from the torch
    RNG, so the trainer calls it in step order and a resumed run draws what an unbroken one would."""
    W = int(word_index.max()) + 1
    if W <= 0:
        return input_ids
    dropped = torch.rand(word_index.shape[0], W, device=word_index.device) < p
    hit = (word_index >= 0) & dropped.gather(1, word_index.clamp(min=0))
    return input_ids.masked_fill(hit, unk_id)


@functools.lru_cache(maxsize=1 << 18)
def word_feature_row(word: str, hash_buckets: int) -> tuple[list[int], int, list[int]]:
    """(character ids padded to MAX_WORD_CHARS, shape class, hashed features) of a word; cached, since the same
    words come back batch after batch (the caller must not modify the lists)."""
    chars = char_ids(word)
    hashed = hashed_features(word, hash_buckets) if hash_buckets else []
    return chars + [0] * (MAX_WORD_CHARS - len(chars)), shape_id(word), hashed


class Collator:
    """Pads a list of encoded examples into the model's batch: ids, masks, word features and labels.

    ``word_features``: add per-word character ids and shape classes; ``hash_buckets``: also the hashed sparse
    features of each word (0 = off). Features are computed once per distinct word (``word_feature_row``).
    """

    def __init__(self, pad_id: int, task_kinds: dict[str, str], word_features: bool = False, hash_buckets: int = 0):
        self.pad_id, self.task_kinds = pad_id, task_kinds
        self.word_features, self.hash_buckets = word_features, hash_buckets

    def __call__(self, examples: list[EncodedExample]) -> dict[str, Any]:
        T = max(len(ex.ids) for ex in examples)
        # one tensor from padded lists: far cheaper than a small tensor per example
        input_ids = torch.tensor([[*ex.ids, *[self.pad_id] * (T - len(ex.ids))] for ex in examples], dtype=torch.long)
        word_index = torch.tensor([[*ex.word_index, *[-1] * (T - len(ex.ids))] for ex in examples], dtype=torch.long)
        lengths = torch.tensor([len(ex.ids) for ex in examples])
        attention_mask = torch.arange(T) < lengths[:, None]  # (B, T)
        batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "word_index": word_index}
        labels = self._labels(examples, T)
        if labels:
            batch["labels"] = labels
        if self.word_features or self.hash_buckets:
            batch.update(self._word_features(examples, T))
        return batch

    def _labels(self, examples: list[EncodedExample], T: int) -> dict[str, torch.Tensor]:
        labels = {}
        for task, kind in self.task_kinds.items():
            if not any(task in ex.labels for ex in examples):
                continue
            if kind == TAGGING:
                rows = [ex.labels.get(task, []) for ex in examples]
                out = torch.tensor([[*row, *[-100] * (T - len(row))] for row in rows], dtype=torch.long)
            else:
                out = torch.tensor([ex.labels.get(task, -100) for ex in examples], dtype=torch.long)
            labels[task] = out
        return labels

    def _word_features(self, examples: list[EncodedExample], T: int) -> dict[str, torch.Tensor]:
        """Features of each distinct word of the batch, computed once however often it occurs: (U, K)
        character ids, (U,) shape classes, (U, N_HASHED) hashed features; and ``token_word`` (B, T), the
        distinct word each sub-word belongs to (-1: special token or padding)."""
        slot: dict[str, int] = {}
        token_word = []
        for ex in examples:
            kept = max(ex.word_index, default=-1) + 1
            ids = [slot.setdefault(w, len(slot)) for w in ex.words[:kept]]
            row = [ids[w] if w >= 0 else -1 for w in ex.word_index]
            token_word.append(row + [-1] * (T - len(row)))
        rows = [word_feature_row(w, self.hash_buckets) for w in slot]
        out = {
            "token_word": torch.tensor(token_word, dtype=torch.long),
            "char_ids": torch.tensor([f[0] for f in rows], dtype=torch.long).view(len(rows), MAX_WORD_CHARS),
            "shape_ids": torch.tensor([f[1] for f in rows], dtype=torch.long),
        }
        if self.hash_buckets:
            out["hash_ids"] = torch.tensor([f[2] for f in rows], dtype=torch.long).view(len(rows), N_HASHED)
        return out
