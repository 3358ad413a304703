"""Predictions from a trained model for words or raw texts.

The one code path used by training-time
validation, ``evaluate`` and ``predict``, so their numbers agree.

Inputs stream through a bounded buffer: encoded, grouped by length into batches, run, and given back in
input order. A text longer than the model's maximum length is tagged in overlapping windows (each word
takes its tags from the window where it sits most centrally); classification reads the first window and
the prediction is marked truncated. Windows are sized by each word's sub-word count (``WordAlignment.subwords``)
and each is checked against its own encoding (joined as text, a window can take more sub-words than its words'
counts): every word is tagged from a window it reached whole, or, one word longer than the maximum length, is
counted in ``Prediction.untagged``, never silently left 'O'.

Precision: fp32 by default; bf16 (or fp16, on GPUs) runs the model under autocast: matrix products and attention
in half precision, while the residual stream, norms, gates, output probabilities and the CRF stay float32. Faster
where the hardware has half-precision matrix units, and not bit-identical to fp32 (docs/prediction.md quotes how
far apart they are, from benchmarks/results/precision_agreement.json). A frozen pretrained trunk always computes in
its own dtype (autocast is switched off around it), so its cached states never depend on the precision. int8
quantises the Linear modules in place (``mtl_decoder.inference.quantize``).

A frozen trunk's state cache, at inference (``from_saved``): read from its folder, written only with
``cache_states``, at most ``INFERENCE_ENTRIES`` states in memory (``FrozenStates.for_inference``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING
from mtl_decoder.data.batching import EncodedExample, collator_for
from mtl_decoder.data.tokenization import Encoded, TextEncoder
from mtl_decoder.errors import UserError
from mtl_decoder.inference.options import (  # noqa: F401 - PRECISIONS, MAX_TOKENS: the inference API, stated there
    BATCH_SIZE,
    MAX_TOKENS,
    PRECISION,
    PRECISIONS,
    InferenceOptions,
    autocast_dtype,
    check_max_tokens,
)
from mtl_decoder.inference.prediction import Prediction
from mtl_decoder.model import MTLDecoder, MTLOutput
from mtl_decoder.saved import SavedModel


class NonFiniteOutput(UserError):
    """A model output that is NaN or infinite; ``item``: the input's index in its chunk."""

    def __init__(self, task: str, item: int):
        super().__init__(
            f"the model's {task} outputs are not finite (NaN or infinity): its weights are damaged or overflow at "
            "this precision; nothing was written for it"
        )
        self.item = item


@dataclass
class _Piece:
    item: int
    start: int
    end: int
    encoded: Encoded


@dataclass
class _Chunk:
    """A buffered chunk of items on its way: predictions filled in as its batches come back."""

    preds: list[Prediction]
    best_score: dict[str, dict[int, list[int]]]
    """Tagging task -> per item tagged in several windows, per word: the centrality of the window its tag came
    from."""
    batches: list[list[_Piece]]
    jobs: list[Future | Callable[[], tuple]]
    """Per batch: its _run_batch result, running in a worker (a Future) or deferred (no workers)."""
    items: list = field(default_factory=list)
    first: int = 0
    """The index of the chunk's first item in the whole input."""


