"""The teacher's labelling: every text's targets (and states) computed once into the target cache, shared out
between the processes of a launch.

Every process first looks at the cache as it is (then waits for the others, so all see the same texts missing);
each labels every world-th of the missing texts, longest first (``processes.deal``: the rule of a frozen trunk's
state precompute, so the shares do not overlap and cost about the same), writes its shards into the shared cache
folder, and waits for the others; it then reads their shards. One process labels every text. What n processes gain
in time is the machine's (two on a 2-core AVX2 CPU: 1.2x, docs/distillation.md). A text whose shard is unreadable
when read back is labelled again by the process that misses it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from mtl_decoder.config import CLASSIFICATION, TAGGING, DistillConfig
from mtl_decoder.distill.states import SENTENCE_STATES_SUFFIX, STATE_PART, STATES_SUFFIX, check_states, task_of
from mtl_decoder.distill.targets import Item, TargetStore, TeacherLabeller, default_cache_root
from mtl_decoder.distill.targets import text_key as key_of
from mtl_decoder.processes import deal
from mtl_decoder.saved import load_model

LABEL_BATCHES = 4096
"""At most this many texts labelled between two writes of the target cache (a killed labelling keeps what it
finished)."""
LABEL_WORDS = 50_000
"""At most this many words between two writes, too: texts are labelled longest first, and 4096 of the longest
news texts are over 200,000 words, about 20 minutes of a float32 SmolLM2 teacher's work per process on an AVX2 CPU,
all lost to a kill before the write; 50,000 words were 5-6 minutes of it."""


def quantize_teacher(saved) -> None:
    """The teacher in int8 as ``--precision int8`` runs a saved model: W8A8 where its folder has SmoothQuant scales
    (``mtl-decoder quantize``), else dynamic int8; for CPUs."""
    from mtl_decoder.inference.options import autocast_dtype
    from mtl_decoder.inference.quantize import quantize_int8, use_folder_smoothing

    autocast_dtype("int8", next(saved.model.parameters()).device)  # a UserError on a GPU
    use_folder_smoothing(saved)
    quantize_int8(saved.model)


def item_words(item: Item) -> int:
    """A text's size for dealing the work: its words (raw text: its whitespace-separated pieces)."""
    return len(item) if isinstance(item, list) else len(item.split())


def write_chunks(sizes: Sequence[int], max_texts: int = LABEL_BATCHES, max_words: int = LABEL_WORDS) -> list[range]:
    """The runs of positions labelled between two writes of the cache, in order: each as long as it can be with at
    most ``max_texts`` texts and ``max_words`` words (``sizes``: each text's words), or one text alone when that
    text has more words."""
    chunks, start, words = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start == max_texts or words + size > max_words):
            chunks.append(range(start, i))
            start, words = i, 0
        words += size
    if start < len(sizes):
        chunks.append(range(start, len(sizes)))
    return chunks


def target_shapes(kinds: dict[str, str], label_sets: dict[str, list[str]]) -> dict[str, tuple[int, int]]:
    """Task -> (dimensions, labels) of its targets: a class distribution (1) or a tag distribution per word (2)."""
    return {task: (1 if kind == CLASSIFICATION else 2, len(label_sets[task])) for task, kind in kinds.items()}


def label_texts(
    distill: DistillConfig,
    items: list[Item],
    shapes: dict[str, tuple[int, int]],
    kinds: dict[str, str],
    state_kinds: list[str],
    accelerator: Accelerator,
    progress: bool,
) -> tuple[TargetStore, dict[str, Any], dict[str, TargetStore]]:
    """Every item's targets, from the teacher's cache or computed into it by the processes of the run (each its
    share: ``Labelling``). Returns the target store (every item's targets in memory), the counts (``Labelling.run``)
    and the stores of the teacher's states for each kind of ``state_kinds`` (on disk, none held). ``shapes``:
    ``target_shapes``, checked in every shard read; ``kinds``: task -> kind of the student's tasks."""
    root = Path(distill.cache_dir).expanduser() if distill.cache_dir else default_cache_root()
    suffixes = {TAGGING: STATES_SUFFIX, CLASSIFICATION: SENTENCE_STATES_SUFFIX}
    state_stores = {
        kind: TargetStore(root / f"{distill.teacher_hash}{suffixes[kind]}", check=check_states) for kind in state_kinds
    }
    targets = TargetStore(root / distill.teacher_hash, shapes=shapes)
    counts = Labelling(distill, targets, state_stores, kinds, accelerator).run(items, progress)
    return targets, counts, state_stores


def targets_line(distill: DistillConfig, counts: dict[str, Any]) -> str:
    """What the labelling did, in one line for the log: texts, computed, teacher batches, from the cache."""
    by = f" by {counts['processes']} processes" if counts["processes"] > 1 else ""
    return (
        f"teacher {distill.teacher} ({distill.teacher_hash[:12]}): targets of {counts['texts']:,} texts, "
        f"{counts['computed']:,} computed in {counts['teacher_forwards']} teacher batches{by}, "
        f"{counts['from_cache']:,} from the cache"
    )


