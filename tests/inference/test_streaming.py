"""predict --stream and stream_tags: words cut as the tokenizer cuts the whole text, softmax tags equal to predict's
for the same text as one record, the CRF look-ahead, the sliding window past the maximum length, and the errors."""

from __future__ import annotations

import io
import itertools
import json
import random

import pytest
import torch
from stream_testkit import FEATURES, saved_model

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.inference.streaming import StreamTagger, stream_tags
from mtl_decoder.model.crf import iob2_allowed
from mtl_decoder.prediction import predict_texts
from mtl_decoder.saved import load_model

TEXTS = [
    "Peter Blackburn lives in London. EU rejects German call to boycott British lamb, said Müller (again)!",
    "  leading spaces,\ttabs  and   gaps 😀 emoji😀 end  ",
    "Jose\u0301 Mu\u0308ller visited Zu\u0308rich e\u0301te\u0301 O'Neil & Zoë-Ann, Kraków.\nNew York",
]


@pytest.fixture(scope="module")
def softmax_model(tmp_path_factory):
    overrides = [*FEATURES, "data.max_length=128", "model.word_token=first"]  # the default, auto, reads the last
    return load_model(saved_model(tmp_path_factory.mktemp("softmax"), overrides))


@pytest.fixture(scope="module")
def last_token_model(tmp_path_factory):
    """Tags read at each word's last sub-word (model.word_token auto under causal attention)."""
    overrides = [*FEATURES, "data.max_length=128", "model.word_token=auto"]
    return load_model(saved_model(tmp_path_factory.mktemp("last"), overrides, seed=2))


@pytest.fixture(scope="module")
def crf_model(tmp_path_factory):
    overrides = [*FEATURES, "data.max_length=128", "model.tagging_decoder=crf"]
    return load_model(saved_model(tmp_path_factory.mktemp("crf"), overrides, seed=3))


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """max_length 24: a paragraph passes it many times."""
    return load_model(saved_model(tmp_path_factory.mktemp("short"), [*FEATURES, "data.max_length=24"], seed=5))


def _chunks(text: str, seed: int, largest: int = 7) -> list[str]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        k = rng.randint(1, largest)
        out.append(text[i : i + k])
        i += k
    return out


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunking", ["whole", "characters", "random"])
@pytest.mark.parametrize("which", ["first", "last"])
def test_streamed_tags_equal_predict_for_the_same_text(softmax_model, last_token_model, text, chunking, which):
    softmax_model = softmax_model if which == "first" else last_token_model
    assert softmax_model.model.cfg.word_token_position == which
    chunks = {"whole": [text], "characters": list(text), "random": _chunks(text, seed=len(text))}[chunking]
    expected = next(predict_texts(softmax_model, [text], tasks="ner"))["ner"]
    assert expected["windows"] == 1, "the text must fit in data.max_length for the comparison"
    streamed = list(stream_tags(softmax_model, chunks, tasks="ner"))
    assert [w["word"] for w in streamed] == expected["words"]
    assert [[w["start"], w["end"]] for w in streamed] == expected["offsets"]
    assert [w["tags"]["ner"] for w in streamed] == expected["tags"]
    for w in streamed:
        assert text[w["start"] : w["end"]] == w["word"]


def test_a_word_is_emitted_once_the_tokenizer_has_closed_it(softmax_model):
    tagger = StreamTagger(softmax_model)
    assert [w.word for w in tagger.feed("New")] == []  # 'Newcastle' may follow
    assert [w.word for w in tagger.feed(" Yo")] == ["New"]
    assert [w.word for w in tagger.feed("rk")] == []
    assert [w.word for w in tagger.feed(", said")] == ["York", ","]
    assert [w.word for w in tagger.feed("\n")] == ["said"]
    assert [w.word for w in tagger.finish()] == []
    tagger = StreamTagger(softmax_model)
    tagger.feed("no space at the end")
    assert [w.word for w in tagger.finish()] == ["end"]


def test_crf_lookahead_delays_words_and_a_long_one_equals_predict(crf_model):
    text = TEXTS[0]
    expected = next(predict_texts(crf_model, [text], tasks="ner"))["ner"]["tags"]
    whole = list(stream_tags(crf_model, _chunks(text, 1), tasks="ner", lookahead=len(expected)))
    assert [w["tags"]["ner"] for w in whole] == expected  # the Viterbi path of the whole text

    for lookahead in (0, 1, 3):
        tagger = StreamTagger(crf_model, "ner", lookahead=lookahead)
        emitted = []
        for word in text.split(" "):
            emitted += tagger.feed(word + " ")
            assert len(emitted) == max(0, tagger.words_seen - lookahead), "a word waits for exactly N more words"
        emitted += tagger.finish()
        tags = [w.tags["ner"] for w in emitted]
        assert len(tags) == len(expected)
        # whatever N, the emitted sequence is valid IOB2: every window's path starts from the tag emitted before it
        for prev, tag in zip(["O", *tags], tags, strict=False):
            if tag.startswith("I-"):
                assert prev[2:] == tag[2:], f"{prev} -> {tag}"


