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
from mtl_decoder.data.alignment import WordAlignment
from mtl_decoder.data.tasks import Example
from mtl_decoder.data.tokenization import Encoded, TextEncoder
from mtl_decoder.data.wordfeatures import MAX_WORD_CHARS, N_HASHED, char_ids, hashed_features, shape_id


@dataclass
class EncodedExample:
    ids: list[int]
    word_index: list[int]
    words: list[str]
    labels: dict[str, list[int] | int] = field(default_factory=dict)
    truncated_words: int = 0
    alignment: WordAlignment | None = None
    """Where each word is read (from the encoder); None for a sequence built by hand: every word whole, read at the
    collator's ``word_token``."""

    @classmethod
    def unlabelled(cls, enc: Encoded) -> EncodedExample:
        """An encoded input to predict on (no labels), with the encoder's alignment."""
        al = enc.alignment
        return cls(enc.ids, enc.word_index, enc.words, truncated_words=al.truncated_words, alignment=al)


def encode_example(
    ex: Example, encoder: TextEncoder, label_ids: dict[str, dict[str, int]], kinds: dict[str, str]
) -> EncodedExample:
    """An example's ids and labels: each word's tag at the position the encoder's alignment reads it from."""
    enc = encoder.encode_words(ex.words) if ex.words is not None else encoder.encode_text(ex.text)
    labels: dict[str, list[int] | int] = {}
    for task, value in ex.labels.items():
        ids = label_ids[task]
        if kinds[task] == TAGGING:
            labels[task] = enc.alignment.labels([ids[t] for t in value])
        else:
            labels[task] = ids[value]
    return EncodedExample(
        enc.ids, enc.word_index, enc.words, labels, enc.alignment.truncated_words, alignment=enc.alignment
    )


