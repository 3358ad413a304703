"""Teacher targets: what a teacher model says of each text, computed once and kept on disk for later runs.

Per text and teacher task: for tagging, a (W, L) distribution over the tags of each word the teacher read (its
CRF's marginals when it has a CRF, the softmax of its tag scores otherwise); for classification, (L,) class
probabilities. A raw text also keeps its words' character spans (W, 2), so a student whose tokenizer cuts the
text into other words takes each word's targets from the teacher word it starts in (``align``).

Kept like the frozen trunk's state cache: a folder per teacher fingerprint (``teacher_fingerprint``: the hash of
the teacher folder's weights, config, labels and tokenizer), an entry per text key (the hash of the words or the
text), shards of safetensors written whole and renamed into place, never modified, never unpickled, each checked
when read (``check_targets``): a damaged shard is set aside and its texts labelled again.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

from mtl_decoder.config import CLASSIFICATION
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.distill.states import state_part
from mtl_decoder.hashing import cache_root, files_fingerprint, short_digest
from mtl_decoder.model.heads import word_level
from mtl_decoder.saved import SavedModel
from mtl_decoder.tensorstore import ShardedStore

SPANS = "spans"
"""The entry of a raw text's word spans (W, 2), beside one entry per task."""
STORE_DTYPE = torch.float16
"""Probabilities are stored in half precision (renormalised when read): half the disk and memory."""
FINGERPRINTED = ("config.yaml", "model.safetensors", "labels.json", "tokenizer.json", "trunk.json")
"""The teacher folder's files whose bytes decide its targets (trunk.json holds a pretrained trunk's hash)."""

Item = str | list[str]
"""A text as the teacher reads it: raw text or a word list."""
Transform = Callable[[str, torch.Tensor], torch.Tensor]
"""What a store applies to each part (its name, its tensor) as a shard is read."""


def default_cache_root() -> Path:
    return cache_root("targets")


def teacher_fingerprint(folder: str | Path, precision: str = "fp32") -> str:
    """The hash of the files of a saved model folder that decide what it predicts at ``precision``: for int8 also
    its SmoothQuant scales (smoothquant.safetensors, where ``mtl-decoder quantize`` stored them), and the precision
    itself, so an int8 teacher's targets never mix with its float32 ones."""
    if precision == "fp32":
        return files_fingerprint(folder, FINGERPRINTED)
    from mtl_decoder.inference.smoothquant import SCALES_FILE

    return short_digest(f"{precision}:{files_fingerprint(folder, (*FINGERPRINTED, SCALES_FILE))}".encode())


def text_key(item: Item) -> str:
    """A word list and the raw text of the same words are different inputs, and get different keys."""
    return short_digest(json.dumps(item, ensure_ascii=False).encode())


ROW_SUM_TOLERANCE = 0.02
"""How far a stored probability row may sum from 1 (float16 rounds each of its values by up to 2**-11)."""


def check_targets(tensors: dict[str, torch.Tensor], shapes: dict[str, tuple[int, int]] | None = None) -> str | None:
    """Why tensors read from a target shard are not targets, or None.

    Each task part: float16 probabilities whose
    rows sum to 1, of ``shapes[task]`` = (dimensions, labels) for the tasks it names ((L,) a class, (W, L) tags),
    which every entry holds; each SPANS part: (W, 2) int32 character spans."""
    parts: dict[str, set[str]] = {}
    for name, t in tensors.items():
        key, _, part = name.partition("/")
        parts.setdefault(key, set()).add(part)
        if part == SPANS:
            if t.dtype != torch.int32 or t.dim() != 2 or t.shape[1] != 2 or bool((t < 0).any()):
                return f"'{name}' is not (words, 2) int32 character spans"
            continue
        dims, labels = (shapes or {}).get(part, (t.dim(), t.shape[-1] if t.dim() else 0))
        if not part or t.dtype != STORE_DTYPE or t.dim() not in (1, 2) or (t.dim(), t.shape[-1]) != (dims, labels):
            want = "(labels,)" if dims == 1 else "(words, labels)"
            return f"'{name}' is a {tuple(t.shape)} {t.dtype} tensor, not {want} {STORE_DTYPE} with {labels} labels"
        rows = t.float().reshape(-1, labels)
        if bool((rows < 0).any()) or bool(((rows.sum(-1) - 1).abs() > ROW_SUM_TOLERANCE).any()):
            return f"'{name}' holds rows that are not probabilities (each in [0, 1], summing to 1)"
    for key, found in parts.items():
        missing = sorted(set(shapes or {}) - found)
        if missing:
            return f"entry '{key}' has no targets for {', '.join(missing)}"
    return None