def test_every_crf_window_is_the_best_path_that_continues_the_emitted_tags(crf_model):
    """Each look-ahead window's path against every IOB2 tag sequence scored by hand: it follows the tag emitted
    before the window (the start scores before the first word), with the end scores only at the end of the stream."""
    tagger = StreamTagger(crf_model, "ner", lookahead=2)
    crf, labels = crf_model.model.crfs["ner"], tagger.labels["ner"]
    start_ok, trans_ok = iob2_allowed(labels)
    windows = []
    viterbi = tagger._viterbi

    def recorded(task: str, emissions: torch.Tensor, final: bool) -> list[int]:
        windows.append((emissions.clone(), tagger.last_tag[task], final, viterbi(task, emissions, final)))
        return windows[-1][3]

    tagger._viterbi = recorded
    for word in TEXTS[0].split(" ")[:7]:
        tagger.feed(word + " ")
    tagger.finish()

    def score(emissions: torch.Tensor, tags: tuple[int, ...], prev: int | None, final: bool) -> float:
        ok = start_ok[tags[0]] if prev is None else trans_ok[prev, tags[0]]
        s = (crf.start[tags[0]] if prev is None else crf.transitions[prev, tags[0]]) + (0 if ok else -1e4)
        for a, b in itertools.pairwise(tags):
            s = s + crf.transitions[a, b] + (0 if trans_ok[a, b] else -1e4)
        s = s + sum(emissions[w, t] for w, t in enumerate(tags))
        return float(s + crf.end[tags[-1]] if final else s)

    assert len(windows) > 3 and windows[-1][2] and not windows[0][2]
    with torch.no_grad():
        for emissions, prev, final, path in windows:
            paths = itertools.product(range(len(labels)), repeat=len(emissions))
            best = max(paths, key=lambda p, e=emissions, q=prev, f=final: score(e, p, q, f))
            assert tuple(path) == best


def test_past_the_maximum_length_the_stream_restarts_from_its_last_tokens(short_model):
    """Sliding window: the cache never grows and never holds more than max_length tokens; after a restart, the words
    up to the next restart are tagged as predict tags the text that starts at the kept context."""
    text = " ".join([TEXTS[0]] * 6)
    tagger = StreamTagger(short_model, "ner")
    storage = [(layer.k.data_ptr(), layer.k.untyped_storage().nbytes()) for layer in tagger.cache.layers]
    words = []
    for chunk in _chunks(text, 7):
        words += tagger.feed(chunk)
        assert int(tagger.cache.lengths[0]) <= tagger.capacity
    words += tagger.finish()
    assert [(layer.k.data_ptr(), layer.k.untyped_storage().nbytes()) for layer in tagger.cache.layers] == storage
    assert tagger.stats.restarts == len(tagger.restarts) >= 3
    assert len(words) == tagger.words_seen
    for w in words:
        assert text[w.start : w.end] == w.word
    for (kept, first_new), (_, next_new) in zip(tagger.restarts, tagger.restarts[1:], strict=False):
        assert kept < first_new, "the restart keeps some context"
        segment = text[words[kept].start : words[next_new - 1].end]
        expected = next(predict_texts(short_model, [segment], tasks="ner"))["ner"]
        assert expected["windows"] == 1, "a window never holds more than max_length tokens"
        assert [w.word for w in words[kept:next_new]] == expected["words"]
        n = first_new - kept
        assert [w.tags["ner"] for w in words[first_new:next_new]] == expected["tags"][n:]


def test_cli_streams_stdin_to_stdout_and_a_file_to_a_file(softmax_model, tmp_path, monkeypatch, capsys):
    model_dir = str(softmax_model.directory)
    text = TEXTS[0] + "\n" + TEXTS[2] + "\n"
    expected = list(stream_tags(softmax_model, [text], tasks="ner"))
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["predict", "--model", model_dir, "--stream", "--input", "-", "--output", "-"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line) for line in captured.out.splitlines()] == expected
    assert "streamed" in captured.err
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", model_dir, "--stream", "--input", str(source), "--output", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == expected
    assert main(["predict", "--model", model_dir, "--stream", "--input", str(source), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_cli_stream_bytes_not_utf8_on_stdin_are_the_files_one_line_error(softmax_model, tmp_path, monkeypatch, capsys):
    """Bytes that are not UTF-8 on stdin (Python's stdin decodes them to lone surrogates) stop the stream with the
    clean error a file with the same bytes gives, not a tokenizer's TypeError; stdin's own buffer stays open."""
    model_dir = str(softmax_model.directory)
    data = (TEXTS[0] + "\n").encode() + b"caf\xe9 au lait\n"
    source = tmp_path / "in.txt"
    source.write_bytes(data)
    assert main(["predict", "--model", model_dir, "--stream", "--input", str(source), "--output", "-"]) == 2
    from_file = capsys.readouterr().err.strip().splitlines()[-1]
    stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape")  # as Python opens it
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["predict", "--model", model_dir, "--stream", "--input", "-", "--output", "-"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == from_file.replace(str(source), "standard input") and "not UTF-8 text" in err[-1]
    assert not any("Traceback" in line or "TypeError" in line for line in err) and not stdin.buffer.closed


@pytest.mark.parametrize(
    "flags",
    [
        ["--precision", "bf16"],
        ["--batch-size", "8"],
        ["--workers", "2"],
        ["--on-error", "skip"],
        ["--max-tokens", "16"],
    ],
)
def test_cli_stream_refuses_the_flags_it_would_not_honour(softmax_model, tmp_path, capsys, flags):
    """--stream used to drop --precision, --batch-size and --workers without a word."""
    source = tmp_path / "in.txt"
    source.write_text(TEXTS[0], encoding="utf-8")
    out = tmp_path / "out.jsonl"
    argv = ["predict", "--model", str(softmax_model.directory), "--stream", "--input", str(source), "--output"]
    assert main([*argv, str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert flags[0] in err and "--stream" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bidirectional_and_classification_are_refused(tmp_path, softmax_model):
    bidirectional = load_model(saved_model(tmp_path, ["model.attention=bidirectional"]))
    with pytest.raises(UserError, match="causal"):
        StreamTagger(bidirectional)
    with pytest.raises(UserError, match="classifies whole texts"):
        StreamTagger(softmax_model, "sentiment")
    with pytest.raises(UserError, match="lookahead"):
        StreamTagger(softmax_model, lookahead=-1)
