"""Teacher targets: what a teacher model says of each text, computed once and kept on disk for later runs.

Per text and teacher task: for tagging, a (W, L) distribution over the tags of each word the teacher read (its
CRF's marginals when it has a CRF, the softmax of its tag scores otherwise); for classification, (L,) class
probabilities. A raw text also keeps its words' character spans (W, 2), so a student whose tokenizer cuts the
text into other words takes each word's targets from the teacher word it starts in (``align``).

Kept like the frozen trunk's state cache: a folder per teacher fingerprint (``teacher_fingerprint``: the hash of
the teacher folder's weights, config, labels and tokenizer), an entry per text key (the hash of the words or the
text), shards of safetensors written whole and renamed into place, never modified, never unpickled.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from mtl_decoder.config import CLASSIFICATION
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.files import atomic_write_safetensors
from mtl_decoder.hashing import cache_root, files_fingerprint, short_digest
from mtl_decoder.model.heads import word_level
from mtl_decoder.saved import SavedModel

SPANS = "spans"
"""The entry of a raw text's word spans (W, 2), beside one entry per task."""
STORE_DTYPE = torch.float16
"""Probabilities are stored in half precision (renormalised when read): half the disk and memory."""
FINGERPRINTED = ("config.yaml", "model.safetensors", "labels.json", "tokenizer.json", "trunk.json")
"""The teacher folder's files whose bytes decide its targets (trunk.json holds a pretrained trunk's hash)."""

Item = str | list[str]
"""A text as the teacher reads it: raw text or a word list."""


def default_cache_root() -> Path:
    return cache_root("targets")


def teacher_fingerprint(folder: str | Path) -> str:
    """The hash of the files of a saved model folder that decide what it predicts."""
    return files_fingerprint(folder, FINGERPRINTED)


def text_key(item: Item) -> str:
    """A word list and the raw text of the same words are different inputs, and get different keys."""
    return short_digest(json.dumps(item, ensure_ascii=False).encode())


class TargetStore:
    """Text key -> {task or SPANS: tensor}, in memory and in a folder of safetensors shards."""

    def __init__(self, directory: Path, flush_every: int = 4096):
        self.directory, self.flush_every = directory, flush_every
        self.shard_of: dict[str, Path] = {}
        self.memory: dict[str, dict[str, torch.Tensor]] = {}
        self.pending: dict[str, dict[str, torch.Tensor]] = {}
        self._indexed: set[Path] = set()
        self.rescan()

    def rescan(self) -> None:
        """Index the shards on disk (other runs or processes may have written some since)."""
        if not self.directory.is_dir():
            return
        for shard in sorted(self.directory.glob("shard-*.safetensors")):
            if shard not in self._indexed:
                with safe_open(str(shard), framework="pt") as f:
                    self.shard_of.update((name.split("/", 1)[0], shard) for name in f.keys())  # noqa: SIM118
                self._indexed.add(shard)

    def __contains__(self, key: str) -> bool:
        return key in self.memory or key in self.shard_of

    def __len__(self) -> int:
        return len(self.memory.keys() | self.shard_of.keys())

    def get(self, key: str) -> dict[str, torch.Tensor]:
        if key not in self.memory:
            self._load_shard(self.shard_of[key])
        return self.memory[key]

    def _load_shard(self, shard: Path) -> None:
        """Every entry of a shard at once (training reads them all), copied out of the file mapping (one mapping
        per tensor would run out of the kernel's map count, as the state cache found)."""
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                key, part = name.split("/", 1)
                self.memory.setdefault(key, {})[part] = f.get_tensor(name).clone()

    def put(self, key: str, targets: dict[str, torch.Tensor]) -> None:
        self.memory[key] = targets
        self.pending[key] = targets
        if len(self.pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """The entries since the last flush as one new shard (written whole, then renamed into place)."""
        if not self.pending:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"shard-{time.time_ns()}-{os.getpid()}.safetensors"
        flat = {f"{key}/{part}": t.contiguous() for key, parts in self.pending.items() for part, t in parts.items()}
        atomic_write_safetensors(final, flat)
        self.shard_of.update(dict.fromkeys(self.pending, final))
        self._indexed.add(final)
        self.pending = {}


class TeacherLabeller:
    """Runs a saved teacher over texts and gives each text's targets; ``forwards`` counts its batches."""

    def __init__(self, saved: SavedModel, batch_size: int):
        self.saved, self.batch_size = saved, batch_size
        self.model = saved.model
        self.tasks = self.model.task_names
        self.collate = collator_for(saved.config.model, saved.encoder.pad_id, {})
        self.device = next(self.model.parameters()).device
        self.forwards = 0

    def label(self, items: Sequence[Item], progress: Callable[[int], None] | None = None) -> list[dict]:
        """Targets of every item, in order (probabilities float16; raw texts with their word spans)."""
        encoded = self.saved.encoder.encode_batch(list(items))
        out: list[dict | None] = [None] * len(items)
        order = sorted(range(len(items)), key=lambda i: len(encoded[i].ids))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            for i, targets in zip(rows, self._run([encoded[i] for i in rows]), strict=True):
                if encoded[i].spans is not None:
                    targets[SPANS] = torch.tensor(encoded[i].spans[: encoded[i].kept_words], dtype=torch.int32)
                out[i] = targets
            if progress is not None:
                progress(len(rows))
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _run(self, encoded: list) -> list[dict[str, torch.Tensor]]:
        batch = self.collate([EncodedExample.unlabelled(e) for e in encoded])
        batch = {k: v.to(self.device) for k, v in batch.items()}
        out = self.model(**batch, tasks=self.tasks)
        self.forwards += 1
        targets: list[dict[str, torch.Tensor]] = [{} for _ in encoded]
        for task in self.tasks:
            rows = out.examples[task].tolist()
            if self.model.task(task).kind == CLASSIFICATION:
                probs = out.logits[task].float().softmax(-1)  # (n, L)
                for r, p in zip(rows, probs, strict=True):
                    targets[r][task] = p.to("cpu", STORE_DTYPE)
                continue
            probs, mask = self.word_distributions(task, out.logits[task], batch["word_read"][out.examples[task]])
            for r, p, n in zip(rows, probs, mask.sum(1).tolist(), strict=True):
                targets[r][task] = p[:n].to("cpu", STORE_DTYPE)  # (W_r, L)
        return targets

    def word_distributions(
        self, task: str, logits: torch.Tensor, word_read: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, W, L) tag distribution of each word (CRF marginals, else the softmax), (n, W) word mask."""
        emissions, _, mask = word_level(logits, word_read)  # read where the teacher's encoder says (alignment)
        crfs = self.model.crfs
        probs = crfs[task].marginals(emissions, mask) if task in crfs else emissions.float().softmax(-1)
        return probs, mask


def align(teacher_spans: torch.Tensor, student_spans: list[tuple[int, int]]) -> list[int]:
    """For each student word of a raw text, the teacher word it starts in (the last teacher word starting at or
    before it); -1 past the words the teacher read (it truncates at its own maximum length)."""
    starts = teacher_spans[:, 0].tolist()
    ends = teacher_spans[:, 1].tolist()
    out = []
    for s, _e in student_spans:
        j = max(0, bisect.bisect_right(starts, s) - 1)
        out.append(j if starts and (j < len(starts) - 1 or s < ends[-1]) else -1)
    return out
