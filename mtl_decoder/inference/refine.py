"""int8 answers confirmed in float32 where they are close: W8A8's near-ties predicted again at full precision.

W8A8 int8 moves a classification's probabilities a little (SmolLM2's 16 blocks, SST-2 test: by a median 0.002,
at most 0.27), so the labels it flips are those nearest the decision: every one of them lay within 0.14 of one half
(benchmarks/w8a8_flips.py). A text whose int8 classification is that close, its top two probabilities within
``margin`` of each other for some task, is predicted again by the float32 model and takes that prediction whole
(tags included); every other text keeps int8's. The cost is the float32 pass over the close texts only.

``mtl-decoder quantize`` chooses the margin on the model's validation texts (``choose_margin``: the smallest of
``MARGINS`` that brings every task to its bar) and stores it with the scales; ``--precision int8`` then applies
it (``Predictor.from_saved``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from mtl_decoder.inference.prediction import Prediction

if TYPE_CHECKING:
    from mtl_decoder.inference.options import InferenceOptions
    from mtl_decoder.saved import SavedModel

MARGINS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3)
"""The margins ``choose_margin`` tries, smallest first (0: int8 alone)."""


def is_close(pred: Prediction, margin: float) -> bool:
    """Whether some classification of ``pred`` has its two most probable labels within ``margin`` of each other."""
    return close_to_a_tie(pred.probs.values(), margin)


def close_to_a_tie(distributions: Iterable[Mapping[str, float]], margin: float) -> bool:
    """Whether some label distribution (label -> probability) has its two largest within ``margin`` of each other:
    the one rule for a near-tie, over Prediction objects (``is_close``) and prediction dicts alike."""
    for probs in distributions:
        top = sorted(probs.values(), reverse=True)
        if len(top) > 1 and top[0] - top[1] < margin:
            return True
    return False


def same_answer(a: Prediction, b: Prediction, task: str) -> bool:
    """Whether two predictions give ``task`` the same label (classification) or the same tags (tagging)."""
    return a.labels.get(task) == b.labels.get(task) and a.tags.get(task) == b.tags.get(task)


def agreement(exact: Sequence[Prediction], fast: Sequence[Prediction], margin: float, tasks: Iterable[str]) -> dict:
    """Per task the share of texts answered as float32 does once ``margin``'s close texts are predicted again (they
    then agree by construction), and under "refined" the share of texts predicted again."""
    close = [is_close(f, margin) for f in fast]
    pairs = list(zip(exact, fast, close, strict=True))
    out = {task: round(sum(c or same_answer(e, f, task) for e, f, c in pairs) / len(pairs), 5) for task in tasks}
    return {"agreement": out, "refined": round(sum(close) / len(fast), 5)}


def choose_margin(
    exact: Sequence[Prediction], fast: Sequence[Prediction], bars: dict[str, float]
) -> tuple[float, dict] | None:
    """The smallest of ``MARGINS`` at which every task's agreement (``agreement``) reaches ``bars[task]``, with that
    agreement; None when none does."""
    for margin in MARGINS:
        measured = agreement(exact, fast, margin, bars)
        if all(measured["agreement"][task] >= bar for task, bar in bars.items()):
            return margin, measured
    return None


class Predictor(Protocol):
    """What the refiner uses of a ``predictor.Predictor`` (named here, not imported: the predictor imports this
    module to wrap itself)."""

    model: Any
    encoder: Any
    kinds: dict[str, str]
    device: Any
    precision: str
    batch_size: int
    max_tokens: int | None
    buffer: int
    progress: Callable[[int], None] | None

    @property
    def state_cache(self) -> Any: ...

    def predict(
        self, items: Iterable[list[str] | str], tasks: list[str] | None = None, on_batch: Callable | None = None
    ) -> Iterator[Prediction]: ...

    @classmethod
    def from_saved(cls, saved: SavedModel, options: InferenceOptions | None = None) -> Any: ...


class RefiningPredictor:
    """A Predictor's interface over an int8 ``fast`` Predictor and a float32 ``exact`` one of the same folder.

    ``predict`` streams ``fast``'s predictions in chunks of its buffer and predicts the chunk's close texts
    (``is_close``) again with ``exact``; ``refined`` counts those, ``predicted`` every text."""

    def __init__(self, fast: Predictor, exact: Predictor, margin: float):
        self.fast, self.exact, self.margin = fast, exact, margin
        self.refined = self.predicted = 0

    # What callers read of a Predictor: the int8 one's settings and state cache.
    model = property(lambda self: self.fast.model)
    encoder = property(lambda self: self.fast.encoder)
    kinds = property(lambda self: self.fast.kinds)
    device = property(lambda self: self.fast.device)
    precision = property(lambda self: self.fast.precision)
    batch_size = property(lambda self: self.fast.batch_size)
    max_tokens = property(lambda self: self.fast.max_tokens)
    buffer = property(lambda self: self.fast.buffer)
    state_cache = property(lambda self: self.fast.state_cache)

    @property
    def progress(self) -> Callable[[int], None] | None:
        return self.fast.progress

    @progress.setter
    def progress(self, callback: Callable[[int], None] | None) -> None:
        self.fast.progress = callback

    def predict(
        self, items: Iterable[list[str] | str], tasks: list[str] | None = None, on_batch: Callable | None = None
    ) -> Iterator[Prediction]:
        """One Prediction per item, in input order (``on_batch`` sees the int8 batches only)."""
        given: deque = deque()

        def remember(source: Iterable) -> Iterator:
            for item in source:
                given.append(item)
                yield item

        chunk: list[tuple[list[str] | str, Prediction]] = []
        for pred in self.fast.predict(remember(items), tasks, on_batch):
            chunk.append((given.popleft(), pred))  # fast.predict yields in input order
            if len(chunk) >= self.fast.buffer:
                yield from self._refine(chunk, tasks)
                chunk = []
        yield from self._refine(chunk, tasks)

    def _refine(self, chunk: list, tasks: list[str] | None) -> list[Prediction]:
        close = [i for i, (_, pred) in enumerate(chunk) if is_close(pred, self.margin)]
        preds = [pred for _, pred in chunk]
        if close:
            again = self.exact.predict([chunk[i][0] for i in close], tasks)
            for i, pred in zip(close, again, strict=True):
                preds[i] = pred
        self.refined += len(close)
        self.predicted += len(chunk)
        return preds


FLOAT_COPY = "_refine_float_copy"
"""Attribute of an int8 SavedModel: the float32 copy of its folder that confirms its close texts."""


def refining(fast: Predictor, saved: SavedModel, options: InferenceOptions, margin: float) -> RefiningPredictor:
    """``fast`` (int8, from ``saved``) with its close texts predicted again by a float32 copy of the same folder,
    loaded once per SavedModel (predict_texts may be called on it again) with the same options."""
    from mtl_decoder.inference.loading import load_for_inference

    exact_options = replace(options, precision="fp32", batch_size=fast.batch_size, device=fast.device)
    copy = getattr(saved, FLOAT_COPY, None)
    if copy is None:
        copy = load_for_inference(saved.directory, exact_options)
        object.__setattr__(saved, FLOAT_COPY, copy)
    return RefiningPredictor(fast, type(fast).from_saved(copy, exact_options), margin)  # fast's class: no import
