"""Streaming tagging with a KV cache: one continuous text arriving in chunks, tagged word by word.

A causal model's state at a token depends only on the tokens before it, so a stream can be tagged as it arrives:
each layer keeps the keys and values of the tokens seen so far (``mtl_decoder.model.layers.DecoderCache``, allocated
once with room for ``data.max_length`` tokens and filled in place), and only new tokens run through the layers.

When a word's tags are final:

- the tokenizer must have *closed* the word first: a word is closed once the text after it holds a space or the
  start of another word (``New`` is not closed until the space after it arrives, since ``Newcastle`` may follow);
  a closed word's tokens and word features (character CNN, shape, hashed features) never change;
- softmax tagging: a closed word's tag is read at its first (or, ``model.word_token``, last) sub-word, never a lone
  whitespace piece (``data/alignment.py``, the rule ``predict`` reads by), and later
  tokens cannot change it (causal attention), so it is emitted at once, and equals what ``predict`` gives for the
  whole text as one record as long as the text fits in ``data.max_length`` tokens;
- CRF tagging: the best path through a word can change with every later word. With ``lookahead`` N a word is
  emitted once N more words have arrived, with the tag of the Viterbi path over the words not yet emitted, started
  from the tag last emitted (so the emitted sequence is always valid IOB2). N = 0 emits every word at once (the
  best path ending at it); a larger N approaches full-sentence Viterbi (equal to ``predict`` once N reaches the
  number of words), at the cost of N words of delay. At the end of the stream every word left is emitted.

Past the maximum length (the sliding-window policy): when the next word no longer fits in the cache, the stream
starts over from the last ``context`` tokens (whole words, default half of the room): the cache is rewound in place,
the special prefix ([CLS]) and those tokens run through the layers again at positions 1, 2, ..., and the stream
continues after them. The room for text is what ``predict`` leaves a record: ``data.max_length`` minus the special
tokens (``max_length - 2`` with [CLS] ... [SEP]). Words after a restart see at least ``context`` tokens of left
context and at most the room; a restart costs one pass over ``context`` tokens every ``room - context`` tokens
(about twice the per-token work at the default), and the cache never grows.

Pretrained trunks (``model.trunk``) are not supported here: a clear error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtl_decoder.config import TAGGING, parse_task_names
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.errors import UserError
from mtl_decoder.inference.segmenter import Segmenter, Word
from mtl_decoder.saved import SavedModel, load_model


@dataclass
class StreamedWord:
    word: str
    start: int
    """Character offset of the word in the whole stream."""
    end: int
    tags: dict[str, str] = field(default_factory=dict)
    """Tagging task -> the word's tag."""

    def to_dict(self) -> dict[str, Any]:
        return {"word": self.word, "start": self.start, "end": self.end, "tags": dict(self.tags)}


@dataclass
class StreamStats:
    words: int = 0
    tokens: int = 0
    characters: int = 0
    restarts: int = 0
    """Times the stream reached the maximum length and started over from its last ``context`` tokens."""
    seconds: float = 0.0

    def report(self) -> str:
        rate = self.words / self.seconds if self.seconds > 0 else 0.0
        return (
            f"streamed {self.characters:,} characters: {self.words:,} words, {self.tokens:,} tokens, "
            f"{self.restarts:,} restarts at the maximum length; {self.seconds:.1f} s, {rate:,.0f} words/s"
        )


