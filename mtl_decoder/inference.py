"""Predictions from a trained model for words or raw texts: the one code path used by training-time
validation, ``evaluate`` and ``predict``, so their numbers agree.

Inputs stream through a bounded buffer: encoded, grouped by length into batches, run, and given back in
input order. A text longer than the model's maximum length is tagged in overlapping windows (each word
takes its tags from the window where it sits most centrally); classification reads the first window and
the prediction is marked truncated.

Precision: fp32 by default; bf16 (or fp16, on GPUs) runs the model under autocast: matrix products and attention
in half precision, while the residual stream, norms, gates, output probabilities and the CRF stay float32. Faster
where the hardware has half-precision matrix units, and not bit-identical to fp32 (benchmarks/README.md measures
how far apart they are).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from mtl_decoder.config import CLASSIFICATION, TAGGING
from mtl_decoder.data import EncodedExample, collator_for
from mtl_decoder.errors import UserError
from mtl_decoder.model import MTLDecoder, MTLOutput
from mtl_decoder.tokenization import Encoded, TextEncoder

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Inference precision -> the autocast dtype (None: plain float32)."""


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of an inference precision on ``device``; a UserError for an unknown one, and for fp16
    on a CPU, where torch runs it about 25x slower than fp32 (measured here): bf16 is the CPU's half precision."""
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp16" and device.type == "cpu":
        raise UserError("precision fp16 is for GPUs: on a CPU use bf16 (or fp32)")
    return PRECISIONS[precision]


@dataclass
class Prediction:
    words: list[str]
    """The words predicted on (given, or the tokenizer's words of a raw text)."""
    spans: list[tuple[int, int]] | None
    """Character offsets of each word in the raw text (None for pre-tokenised input)."""
    tags: dict[str, list[str]] = field(default_factory=dict)
    """Tagging task -> one tag per word."""
    labels: dict[str, str] = field(default_factory=dict)
    """Classification task -> predicted label."""
    probs: dict[str, dict[str, float]] = field(default_factory=dict)
    """Classification task -> label -> probability."""
    truncated: bool = False
    """The input was longer than max_length: classification saw only its first window."""
    windows: int = 1
    """Windows the input was tagged in."""


@dataclass
class _Piece:
    item: int
    start: int
    end: int
    encoded: Encoded


class Predictor:
    def __init__(
        self,
        model: MTLDecoder,
        encoder: TextEncoder,
        label_sets: dict[str, list[str]],
        batch_size: int = 64,
        buffer_batches: int = 16,
        precision: str = "fp32",
    ):
        self.model, self.encoder, self.label_sets = model, encoder, label_sets
        self.precision = precision
        self.autocast = autocast_dtype(precision, next(model.parameters()).device)
        self.batch_size, self.buffer = batch_size, batch_size * buffer_batches
        kinds = {t.name: t.kind for t in model.tasks}
        self.kinds = kinds
        self.collate = collator_for(model.cfg, encoder.pad_id, {})

    def predict(
        self,
        items: Iterable[list[str] | str],
        tasks: list[str] | None = None,
        on_batch: Callable[[MTLOutput, dict], None] | None = None,
    ) -> Iterator[Prediction]:
        """One Prediction per item (a word list or a raw text), in input order."""
        tasks = list(tasks or self.model.task_names)
        buffer: list[list[str] | str] = []
        for item in items:
            buffer.append(item)
            if len(buffer) >= self.buffer:
                yield from self._predict_chunk(buffer, tasks, on_batch)
                buffer = []
        if buffer:
            yield from self._predict_chunk(buffer, tasks, on_batch)

    def _predict_chunk(self, items: list, tasks: list[str], on_batch) -> list[Prediction]:
        encoded = self.encoder.encode_batch(items)
        preds = [Prediction(e.words, e.spans) for e in encoded]
        pieces: list[_Piece] = []
        tagging = [t for t in tasks if self.kinds[t] == TAGGING]
        for i, enc in enumerate(encoded):
            if enc.truncated and tagging:
                windows = self._windows(enc.words)
                preds[i].windows = len(windows)
                pieces += [_Piece(i, s, e, self.encoder.encode_words(enc.words[s:e])) for s, e in windows]
            else:
                pieces.append(_Piece(i, 0, enc.kept_words, enc))
            preds[i].truncated = enc.truncated and len(tagging) < len(tasks)
        best_score = {t: [[-1] * len(e.words) for e in encoded] for t in tagging}
        order = sorted(range(len(pieces)), key=lambda p: len(pieces[p].encoded.ids))
        for start in range(0, len(order), self.batch_size):
            batch_pieces = [pieces[p] for p in order[start : start + self.batch_size]]
            self._run_batch(batch_pieces, tasks, preds, best_score, on_batch)
        return preds

    def _windows(self, words: list[str]) -> list[tuple[int, int]]:
        """Overlapping word windows that each fit max_length; consecutive windows overlap by about half."""
        enc = self.encoder.tokenizer.encode(words, is_pretokenized=True, add_special_tokens=False)
        counts = [0] * len(words)
        for w in enc.word_ids:
            if w is not None:
                counts[w] += 1
        budget = self.encoder.max_length - self.encoder.n_special
        windows, start = [], 0
        while True:
            end, used = start, 0
            while end < len(words) and (end == start or used + counts[end] <= budget):
                used += counts[end]
                end += 1
            windows.append((start, end))
            if end >= len(words):
                return windows
            start = max(start + 1, start + (end - start) // 2)

    @torch.inference_mode()
    def _run_batch(
        self,
        pieces: list[_Piece],
        tasks: list[str],
        preds: list[Prediction],
        best_score: dict[str, list[list[int]]],
        on_batch,
    ) -> None:
        batch = self.collate([EncodedExample(p.encoded.ids, p.encoded.word_index, p.encoded.words) for p in pieces])
        device = next(self.model.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        was_training = self.model.training
        self.model.eval()
        # autocast is thread-local state, like grad mode: entered here, around the one forward pass
        half = torch.autocast(device.type, dtype=self.autocast) if self.autocast is not None else nullcontext()
        with half:
            out = self.model(**batch, tasks=tasks)
        self.model.train(was_training)
        if on_batch is not None:
            on_batch(out, batch)
        for task in tasks:
            labels = self.label_sets[task]
            rows = out.examples[task].tolist()
            if self.kinds[task] == CLASSIFICATION:
                probs = out.logits[task].float().softmax(-1).cpu()
                for r, piece in zip(rows, (pieces[r] for r in rows), strict=True):
                    if piece.start == 0:
                        pred = preds[piece.item]
                        pred.labels[task] = labels[int(probs[r].argmax())]
                        pred.probs[task] = {lab: float(p) for lab, p in zip(labels, probs[r].tolist(), strict=True)}
                continue
            decoded = self.model.decode_tags(task, out.logits[task], batch["word_index"][out.examples[task]])
            for r, tag_ids in zip(rows, decoded, strict=True):
                piece, pred = pieces[r], preds[pieces[r].item]
                tags = pred.tags.setdefault(task, ["O"] * len(pred.words))
                scores = best_score[task][piece.item]
                n = piece.end - piece.start
                for w, tag_id in enumerate(tag_ids):
                    centrality = min(w, n - 1 - w)  # distance from the window's nearer edge
                    if centrality > scores[piece.start + w]:
                        scores[piece.start + w] = centrality
                        tags[piece.start + w] = labels[tag_id]
