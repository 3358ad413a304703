"""``predict --stream``: a file or standard input tagged word by word as it arrives, one JSON line per word.

The tagging itself is the engine's StreamTagger (mtl_decoder/inference/streaming.py); this module is the job around
it: reading the input in pieces, writing each word's line (flushed per line to standard output, or to a file under a
temporary name renamed at the end), and the one-line errors of both.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter
from typing import IO, Any

import torch

from mtl_decoder.errors import UserError
from mtl_decoder.files import AtomicFile, path_problem
from mtl_decoder.inference.loading import load_for_inference
from mtl_decoder.inference.options import InferenceOptions
from mtl_decoder.inference.streaming import StreamStats, StreamTagger
from mtl_decoder.prediction.outputs import check_output
from mtl_decoder.saved import SavedModel
from mtl_decoder.termination import terminate_unwinds

READ_CHUNK = 1 << 16
"""Characters a file is read in at a time (stdin is read line by line, so each line is tagged as it arrives)."""


def read_chunks(source: IO[str], lines: bool) -> Iterator[str]:
    """A text stream's pieces: line by line (stdin: each line tagged as it arrives) or in READ_CHUNK pieces."""
    while True:
        chunk = source.readline() if lines else source.read(READ_CHUNK)
        if not chunk:
            return
        yield chunk


def stream_file(
    model: SavedModel | str | Path,
    input: str | Path,
    output: str | Path,
    tasks: str | list[str] | None = None,
    lookahead: int = 2,
    context: int | None = None,
    force: bool = False,
    device: str | torch.device | None = None,
    gate_table: str | Path | None = None,
    *,
    options: InferenceOptions | None = None,
) -> StreamStats:
    """``predict --stream``: tag one text read from a file or stdin.

    ``predict --stream``: the input ('-': stdin, read line by line) as one text, one JSON line per word to the
    output ('-': stdout, flushed per line; a file is written under a temporary name and renamed at the end). The
    model is loaded as ``options`` say (or InferenceOptions of ``device`` and ``gate_table``): a stream honours only
    those two of its settings."""
    to_stdout, from_stdin = str(output) == "-", str(input) == "-"
    problem = None if from_stdin else path_problem(input)
    if problem:
        raise UserError(f"{input}: {problem}")
    if not to_stdout:
        output = Path(output)
        check_output(input, output, force, model)
    if options is None:
        options = InferenceOptions(device=device, gate_table=gate_table)
    saved = load_for_inference(model, options.checked())
    tagger = StreamTagger(saved, tasks, lookahead, context)
    start = perf_counter()
    with terminate_unwinds():
        source = _stdin_text() if from_stdin else open(input, encoding="utf-8", newline="")  # noqa: SIM115
        try:
            if to_stdout:
                _pump(tagger, source, from_stdin, _StdoutSink())
            else:
                with AtomicFile(output, force) as sink:
                    _pump(tagger, source, from_stdin, sink)
                    sink.commit()
        except UnicodeDecodeError as err:
            name = "standard input" if from_stdin else input
            raise UserError(f"{name}: not UTF-8 text ({err.reason} near byte {err.start} of a read)") from None
        finally:
            if not from_stdin:
                source.close()
            elif source is not sys.stdin:
                source.detach()  # sys.stdin's own buffer stays open
    tagger.stats.seconds = perf_counter() - start
    return tagger.stats


def _stdin_text() -> IO[str]:
    """Standard input as strict UTF-8 text.

    Standard input as strict UTF-8 text, read as a file is: Python's own decoder of stdin may turn bytes that are
    not UTF-8 into lone surrogates, which the tokenizer cannot take."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # already text (a program's own stream)
        return sys.stdin
    return io.TextIOWrapper(buffer, encoding="utf-8", errors="strict", newline="")


class _StdoutSink:
    def write_json(self, record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
        sys.stdout.flush()


def _pump(tagger: StreamTagger, source: IO[str], lines: bool, sink) -> None:
    for chunk in read_chunks(source, lines):
        for word in tagger.feed(chunk):
            sink.write_json(word.to_dict())
    for word in tagger.finish():
        sink.write_json(word.to_dict())