class StreamTagger:
    """A tagger of one continuous text, chunk by chunk.

    Tags one continuous text, chunk by chunk: ``feed(chunk)`` and ``finish()`` return the words whose tags became
    final, in order (see the module doc for when that is)."""

    def __init__(
        self,
        saved: SavedModel,
        tasks: str | list[str] | None = None,
        lookahead: int = 2,
        context: int | None = None,
    ):
        model = saved.model
        if not model.trunk_kind.streams:
            raise UserError(
                f"{saved.directory}: streaming supports the native trunk only; this model has a pretrained trunk "
                f"(model.trunk.pretrained={model.cfg.trunk.pretrained})"
            )
        if model.cfg.attention != "causal":
            raise UserError(
                f"{saved.directory}: --stream needs a causal model (model.attention=causal); this one is "
                "bidirectional, so every later word changes every earlier word's state and nothing can be final "
                "before the text ends: use predict without --stream"
            )
        kinds = {t.name: t.kind for t in model.tasks}
        names = parse_task_names(tasks, list(kinds)) or [t for t in kinds if kinds[t] == TAGGING]
        not_tagging = [t for t in names if kinds[t] != TAGGING]
        if not_tagging:
            raise UserError(
                f"--stream tags words: task '{not_tagging[0]}' classifies whole texts "
                "(choose tagging tasks with --tasks)"
            )
        if not names:
            raise UserError(f"{saved.directory}: the model has no token tagging task to stream")
        if lookahead < 0:
            raise UserError(f"lookahead must be 0 or more words, got {lookahead}")
        self.saved, self.model, self.tasks = saved, model, names
        self.labels = {t: saved.label_sets[t] for t in names}
        self.crf_tasks = [t for t in names if t in model.crfs]
        self.lookahead = lookahead if self.crf_tasks else 0
        encoder = saved.encoder
        probe = encoder.tokenizer.encode("a")
        lead = 0
        while lead < len(probe.ids) and probe.special_tokens_mask[lead]:
            lead += 1
        self.prefix = list(probe.ids[:lead])
        # the special tokens after the text ([SEP]) never run (nothing before them can see them), but their room is
        # kept as predict keeps it: a window of the stream always fits predict's data.max_length as one record
        self.capacity = encoder.max_length - (encoder.n_special - lead)
        room = self.capacity - len(self.prefix)
        if room < 2:
            raise UserError(f"data.max_length {encoder.max_length} leaves no room to stream")
        self.context = room // 2 if context is None else context
        if not 0 <= self.context < room:
            raise UserError(
                f"context must lie in [0, {room - 1}] tokens (data.max_length - special tokens), got {context}"
            )
        self.segmenter = Segmenter(encoder.tokenizer, model.cfg.word_token_position)
        self.collate = collator_for(model.cfg, encoder.pad_id, {})
        self.device = next(model.parameters()).device
        self.cache = model.new_cache(1, self.capacity, names)
        self.history: list[tuple[int, Word | None]] = []
        """The tokens in the cache after the prefix: (id, the word it belongs to or None)."""
        self.pending: list[Word] = []
        """Words run through the model whose tags are not yet final (CRF look-ahead)."""
        self.last_tag: dict[str, int | None] = dict.fromkeys(self.crf_tasks)
        self.words_seen = 0
        self.restarts: list[tuple[int, int]] = []
        """Per restart: (the first word of the kept context, the first word run after it)."""
        self.stats = StreamStats()
        self._started = False

    # ------------------------------------------------------------------------------------------ the stream

    def feed(self, chunk: str) -> list[StreamedWord]:
        """Add text; the words whose tags are now final."""
        self.stats.characters += len(chunk)
        return self._tag(self.segmenter.feed(chunk))

    def finish(self) -> list[StreamedWord]:
        """The end of the text: every word left."""
        out = self._tag(self.segmenter.feed("", final=True))
        return out + self._emit(final=True)

    def _tag(self, words: list[Word]) -> list[StreamedWord]:
        if not words:
            return []
        for w in words:
            w.number = self.words_seen
            self.words_seen += 1
        self._run_words(words)
        return self._emit(final=False)

    @torch.inference_mode()
    def _run_words(self, words: list[Word]) -> None:
        """Run the words' tokens through the model, whole words at a time.

        Run the words' tokens through the model, whole words at a time, restarting from the context when the
        next word does not fit."""
        if not self._started:
            self._run([(i, None) for i in self.prefix], [])
            self._started = True
        group: list[Word] = []
        used = 0
        for w in words:
            n = len(w.ids)
            if used + n > self._free():
                if group:
                    self._run_group(group)
                    group, used = [], 0
                if n > self._free():
                    self._restart(w)
                if n > self._free():  # one word longer than the whole room: its first tokens carry its tags
                    w.ids = w.ids[: self._free()]
                    w.read = min(w.read, len(w.ids) - 1)
            group.append(w)
            used += len(w.ids)
        if group:
            self._run_group(group)

    def _free(self) -> int:
        return self.capacity - int(self.cache.lengths[0])

    def _run_group(self, group: list[Word]) -> None:
        tokens = [(i, w) for w in group for i in w.ids]
        self._run(tokens, group)
        self.stats.tokens += len(tokens)
        self.pending.extend(group)

    def _restart(self, word: Word) -> None:
        """Slide the window to make room for a word that did not fit.

        The sliding window: rewind the cache and run the prefix and the last ``context`` tokens (whole words)
        again, leaving room for ``word``, which did not fit."""
        self.stats.restarts += 1
        room = self.capacity - len(self.prefix)
        keep = min(self.context, max(0, room - len(word.ids)))
        start = len(self.history) - keep
        while 0 < start < len(self.history) and self.history[start][1] is self.history[start - 1][1]:
            start += 1  # a whole word only: start where a word starts
        kept = self.history[start:] if keep else []
        self.restarts.append((kept[0][1].number if kept else word.number, word.number))
        self.cache.reset()
        self.history = []
        self._run([(i, None) for i in self.prefix], [])
        if kept:
            self._run(kept, [])

    def _run(self, tokens: list[tuple[int, Word | None]], emit_for: list[Word]) -> None:
        """One step: ``tokens`` (id, word) through the layers; the tagging emissions of ``emit_for``'s words."""
        ids = [i for i, _ in tokens]
        words = [w for _, w in tokens]
        slot: dict[int, int] = {}
        local = []
        for w in words:
            local.append(-1 if w is None else slot.setdefault(id(w), len(slot)))
        distinct = {slot[id(w)]: w.text for w in words if w is not None}
        example = EncodedExample(ids, local, [distinct[k] for k in range(len(distinct))])
        batch = self.collate([example])
        features = {k: v.to(self.device) for k, v in batch.items() if k not in ("input_ids", "attention_mask")}
        input_ids = batch["input_ids"].to(self.device)
        mask = batch["attention_mask"].to(self.device)
        layout = self.model.route_layout(mask, self.tasks, None)
        h, _ = self.model.encode_step(input_ids, mask, layout, features, self.cache)
        self.history.extend((i, w) for i, w in tokens if w is not None)  # the prefix is not history
        if not emit_for:
            return
        position = {}
        offset = 0
        for w in emit_for:
            position[id(w)] = offset + w.read  # where the segmenter's alignment rule reads the word
            offset += len(w.ids)
        rows = torch.tensor([position[id(w)] for w in emit_for], device=self.device)
        for task in self.tasks:
            route_rows = layout.rows(self.model.head_route(task))
            hidden = self.model.final_norm(h[route_rows][0, rows])  # (W, C): the sub-word each word is read at
            logits = self.model.heads[task](hidden).float()
            for w, row in zip(emit_for, logits, strict=True):
                w.emissions[task] = row

    @torch.inference_mode()
    def _emit(self, final: bool) -> list[StreamedWord]:
        """The pending words whose tags are final.

        All of them without CRF tasks (or at the end); with CRF tasks,
        all but the last ``lookahead``."""
        n = len(self.pending) if final else max(0, len(self.pending) - self.lookahead)
        if n == 0:
            return []
        ready, self.pending = self.pending[:n], self.pending[n:]
        window = ready + self.pending  # the Viterbi window: every word not yet emitted
        out = [StreamedWord(w.text, w.start, w.end) for w in ready]
        for task in self.tasks:
            labels = self.labels[task]
            if task in self.crf_tasks:
                path = self._viterbi(task, torch.stack([w.emissions[task] for w in window]), final)
                self.last_tag[task] = path[n - 1]
                tags = path[:n]
            else:
                tags = [int(w.emissions[task].argmax()) for w in ready]
            for word, tag in zip(out, tags, strict=True):
                word.tags[task] = labels[tag]
        self.stats.words += len(out)
        return out

    def _viterbi(self, task: str, emissions: torch.Tensor, final: bool) -> list[int]:
        """Viterbi decoding continued from the last emitted tag.

        The best path over ``emissions`` (W, L) that continues from the tag last emitted (the CRF's start scores
        before the first word); the end scores only at the end of the stream."""
        prev = self.last_tag[task]
        after = torch.tensor([-1 if prev is None else prev], device=emissions.device)
        mask = torch.ones(1, len(emissions), dtype=torch.bool, device=emissions.device)
        return self.model.crfs[task].decode(emissions.unsqueeze(0), mask, after, end=final)[0]


def stream_tags(
    model: SavedModel | str | Path,
    chunks: Iterable[str],
    tasks: str | list[str] | None = None,
    lookahead: int = 2,
    context: int | None = None,
    device: str | torch.device | None = None,
) -> Iterator[dict[str, Any]]:
    """Tag a text that arrives in chunks.

    Tag a text that arrives in ``chunks`` (strings, the pieces of one continuous text): yields one dict per word,
    ``{"word", "start", "end", "tags": {task: tag}}``, as soon as its tags are final (see the module doc)."""
    saved = model if isinstance(model, SavedModel) else load_model(model, device)
    tagger = StreamTagger(saved, tasks, lookahead, context)
    for chunk in chunks:
        if not isinstance(chunk, str):
            raise UserError(f"stream chunks must be strings, got {type(chunk).__name__}")
        for word in tagger.feed(chunk):
            yield word.to_dict()
    for word in tagger.finish():
        yield word.to_dict()