class TargetStore:
    """The teacher targets by text, in memory and on disk.

    Text key -> {task or SPANS: tensor}, in memory and in a folder of safetensors shards (``ShardedStore``,
    every shard checked with ``check_targets`` when read). ``shapes``: task -> (dimensions, labels) of the
    targets read (1: a class, 2: tags), checked in every shard; ``check``: another check instead (the teacher's
    word states, ``states.check_states``)."""

    def __init__(
        self,
        directory: Path,
        flush_every: int = 4096,
        shapes: dict[str, tuple[int, int]] | None = None,
        check: Callable[[dict[str, torch.Tensor]], str | None] | None = None,
    ):
        self.directory, self.flush_every = directory, flush_every
        self.memory: dict[str, dict[str, torch.Tensor]] = {}
        self.pending: dict[str, dict[str, torch.Tensor]] = {}
        self.disk = ShardedStore(directory, check or (lambda tensors: check_targets(tensors, shapes)))

    def rescan(self) -> None:
        """Index the shards on disk (other runs or processes may have written some since)."""
        self.disk.rescan()

    def __contains__(self, key: str) -> bool:
        return key in self.memory or key in self.disk

    def __len__(self) -> int:
        return len(self.memory.keys() | self.disk.keys())

    def get(self, key: str) -> dict[str, torch.Tensor]:
        if key not in self.memory:
            self._load_shard(self.disk.location[key])
        return self.memory[key]

    def load(self, keys: list[str], transform: Transform | None = None) -> None:
        """Read every shard that holds one of the keys.

        Read (and so check) every shard holding one of ``keys``: an entry of a damaged shard is then absent and
        is computed again, before any training relies on it. ``transform`` (part name, tensor) -> tensor is
        applied as each shard is read, so only the transformed tensors are kept (one shard's worth of the stored
        ones in memory at a time)."""
        for shard in self._shards_of(keys):
            self._load_shard(shard, transform)

    def verify(self, keys: list[str]) -> None:
        """Check every shard holding one of ``keys`` as ``load`` does (a damaged one is set aside, its entries then
        absent), keeping nothing in memory."""
        for shard in self._shards_of(keys):
            self.disk.read_shard(shard)

    def scan(self, keys: Iterable[str]) -> Iterator[dict[str, torch.Tensor]]:
        """The entry of each key, in order (a key again: its entry again). Absent keys are skipped.

        Each shard is read (and checked) once per scan, the first time a key needs it, and its entries are kept
        as views of its mapping until the scan ends: they sit in the page cache, not in this process's own memory
        (``ShardedStore.read_shard``). Nothing is added to ``memory``. Keys in text order rarely follow the shards
        (the teacher labels texts in batches of similar length): reading a shard again for every key that moves
        to another one took about 0.3 s a key, hours for the 80k training texts' states that labelling took 25
        minutes to write."""
        shards: dict[Path, dict[str, dict[str, torch.Tensor]]] = {}
        for key in keys:
            if key in self.memory:
                yield self.memory[key]
                continue
            where = self.disk.location.get(key)
            if where is None:
                continue
            if where not in shards:
                shards[where] = _entries(self.disk.read_shard(where) or {})
            if key in shards[where]:
                yield shards[where][key]

    def forget(self) -> None:
        """Drop every entry held in memory (they stay on disk; pending ones are written first)."""
        self.flush()
        self.memory = {}

    def _shards_of(self, keys: list[str]) -> list[Path]:
        return sorted({self.disk.location[k] for k in keys if k not in self.memory and k in self.disk})

    def _load_shard(self, shard: Path, transform: Transform | None = None) -> None:
        """Every entry of a shard at once (training reads them all); nothing when the shard is damaged."""
        for key, parts in _entries(self.disk.read_shard(shard) or {}).items():
            if transform is not None:
                parts = {part: transform(part, t) for part, t in parts.items()}
            self.memory.setdefault(key, {}).update(parts)

    def put(self, key: str, targets: dict[str, torch.Tensor]) -> None:
        self.memory[key] = targets
        self.pending[key] = targets
        if len(self.pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """The entries since the last flush as one new shard (written whole, then renamed into place)."""
        if not self.pending:
            return
        self.disk.write({f"{key}/{part}": t for key, parts in self.pending.items() for part, t in parts.items()})
        self.pending = {}


def _entries(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """A shard's tensors ('KEY/PART') by entry: key -> {part: tensor}."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        key, part = name.split("/", 1)
        out.setdefault(key, {})[part] = t
    return out


class TeacherLabeller:
    """Runs a saved teacher over texts and gives each text's targets; ``forwards`` counts its batches.

    ``word_states``: each tagging task's targets come with its word states (``states.state_part``: the (W, D) state
    its head reads at each word); ``sentence_states``: each classification task's with its (1, D) pooled state."""

    def __init__(self, saved: SavedModel, batch_size: int, word_states: bool = False, sentence_states: bool = False):
        self.saved, self.batch_size = saved, batch_size
        self.word_states, self.sentence_states = word_states, sentence_states
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
        out = self.model(**batch, tasks=self.tasks, keep_hidden=self.word_states or self.sentence_states)
        self.forwards += 1
        targets: list[dict[str, torch.Tensor]] = [{} for _ in encoded]
        for task in self.tasks:
            rows = out.examples[task].tolist()
            if self.model.task(task).kind == CLASSIFICATION:
                probs = out.logits[task].float().softmax(-1)  # (n, L)
                for r, p in zip(rows, probs, strict=True):
                    targets[r][task] = p.to("cpu", STORE_DTYPE)
                if self.sentence_states:  # the pooled state the head reads, as one (1, D) "word"
                    for r, h in zip(rows, out.hidden[task], strict=True):
                        targets[r][state_part(task)] = h[None].to("cpu", STORE_DTYPE)
                continue
            word_read = batch["word_read"][out.examples[task]]
            probs, mask = self.word_distributions(task, out.logits[task], word_read)
            for r, p, n in zip(rows, probs, mask.sum(1).tolist(), strict=True):
                targets[r][task] = p[:n].to("cpu", STORE_DTYPE)  # (W_r, L)
            if self.word_states:
                hidden = word_level(out.hidden[task], word_read)[0]  # (n, W, D): read where the tags are read
                for r, h, n in zip(rows, hidden, mask.sum(1).tolist(), strict=True):
                    targets[r][state_part(task)] = h[:n].to("cpu", STORE_DTYPE)  # (W_r, D)
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
    """The teacher word each student word starts in.

    For each student word of a raw text, the teacher word it starts in (the last teacher word starting at or
    before it); -1 past the words the teacher read (it truncates at its own maximum length)."""
    starts = teacher_spans[:, 0].tolist()
    ends = teacher_spans[:, 1].tolist()
    out = []
    for s, _e in student_spans:
        j = max(0, bisect.bisect_right(starts, s) - 1)
        out.append(j if starts and (j < len(starts) - 1 or s < ends[-1]) else -1)
    return out