class Predictor:
    def __init__(
        self,
        model: MTLDecoder,
        encoder: TextEncoder,
        label_sets: dict[str, list[str]],
        batch_size: int = BATCH_SIZE,
        buffer_batches: int = 16,
        precision: str = PRECISION,
        workers: int | None = None,
        max_tokens: int | None = None,
        forward: Callable[..., MTLOutput] | None = None,
    ):
        """``forward``: what runs a batch in place of ``model`` (an engine returning the same MTLOutput, e.g.
        ``onnx_engine.OnnxForward``; None: the model).

        ``max_tokens``: a batch's padded sub-words (rows x its longest) at most this, besides at most
        ``batch_size`` rows (None: ``default_max_tokens``; 0: rows only).

        ``workers``: threads that run batches side by side, each with its share of torch's intra-op threads on a
        CPU (None: ``default_workers``). A native model's batch spends a third of its time in Python (collating,
        decoding, and the caller writing results), which one thread per core overlaps with the other's matrix
        products: with 2 CPU cores, 2 workers of 1 thread predict ~25% faster than 1 worker of 2. A pretrained
        trunk's batch is one large matrix product: 1 worker with all of torch's threads (about twice the words per
        second of 2 workers for SmolLM2). Predictions do not depend on it beyond float rounding.
        ``precision`` int8 quantises ``model`` in place (it stays int8)."""
        InferenceOptions(precision=precision, workers=workers, max_tokens=max_tokens).checked()  # before int8 in place
        if encoder.word_token != model.cfg.word_token_position:  # tags would be read where the model never learned
            raise ValueError(
                f"the encoder reads words at their {encoder.word_token} sub-word, the model at its "
                f"{model.cfg.word_token_position} (model.word_token): build it with TextEncoder.for_model"
            )
        self.model, self.encoder, self.label_sets = model, encoder, label_sets
        self.forward = forward or model
        self.workers = workers
        self.device = next(model.parameters()).device
        self.autocast = autocast_dtype(precision, self.device)
        self.precision = _apply_precision(model, precision)
        self.batch_size, self.buffer = batch_size, batch_size * buffer_batches
        self.max_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        self.kinds = {t.name: t.kind for t in model.tasks}
        self.collate = collator_for(model.cfg, encoder.pad_id, {})
        self.progress: Callable[[int], None] | None = None
        """Called after each batch with the number of items it completed (for a progress bar)."""

    @classmethod
    def from_saved(cls, saved: SavedModel, options: InferenceOptions | None = None, **settings) -> Predictor:
        """A Predictor for a loaded model folder.

        A Predictor for a loaded model folder, run with ``options`` (or InferenceOptions(**settings); their
        batch_size defaults here to the run's data.eval_batch_size, the size training-time validation used, so
        ``evaluate`` reproduces it). A frozen trunk's state cache becomes an inference one: its folder under
        ``cache_dir`` (default the saved model's model.trunk.cache_dir, else $MTL_DECODER_CACHE/states, else
        ~/.cache/mtl-decoder/states) read, written only with ``cache_states``, a bounded number of states in memory.
        The options' device and gate table are the loader's (``load_for_inference``), not applied here."""
        if options is None:
            options = InferenceOptions(**{"batch_size": None, **settings}).checked()
        elif settings:
            raise TypeError(f"from_saved: give options or keyword settings, not both ({', '.join(settings)})")
        from mtl_decoder.inference.onnx_engine import engine_forward

        margin = 0.0
        if options.precision == "int8":
            from mtl_decoder.inference.quantize import refine_margin, use_folder_smoothing

            use_folder_smoothing(saved)
            margin = refine_margin(saved.model) if options.refine else 0.0
        forward = engine_forward(saved, options.engine, options.precision)
        predictor = cls(
            saved.model,
            saved.encoder,
            saved.label_sets,
            options.batch_size or saved.config.data.eval_batch_size,
            precision=options.precision,
            workers=options.workers,
            max_tokens=options.max_tokens,
            forward=forward,
        )
        saved.for_inference(options.cache_dir, write=options.cache_states)
        states = saved.model.trunk_kind.cached_states()
        if states is not None and options.pack_tokens is not None:
            states.pack_tokens = options.pack_tokens
        if margin <= 0:
            return predictor
        from mtl_decoder.inference.refine import refining

        return refining(predictor, saved, options, margin)  # type: ignore[return-value]  (a Predictor's interface)

    @property
    def state_cache(self):
        """The frozen trunk's StateCache (its hits, repeats and misses), or None."""
        states = self.model.trunk_kind.cached_states()
        return states.cache if states is not None else None

    @property
    def default_workers(self) -> int:
        """The default number of prediction workers for a model.

        1 for a pretrained trunk (all torch's threads on its matrix products); else 2 where torch has 2 or more
        threads or a GPU is used, else 1."""
        if self.model.trunk_kind.pretrained:
            return 1
        return 2 if self.device.type != "cpu" or torch.get_num_threads() >= 2 else 1

    @property
    def default_max_tokens(self) -> int:
        """MAX_TOKENS of this model's kind (a pretrained trunk's batch is arithmetic; a native one's more Python)."""
        return MAX_TOKENS["pretrained" if self.model.trunk_kind.pretrained else "native"]

    def predict(
        self,
        items: Iterable[list[str] | str],
        tasks: list[str] | None = None,
        on_batch: Callable[[MTLOutput, dict], None] | None = None,
    ) -> Iterator[Prediction]:
        """One Prediction per item, in input order.

        One Prediction per item (a word list or a raw text), in input order. ``on_batch(output, batch)`` is
        called for every batch, in order, in the calling thread."""
        tasks = list(tasks or self.model.task_names)
        was_training, threads = self.model.training, torch.get_num_threads()
        self.model.eval()  # once, here: a worker switching modes would race the others
        pool = self._pool(threads)
        try:
            # One chunk of lookahead: its batches run while the caller consumes the previous chunk's predictions.
            pending: deque[_Chunk] = deque()
            first = 0
            for chunk in self._chunks(items):
                pending.append(self._start(chunk, tasks, pool, keep_outputs=on_batch is not None))
                pending[-1].items, pending[-1].first = chunk, first
                first += len(chunk)
                if len(pending) > 1:
                    yield from self._finish(pending.popleft(), on_batch)
            while pending:
                yield from self._finish(pending.popleft(), on_batch)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
                torch.set_num_threads(threads)  # the workers' setting also reached torch's default for new threads
            self.model.train(was_training)

    def _pool(self, threads: int) -> ThreadPoolExecutor | None:
        workers = self.workers or self.default_workers
        if workers == 1:
            return None
        if self.device.type != "cpu":
            return ThreadPoolExecutor(workers, thread_name_prefix="predict")
        # torch's intra-op thread count is per thread (OpenMP): each worker takes its share of the caller's
        share = (max(1, threads // workers),)
        return ThreadPoolExecutor(workers, "predict", initializer=torch.set_num_threads, initargs=share)

    def _chunks(self, items: Iterable[list[str] | str]) -> Iterator[list[list[str] | str]]:
        buffer: list[list[str] | str] = []
        for item in items:
            buffer.append(item)
            if len(buffer) >= self.buffer:
                yield buffer
                buffer = []
        if buffer:
            yield buffer

    def _start(self, items: list, tasks: list[str], pool: ThreadPoolExecutor | None, keep_outputs: bool) -> _Chunk:
        """Encode a chunk, cut too-long items into windows, group pieces by length and hand the batches out."""
        encoded = self.encoder.encode_batch(items)
        preds = [Prediction(e.words, e.spans) for e in encoded]
        pieces: list[_Piece] = []
        tagging = [t for t in tasks if self.kinds[t] == TAGGING]
        for i, enc in enumerate(encoded):
            if enc.truncated and tagging:
                windows = self._windows(i, enc)
                preds[i].windows = len(windows)
                preds[i].untagged = sum(p.encoded.kept_words == 0 for p in windows)
                pieces += windows
            else:
                pieces.append(_Piece(i, 0, enc.kept_words, enc))
            preds[i].truncated = enc.truncated and len(tagging) < len(tasks)
        windowed = [i for i, pred in enumerate(preds) if pred.windows > 1]
        best_score = {t: {i: [-1] * len(encoded[i].words) for i in windowed} for t in tagging}
        batches = self._batches(sorted(pieces, key=lambda p: len(p.encoded.ids)))
        run = [partial(self._run_batch, b, tasks, keep_outputs) for b in batches]
        jobs = [pool.submit(job) for job in run] if pool is not None else run
        return _Chunk(preds, best_score, batches, jobs)

    def _batches(self, pieces: list[_Piece]) -> list[list[_Piece]]:
        """Cut length-sorted pieces into batches.

        Length-sorted pieces cut into consecutive batches of at most ``batch_size`` rows and ``max_tokens``
        padded sub-words (a piece longer than that alone is a batch of its own)."""
        batches: list[list[_Piece]] = []
        for piece in pieces:
            rows = len(batches[-1]) + 1 if batches else 0
            longest = len(piece.encoded.ids)  # the longest so far: the pieces are sorted
            if not batches or rows > self.batch_size or (self.max_tokens and rows * longest > self.max_tokens):
                batches.append([piece])
            else:
                batches[-1].append(piece)
        return batches

    def _finish(self, chunk: _Chunk, on_batch) -> list[Prediction]:
        left = Counter(p.item for pieces in chunk.batches for p in pieces)  # pieces (windows) per item still to come
        for pieces, job in zip(chunk.batches, chunk.jobs, strict=True):
            try:
                out, batch, decoded = job.result() if isinstance(job, Future) else job()
            except NonFiniteOutput as err:  # name the record in the whole input
                item = chunk.items[err.item]
                text = (item if isinstance(item, str) else " ".join(item))[:40]
                raise UserError(f"record {chunk.first + err.item + 1} of the input ({text!r}): {err}") from None
            if on_batch is not None:
                on_batch(out, batch)
            self._merge(pieces, decoded, chunk.preds, chunk.best_score)
            if self.progress is not None:
                left.subtract(p.item for p in pieces)
                self.progress(sum(left[i] == 0 for i in {p.item for p in pieces}))
        return chunk.preds

    def _windows(self, item: int, enc: Encoded) -> list[_Piece]:
        """Overlapping word windows of an item.

        Overlapping word windows, each encoded and every word of it present whole; consecutive windows overlap by
        about half. A window is first sized by the words' sub-word counts, then cut back to what its own encoding
        kept (words joined as text can take more sub-words together than apart). A word too long for any window
        is a window of its own with no word kept (counted untagged)."""
        counts, words = enc.alignment.subwords, enc.words
        budget = self.encoder.max_length - self.encoder.n_special
        pieces, start = [], 0
        while True:
            end, used = start, 0
            while end < len(words) and (end == start or used + counts[end] <= budget):
                used += counts[end]
                end += 1
            window = self.encoder.encode_words(words[start:end])
            while 0 < window.kept_words < end - start:  # the encoding overflowed: keep the words that fit whole
                end = start + window.kept_words
                window = self.encoder.encode_words(words[start:end])
            if window.kept_words == 0 and end - start > 1:  # the first word alone does not fit
                end = start + 1
                window = self.encoder.encode_words(words[start:end])
            pieces.append(_Piece(item, start, end, window))
            if end >= len(words):
                return pieces
            start = max(start + 1, start + (end - start) // 2)

    @torch.inference_mode()  # grad mode and autocast are thread-local: both are entered here, in the worker
    def _run_batch(self, pieces: list[_Piece], tasks: list[str], keep_outputs: bool) -> tuple:
        """Collate and run one batch.

        (output, batch) if ``keep_outputs`` else (None, None), and per task the
        (batch row, class probabilities or word-level tag ids) of each row of its output."""
        batch = self.collate([EncodedExample.unlabelled(p.encoded) for p in pieces])
        batch = {k: v.to(self.device) for k, v in batch.items()}
        half = torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None else nullcontext()
        with half:
            out = self.forward(**batch, tasks=tasks)
        decoded: dict[str, list] = {}
        for task in tasks:
            rows = out.examples[task]
            finite = torch.isfinite(out.logits[task].float()).flatten(1).all(1)
            if not bool(finite.all()):
                raise NonFiniteOutput(task, pieces[int(rows[~finite][0])].item)
            if self.kinds[task] == CLASSIFICATION:
                values = out.logits[task].float().softmax(-1).tolist()
            else:
                values = self.model.decode_tags(task, out.logits[task], batch["word_read"][rows])
            decoded[task] = list(zip(rows.tolist(), values, strict=True))
        return (out, batch, decoded) if keep_outputs else (None, None, decoded)

    def _merge(
        self,
        pieces: list[_Piece],
        decoded: dict[str, list],
        preds: list[Prediction],
        best_score: dict[str, dict[int, list[int]]],
    ) -> None:
        """Merge one batch's results into its items' predictions.

        One batch's results into its items' predictions: a label from an item's first window; each word's
        tags from the window where the word sits most centrally (an item in one window: its tags as they are, 'O'
        for words it did not reach whole)."""
        for task, rows in decoded.items():
            labels = self.label_sets[task]
            if self.kinds[task] == CLASSIFICATION:
                for r, probs in rows:
                    if pieces[r].start == 0:
                        pred = preds[pieces[r].item]
                        pred.labels[task] = labels[max(range(len(probs)), key=probs.__getitem__)]  # first maximum
                        pred.probs[task] = dict(zip(labels, probs, strict=True))
                continue
            for r, tag_ids in rows:
                piece, pred = pieces[r], preds[pieces[r].item]
                if pred.windows == 1:
                    pred.tags[task] = [labels[t] for t in tag_ids] + ["O"] * (len(pred.words) - len(tag_ids))
                    continue
                tags = pred.tags.setdefault(task, ["O"] * len(pred.words))
                scores = best_score[task][piece.item]
                n = piece.end - piece.start
                for w, tag_id in enumerate(tag_ids):
                    centrality = min(w, n - 1 - w)  # distance from the window's nearer edge
                    if centrality > scores[piece.start + w]:
                        scores[piece.start + w] = centrality
                        tags[piece.start + w] = labels[tag_id]


def _apply_precision(model: MTLDecoder, precision: str) -> str:
    """int8: quantise ``model`` in place (once); any other precision on a model already quantised is an error."""
    from mtl_decoder.inference.quantize import is_int8, quantize_int8

    if precision == "int8":
        quantize_int8(model)
    elif is_int8(model):
        raise UserError(f"precision {precision}: this model was quantised to int8 in place; load it again")
    return precision