class MultiTaskDataset(torch.utils.data.Dataset):
    """The encoded examples of all training sources, source after source."""

    def __init__(self, sources: list[list[EncodedExample]], weights: list[float] | None = None):
        self.examples = [ex for src in sources for ex in src]
        self.source_sizes = [len(src) for src in sources]
        self.source_weights = list(weights) if weights is not None else [1.0] * len(sources)
        """How much batches draw on each source (its tasks' ``sampling_weight``; 1 for a distillation's unlabelled
        files), on top of ``data.sampling`` (checked by the sampler that reads them)."""
        self.lengths = np.array([len(ex.ids) for ex in self.examples], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> EncodedExample:
        return self.examples[index]


def source_probabilities(
    sizes: list[int], strategy: str, temperature: float = 2.0, weights: list[float] | None = None
) -> np.ndarray:
    """Chance that a drawn example comes from each source: the strategy's share times the source's weight."""
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    if strategy == "proportional":
        share = sizes_arr
    elif strategy == "temperature":
        share = sizes_arr ** (1.0 / temperature)
    elif strategy == "round_robin":
        share = np.ones_like(sizes_arr)
    else:
        raise ValueError(f"unknown sampling strategy {strategy!r}")
    if weights is not None:
        share = share * np.asarray(weights, dtype=np.float64)
    return share / share.sum()


def weighted_turns(weights: list[float], slots: int) -> np.ndarray:
    """(slots,) the source of each of ``slots`` consecutive slots, taken in turn by weight (stride scheduling).

    Source k's i-th turn falls at time (i + 1/2) / w_k and the slots go to the turns in time order, ties to the
    lower source: equal weights give plain turns (slot j to source j % k), and after any number of slots each
    source holds its weight's share of them to within one slot."""
    w = np.asarray(weights, dtype=np.float64)
    turns = np.ceil(slots * w / w.sum()).astype(np.int64) + 1  # enough turns of every source to fill the slots
    times = np.concatenate([(np.arange(n) + 0.5) / wk for n, wk in zip(turns, w, strict=True)])
    source = np.repeat(np.arange(len(w)), turns)
    order = np.lexsort((source, times))[:slots]  # by time, then by source
    return source[order]


_MIX, _ORDER, _SHUFFLE = 0, 1, 2
"""Tags that keep the sampler's random streams apart: each batch's mix, each source's order, the batch order."""


class MultiTaskBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches that mix the task sources, deterministic given (seed, epoch).

    Mix: how many examples of each source a batch holds is drawn by the strategy: 'round_robin' takes the
    sources in turn (two sources and an even batch size: exactly half each; with ``weights``, turns in proportion
    to them, ``weighted_turns``), 'proportional' and 'temperature' draw each example's source independently (with
    ``weights``, in proportion to the strategy's share times the weight). Length grouping never changes a batch's
    mix.

    Order: each source has one stream of examples, whole shuffled passes one after another, that continues
    across epochs; an epoch takes the next examples of every stream. A source drawn fewer times per epoch than
    its size is thus seen whole, every example once before any twice (up to the reordering inside one window of
    batches). Where each stream stands at epoch e is recomputed from the draws of the epochs before it, so a
    fresh sampler set to epoch e yields what an unbroken run does, and ``skip_first_batches`` resumes exactly.

    Length grouping (``lengths`` given, ``group_by_length``): within each window of ``window`` batches, every
    source's examples are sorted by length and cut into consecutive runs, one per batch in turn, so a batch's
    short sentences of one task go with short ones of the other; then the window's batches are shuffled.
    """

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
        weights: list[float] | None = None,
    ):
        self.sizes = list(source_sizes)
        if not self.sizes or min(self.sizes) <= 0:
            raise ValueError(f"every source needs at least one example, got sizes {self.sizes}")
        self.weights = list(weights) if weights is not None else [1.0] * len(self.sizes)
        if len(self.weights) != len(self.sizes) or min(self.weights) <= 0:
            raise ValueError(f"need one positive weight per source, got {self.weights} for sizes {self.sizes}")
        self.offsets = np.cumsum([0, *self.sizes[:-1]])
        self.batch_size, self.strategy, self.temperature = batch_size, strategy, temperature
        self.probabilities = source_probabilities(self.sizes, strategy, temperature, self.weights)
        self.lengths = lengths if group_by_length else None
        self.seed, self.epoch, self.window = seed, 0, window
        self.num_batches = num_batches or math.ceil(sum(self.sizes) / batch_size)
        self._starts: list[np.ndarray] = [np.zeros(len(self.sizes), dtype=np.int64)]
        """_starts[e]: how far each source's stream had gone when epoch e began."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def batch_mix(self, epoch: int) -> np.ndarray:
        """(num_batches, sources): how many examples of each source every batch of ``epoch`` holds."""
        n, b, k = self.num_batches, self.batch_size, len(self.sizes)
        if self.strategy == "round_robin":  # the epoch's slots taken in turn by weight, batch after batch
            turns = weighted_turns(self.weights, n * b).reshape(n, b)
            return (turns[:, :, None] == np.arange(k)).sum(axis=1)
        rng = np.random.default_rng([self.seed, _MIX, epoch])
        return rng.multinomial(b, self.probabilities, size=n)

    def stream_starts(self, epoch: int) -> np.ndarray:
        """How many examples of each source the epochs before ``epoch`` drew: where its stream resumes."""
        while len(self._starts) <= epoch:
            e = len(self._starts) - 1
            self._starts.append(self._starts[e] + self.batch_mix(e).sum(axis=0))
        return self._starts[epoch]

    def stream(self, source: int, start: int, count: int) -> np.ndarray:
        """A stretch of one source's stream of dataset indices.

        Dataset indices ``start .. start + count`` of a source's stream: pass p is a permutation drawn from
        (seed, source, p), so any stretch of the stream can be made without the passes before it."""
        size = self.sizes[source]
        if count <= 0:
            return np.empty(0, dtype=np.int64)
        first, last = start // size, (start + count - 1) // size
        passes = [
            np.random.default_rng([self.seed, _ORDER, source, p]).permutation(size) for p in range(first, last + 1)
        ]
        skip = start - first * size
        return self.offsets[source] + np.concatenate(passes)[skip : skip + count]

    def __iter__(self):
        mix = self.batch_mix(self.epoch)
        starts = self.stream_starts(self.epoch)
        streams = [self.stream(k, int(starts[k]), int(mix[:, k].sum())) for k in range(len(self.sizes))]
        rng = np.random.default_rng([self.seed, _SHUFFLE, self.epoch])
        window = self.window if self.lengths is not None else self.num_batches
        taken = np.zeros(len(self.sizes), dtype=np.int64)
        for lo in range(0, self.num_batches, window):
            counts = mix[lo : lo + window]  # (batches in the window, sources)
            runs = []
            for k, stream in enumerate(streams):
                part = stream[taken[k] : taken[k] + counts[:, k].sum()]
                taken[k] += len(part)
                if self.lengths is not None:  # stable: equal lengths keep the stream's random order
                    part = part[np.argsort(self.lengths[part], kind="stable")]
                runs.append(np.split(part, np.cumsum(counts[:-1, k])))
            batches = [np.concatenate([runs[k][j] for k in range(len(streams))]) for j in range(len(counts))]
            order = rng.permutation(len(batches)) if self.lengths is not None else range(len(batches))
            for j in order:
                yield batches[j].tolist()


def collator_for(model_cfg: ModelConfig, pad_id: int, task_kinds: dict[str, str]) -> Collator:
    """The collator that gives a model the per-word inputs its config asks for."""
    word_features = bool(model_cfg.char_embedding or model_cfg.word_features)
    return Collator(pad_id, task_kinds, word_features, model_cfg.word_hash_buckets, model_cfg.word_token_position)


def drop_words(input_ids: torch.Tensor, word_index: torch.Tensor, p: float, unk_id: int) -> torch.Tensor:
    """Word dropout on a batch's sub-word ids.

    Word dropout: every sub-word of a dropped word becomes [UNK] (its label is kept). Draws from the torch
    RNG, so the trainer calls it in step order and a resumed run draws what an unbroken one would."""
    W = int(word_index.max()) + 1
    if W <= 0:
        return input_ids
    dropped = torch.rand(word_index.shape[0], W, device=word_index.device) < p
    hit = (word_index >= 0) & dropped.gather(1, word_index.clamp(min=0))
    return input_ids.masked_fill(hit, unk_id)


@functools.lru_cache(maxsize=1 << 18)
def word_feature_row(word: str, hash_buckets: int) -> tuple[list[int], int, list[int]]:
    """The character, shape and hashed features of one word.

    (character ids padded to MAX_WORD_CHARS, shape class, hashed features) of a word; cached, since the same
    words come back batch after batch (the caller must not modify the lists)."""
    chars = char_ids(word)
    hashed = hashed_features(word, hash_buckets) if hash_buckets else []
    return chars + [0] * (MAX_WORD_CHARS - len(chars)), shape_id(word), hashed


class Collator:
    """Pads a list of encoded examples into the model's batch: ids, masks, read positions, word features, labels.

    ``word_features``: add per-word character ids and shape classes; ``hash_buckets``: also the hashed sparse
    features of each word (0 = off). Features are computed once per distinct word (``word_feature_row``).
    ``word_token``: where the words of examples without an alignment are read ('first' or 'last').
    """

    def __init__(
        self,
        pad_id: int,
        task_kinds: dict[str, str],
        word_features: bool = False,
        hash_buckets: int = 0,
        word_token: str = "first",
    ):
        self.pad_id, self.task_kinds = pad_id, task_kinds
        self.word_features, self.hash_buckets = word_features, hash_buckets
        self.word_token = word_token

    def __call__(self, examples: list[EncodedExample]) -> dict[str, Any]:
        T = max(len(ex.ids) for ex in examples)
        # one tensor from padded lists: far cheaper than a small tensor per example
        input_ids = torch.tensor([[*ex.ids, *[self.pad_id] * (T - len(ex.ids))] for ex in examples], dtype=torch.long)
        word_index = torch.tensor([[*ex.word_index, *[-1] * (T - len(ex.ids))] for ex in examples], dtype=torch.long)
        lengths = torch.tensor([len(ex.ids) for ex in examples])
        attention_mask = torch.arange(T) < lengths[:, None]  # (B, T)
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "word_index": word_index,
            "word_read": self._word_read(examples),
        }
        labels = self._labels(examples, T)
        if labels:
            batch["labels"] = labels
        if self.word_features or self.hash_buckets:
            batch.update(self._word_features(examples, T))
        return batch

    def _word_read(self, examples: list[EncodedExample]) -> torch.Tensor:
        """(B, W): the position each tagged word of an example is read from, in word order; -1 past its words."""
        reads = [
            (ex.alignment or WordAlignment.from_word_index(ex.word_index, self.word_token)).reads for ex in examples
        ]
        W = max([1, *(len(r) for r in reads)])
        return torch.tensor([[*r, *[-1] * (W - len(r))] for r in reads], dtype=torch.long)

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
        """Features of each distinct word of a batch.

        Features of each distinct word of the batch, computed once however often it occurs: (U, K)
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