class Labelling:
    """The target store and the state stores (by task kind) of one teacher, filled by the processes of a run.

    ``kinds``: task -> kind of the student's tasks (which state store takes a task's states)."""

    def __init__(
        self,
        distill: DistillConfig,
        targets: TargetStore,
        state_stores: dict[str, TargetStore],
        kinds: dict[str, str],
        accelerator: Accelerator,
    ):
        self.distill, self.targets, self.state_stores, self.kinds = distill, targets, state_stores, kinds
        self.stores = [targets, *state_stores.values()]
        self.accelerator = accelerator

    def run(self, items: Sequence[Item], progress: bool) -> dict[str, Any]:
        """Every item's targets in the stores (targets in memory, states on disk only); returns the counts for
        distill.json: texts, computed (by all processes), from_cache, repeated, teacher_forwards (all processes'),
        processes and, when any was computed, seconds (the slowest share's)."""
        acc = self.accelerator
        keys = [key_of(item) for item in items]
        self._read(keys)
        todo = self._missing(keys)
        cached = sum(all(k in store for store in self.stores) for k in keys)
        counts = {"texts": len(items), "computed": len(todo), "from_cache": cached, "teacher_forwards": 0}
        counts["repeated"] = len(items) - len(todo) - cached
        counts["processes"] = acc.num_processes
        if not todo and acc.num_processes == 1:
            return counts
        # Several processes all pass the barriers below, even one that found nothing missing: another run writing
        # to the same cache meanwhile could make the processes see different texts missing, and a process that
        # returned here would leave the others waiting.
        for store in self.stores if todo else ():
            store.disk.check_writable("distill.cache_dir" if self.distill.cache_dir else "the target cache")
        acc.wait_for_everyone()  # every process has seen the texts missing before any writes
        mine = deal(todo, lambda i: item_words(items[i]), acc.process_index, acc.num_processes)
        started = time.perf_counter()
        forwards = self._label(items, keys, mine, progress)
        seconds = time.perf_counter() - started
        acc.wait_for_everyone()  # the others' shards are on disk: index and read them
        mine_keys = {keys[i] for i in mine}
        for store in self.stores:
            store.rescan()
        self._read([keys[i] for i in todo if keys[i] not in mine_keys])
        lost = self._missing(keys)  # a shard unreadable since it was written: labelled again here
        if lost:
            forwards += self._label(items, keys, lost, progress)
            seconds = time.perf_counter() - started
        if acc.num_processes > 1:
            both = torch.tensor([forwards, seconds, len(todo)], dtype=torch.float64, device=acc.device)
            both = acc.gather(both).view(-1, 3)
            forwards, seconds = int(both[:, 0].sum()), float(both[:, 1].max())
            if not both[:, 2].any():  # nothing was missing for any process
                return counts
        counts["teacher_forwards"], counts["seconds"] = forwards, round(seconds, 1)
        return counts

    def _read(self, keys: list[str]) -> None:
        """The targets of ``keys`` read into memory, their states checked on disk (and kept there: they outweigh
        the targets tenfold and are read again, projected, by the trainer); a damaged shard's texts are then
        missing."""
        self.targets.load(keys)
        for store in self.stores[1:]:
            store.verify(keys)

    def _missing(self, keys: list[str]) -> list[int]:
        """The position of the first occurrence of each key absent from a store."""
        todo, seen = [], set()
        for i, k in enumerate(keys):
            if k not in seen and not all(k in store for store in self.stores):
                seen.add(k)
                todo.append(i)
        return todo

    def _label(self, items: Sequence[Item], keys: list[str], todo: list[int], progress: bool) -> int:
        """The teacher's targets of ``items[i]`` for each i of ``todo``, into the stores; returns the teacher's
        batches. The teacher is loaded here, only when there is work."""
        if not todo:
            return 0
        d, acc = self.distill, self.accelerator
        saved = load_model(Path(d.teacher), device=acc.device)
        if d.teacher_precision == "int8":
            quantize_teacher(saved)
        saved.for_inference()  # the teacher reads its trunk's states but never fills the disk or memory with them
        labeller = TeacherLabeller(
            saved,
            saved.config.data.eval_batch_size,
            word_states=TAGGING in self.state_stores,
            sentence_states=CLASSIFICATION in self.state_stores,
        )
        share = f" (this process's share, 1 of {acc.num_processes})" if acc.num_processes > 1 else ""
        bar = tqdm(total=len(todo), desc=f"teacher targets{share}", disable=not progress)
        for chunk in write_chunks([item_words(items[i]) for i in todo]):
            part = todo[chunk.start : chunk.stop]
            for i, targets in zip(part, labeller.label([items[i] for i in part], bar.update), strict=True):
                self._put(keys[i], targets)
            for store in self.stores:
                store.flush()
            for store in self.stores[1:]:
                store.forget()  # on disk now; read again, projected, by the trainer
        bar.close()
        return labeller.forwards

    def _put(self, key: str, targets: dict[str, torch.Tensor]) -> None:
        states = {name: t for name, t in targets.items() if name.endswith(STATE_PART)}
        if key not in self.targets:
            self.targets.put(key, {n: t for n, t in targets.items() if n not in states})
        for kind, store in self.state_stores.items():
            if key not in store:
                store.put(key, {n: t for n, t in states.items() if self.kinds[task_of(n)] == kind})
