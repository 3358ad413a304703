"""Hostile input, generated: random and mutated lines fed to predict (skip mode) and to the training readers.

Whatever a line holds, predict must account for it (read == predicted + skipped, one output line per prediction,
one errors-file line per skipped record) and the training readers may only raise a one-line UserError / DataError:
never a traceback. Fixed seed, bounded count (about 300 lines per reader), a few seconds in all.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from mtl_decoder.data import formats
from mtl_decoder.data.tasks import Source, load_split, read_source
from mtl_decoder.errors import UserError
from mtl_decoder.prediction import predict_file

SEED = 17
LINES = 300
SHORT_LINE_BOUND = 64 * 1024
"""formats.MAX_LINE_BYTES while fuzzing, so that the generator's long lines (up to 120 KB) cross it."""
WORDS = ["Peter", "Blackburn", "lives", "in", "London", "EU", "German", "call", "British", "the", "movie", "charming"]

ODD_TEXTS = [
    "",
    " ",
    "\t",
    "\u200b",  # zero-width space: a word the normalizer may erase
    "e\u0301",  # a combining accent that NFC merges
    "\ufeff",
    "\x00",
    "\x1b[31m",
    "😀" * 50,
    "a" * 5000,
    " ".join(["w"] * 400),
    "\u202e" + "gnirts desrever",
    "[" * 80,
    '"quoted"',
    "line\rbreak",
    "\\ud800",
    "-DOCSTART-",
    "NaN",
]


def _word(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return rng.choice(ODD_TEXTS) or "x"
    return rng.choice(WORDS)


def _value(rng: random.Random, depth: int = 0):
    """A random JSON value, sometimes of the wrong kind for the field it lands in."""
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2, 10**30, 1.5, float("1e308")])
    if kind in (3, 4, 5):
        return rng.choice([_word(rng), " ".join(_word(rng) for _ in range(rng.randrange(6))), rng.choice(ODD_TEXTS)])
    if kind in (6, 7):
        return [_value(rng, depth + 1) if rng.random() < 0.2 else _word(rng) for _ in range(rng.randrange(6))]
    return {rng.choice(["text", "tokens", "label", "ner_tags", "x"]): _value(rng, depth + 1)}


def _record(rng: random.Random) -> dict:
    """A plausible record of one of the fixtures' shapes, with a field or two made strange."""
    words = [_word(rng) for _ in range(rng.randrange(1, 12))]
    shape = rng.randrange(4)
    if shape == 0:
        record = {"text": " ".join(words), "label": rng.choice(["negative", "positive", "neutral", 1, None])}
    elif shape == 1:
        record = {"tokens": words, "ner_tags": [rng.choice(["O", "B-PER", "I-PER", "I-LOC", "X"]) for _ in words]}
    elif shape == 2:
        record = {"tokens": words, "ner_tags": ["O"] * len(words), "label": "positive"}
    else:
        record = {}
    for _ in range(rng.randrange(3)):
        record[rng.choice(["text", "tokens", "label", "ner_tags", "predictions", "id"])] = _value(rng)
    return record


def _mutate(rng: random.Random, line: bytes) -> bytes:
    """Byte-level damage: flips, cuts, insertions, odd bytes, deep nesting, a huge line."""
    kind = rng.randrange(10)
    data = bytearray(line)
    if kind == 0 and data:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1 and data:
        del data[rng.randrange(len(data)) :]
    elif kind == 2:
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.choice([b'"', b",", b"\t", b"\r", b"{", b"]", b"\x00", b"\xff\xfe", b"\xc3", b"\\"])
    elif kind == 3:
        data = bytearray(rng.randbytes(rng.randrange(1, 200)).replace(b"\n", b" "))
    elif kind == 4:
        depth = rng.choice([63, 64, 65, 200, 1500])
        data = bytearray(b"[" * depth + (b"]" * depth if rng.random() < 0.5 else b""))
    elif kind == 5:
        data = bytearray(b'{"text": "' + b"ab " * rng.randrange(1000, 40000) + b'"}')
    elif kind == 6:
        data = bytearray(b'{"text": "\\ud800 lone"}')
    return bytes(data)


def _lines(rng: random.Random, render, count: int) -> list[bytes]:
    """``count`` lines: about half rendered records as they are, the rest damaged."""
    out = []
    for _ in range(count):
        line = render(_record(rng))
        out.append(line if rng.random() < 0.45 else _mutate(rng, line))
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _jsonl(record: dict) -> bytes:
    return json.dumps(record, ensure_ascii=rng_ascii(record)).encode("utf-8", "surrogatepass")


def rng_ascii(record: dict) -> bool:
    return len(record) % 2 == 0  # both escaped and raw non-ASCII text


def _cell(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _text_of(record: dict) -> str:
    if "text" in record:
        return _cell(record["text"])
    tokens = record.get("tokens", "")
    return " ".join(map(_cell, tokens)) if isinstance(tokens, list) else _cell(tokens)


def _delimited(sep: str):
    def render(record: dict) -> bytes:
        text = _text_of(record)
        label = _cell(record.get("label", "positive"))
        return (text.replace(sep, " ") + sep + label).encode("utf-8", "surrogatepass")

    return render


def _txt(record: dict) -> bytes:
    return _text_of(record).encode("utf-8", "surrogatepass")


def _conll_sentence(record: dict) -> bytes:
    tokens = record.get("tokens") if isinstance(record.get("tokens"), list) else _text_of(record).split()
    tags = record.get("ner_tags") if isinstance(record.get("ner_tags"), list) else []
    rows = [f"{_cell(t)} {_cell(tags[i]) if i < len(tags) else 'O'}" for i, t in enumerate(tokens)]
    return "\n".join(rows).encode("utf-8", "surrogatepass")


def _write(path: Path, lines: list[bytes], header: bytes | None = None, blank_between: bool = False) -> Path:
    sep = b"\n\n" if blank_between else b"\n"
    path.write_bytes((header + b"\n" if header else b"") + sep.join(lines) + b"\n")
    return path


FORMATS = {
    # name: (suffix, render, header, sentences separated by blank lines)
    "jsonl": (".jsonl", _jsonl, None, False),
    "csv": (".csv", _delimited(","), b"text,label", False),
    "tsv": (".tsv", _delimited("\t"), b"text\tlabel", False),
    "txt": (".txt", _txt, None, False),
    "conll": (".conll", _conll_sentence, None, True),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_predict_accounts_for_every_record_of_a_hostile_file(best, tmp_path, fmt, monkeypatch):
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", SHORT_LINE_BOUND)
    suffix, render, header, blank = FORMATS[fmt]
    rng = random.Random(f"{SEED}-{fmt}")
    source = _write(tmp_path / f"in{suffix}", _lines(rng, render, LINES // len(FORMATS)), header, blank)
    out = tmp_path / "out.jsonl"
    summary = predict_file(best, source, out, on_error="skip", batch_size=8, progress=False, workers=1)
    assert summary.read == summary.predicted + summary.skipped
    assert summary.read > 0
    assert len(read_jsonl(out)) == summary.predicted
    errors = read_jsonl(tmp_path / "out.errors.jsonl")
    assert len(errors) == summary.skipped
    assert all(isinstance(e["line"], int) and e["reason"] for e in errors)
    for record in read_jsonl(out):
        assert set(record["predictions"]) == {"ner", "sentiment"}


@pytest.fixture
def tasks(make_config, tmp_path):
    return make_config(tmp_path / "run").tasks


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "conll"])
def test_training_readers_raise_only_user_errors(tasks, tmp_path, fmt, monkeypatch):
    """Each line alone in a file (a reader stops at its first bad record), read by a tagging task, a
    classification task, and both sharing the file: a list of examples or a UserError, nothing else."""
    monkeypatch.setattr(formats, "MAX_LINE_BYTES", SHORT_LINE_BOUND)
    suffix, render, header, blank = FORMATS[fmt]
    if fmt in ("csv", "tsv"):  # the training columns: tokens and ner_tags as JSON lists, text and label
        sep = "," if fmt == "csv" else "\t"
        header = sep.join(["text", "tokens", "ner_tags", "label"]).encode()
        render = _training_row(sep)
    rng = random.Random(f"{SEED}-train-{fmt}")
    readers = [[tasks["ner"]], [tasks["sentiment"]], [tasks["ner"], tasks["sentiment"]]]
    outcomes = {"examples": 0, "errors": 0}
    for i, line in enumerate(_lines(rng, render, LINES // 4)):
        path = _write(tmp_path / f"{i}{suffix}", [line], header, blank)
        for which in readers:
            try:
                list(read_source(Source(str(path), which)))
                outcomes["examples"] += 1
            except UserError as err:  # DataError is one
                assert "\n" not in str(err)
                outcomes["errors"] += 1
    assert outcomes["examples"] and outcomes["errors"]  # the generator makes both kinds


def _training_row(sep: str):
    def render(record: dict) -> bytes:
        cells = [_cell(record.get(k, "")) for k in ("text", "tokens", "ner_tags", "label")]
        quoted = ['"' + c.replace('"', '""') + '"' if sep == "," else c.replace("\t", " ") for c in cells]
        return sep.join(quoted).encode("utf-8", "surrogatepass")

    return render


def test_load_split_on_a_hostile_file_is_a_user_error(tasks, tmp_path):
    """The whole path a run takes (load_split): a file of mutated records stops at the first bad one."""
    rng = random.Random(f"{SEED}-split")
    path = _write(tmp_path / "train.jsonl", _lines(rng, _jsonl, 50))
    ner = dataclasses.replace(tasks["ner"], data=dataclasses.replace(tasks["ner"].data, train=str(path)))
    with pytest.raises(UserError):
        load_split({"ner": ner}, "train")


# ------------------------------------------------------------------------------------------------ issue 27

LABEL_VALUES = [0, 1, 2, -1, 0.0, 1.0, 2.5, float("nan"), "0", "1", "01", "1.0", "1e0", "+1", "nan", "NaN", "pos",
                "neg", " pos ", "1_0", "Infinity"]  # fmt: skip


def _as_number(label: str) -> float | None:
    try:
        return float(label)
    except ValueError:
        return None


def test_class_labels_come_out_as_one_spelling_per_class_or_a_data_error(tasks, tmp_path):
    """Random label columns (JSON and CSV): a file reads into string classes no two of which spell one number, and
    none of which is NaN; or it stops with a DataError naming a line of the file."""
    rng = random.Random(f"{SEED}-labels")
    sentiment = dataclasses.replace(tasks["sentiment"], labels=None)
    outcomes = {"read": 0, "refused": 0}
    for i in range(80):
        values = [rng.choice(LABEL_VALUES) for _ in range(rng.randrange(1, 8))]
        if rng.random() < 0.5:
            path = tmp_path / f"{i}.jsonl"
            path.write_text("".join(json.dumps({"text": f"t {j}", "label": v}) + "\n" for j, v in enumerate(values)))
        else:
            path = tmp_path / f"{i}.csv"
            path.write_text("text,label\n" + "".join(f"t {j},{_cell(v)}\n" for j, v in enumerate(values)))
        try:
            examples = list(read_source(Source(str(path), [sentiment])))
        except UserError as err:
            assert err.path == str(path) and 1 <= err.line <= len(values) + 1 and "\n" not in str(err)
            outcomes["refused"] += 1
            continue
        classes = {ex.labels["sentiment"] for ex in examples}
        assert all(isinstance(c, str) and c and c.lower() != "nan" for c in classes)
        numbers = [n for n in map(_as_number, classes) if n is not None]
        assert len(numbers) == len(set(numbers)), classes  # '1' and '1.0' never both
        outcomes["read"] += 1
    assert outcomes["read"] and outcomes["refused"]


SECTIONS = {
    "model": {"n_layers": [1, 2], "dropout": [0.0, 0.1]},
    "data": {"batch_size": [4, 8], "max_length": [32, 64]},
    "training": {"lr": [0.001, 0.01], "seed": [1, 2]},
}
"""Keys with values that are valid whatever else the file holds: only a repeat can make it wrong."""


def test_a_repeated_yaml_key_is_always_an_error_naming_both_lines(tmp_path):
    """Random experiment files, some with a key repeated (at the top or inside a section): a repeat is always a
    ConfigError naming the two lines the generator put it on; a file without one loads."""
    from mtl_decoder.config import load_config
    from mtl_decoder.errors import ConfigError

    rng = random.Random(f"{SEED}-yaml")
    data = f"{{train: {FIXTURE_SENTIMENT}, validation: {FIXTURE_SENTIMENT}}}"
    (tmp_path / "s.yaml").write_text(f"name: s\nkind: sentence_classification\ndata: {data}\n")
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(60):
        lines, seen = ["tasks: [s.yaml]"], {}
        repeated = None
        for _ in range(rng.randrange(1, 7)):
            section = rng.choice(list(SECTIONS))
            if section in seen and repeated is None and rng.random() < 0.5:
                repeated = (seen[section], len(lines) + 1)
            elif section in seen:
                continue
            seen.setdefault(section, len(lines) + 1)
            lines.append(f"{section}:")
            keys = rng.sample(list(SECTIONS[section]), rng.randrange(1, len(SECTIONS[section]) + 1))
            if repeated is None and rng.random() < 0.2:
                keys.append(keys[0])
                first = len(lines) + 1
                repeated = (first, first + len(keys) - 1)
            for key in keys:
                lines.append(f"  {key}: {rng.choice(SECTIONS[section][key])}")
        path = tmp_path / f"{i}.yaml"
        path.write_text("\n".join(lines) + "\n")
        if repeated is None:
            load_config(path)
            outcomes["loaded"] += 1
            continue
        with pytest.raises(ConfigError, match=rf"on lines {repeated[0]} and {repeated[1]}; keep one"):
            load_config(path)
        outcomes["refused"] += 1
    assert outcomes["loaded"] and outcomes["refused"]


FIXTURE_SENTIMENT = Path(__file__).parent / "fixtures" / "sentiment_train.jsonl"
NAME_PARTS = ["a", "ü", "😀", "x" * 100, "é" * 60, " ", ".", "-", "\x00", "/", "~"]


def test_odd_output_names_are_written_or_refused_in_one_line(tmp_path):
    """Random output names (multi-byte, long, NUL, nested): the output checks refuse one with a UserError, or an
    AtomicFile writes and commits it; never an OSError from the file system."""
    from mtl_decoder.files import AtomicFile
    from mtl_decoder.prediction.outputs import check_output

    rng = random.Random(f"{SEED}-names")
    written = refused = 0
    for _ in range(80):
        name = "".join(rng.choice(NAME_PARTS) for _ in range(rng.randrange(1, 6))).strip("/") or "n"
        target = tmp_path / "out" / name
        try:
            check_output(FIXTURE_SENTIMENT, target, force=True)
            with AtomicFile(target) as out:
                out.write_line("{}")
                out.commit()
        except UserError as err:
            assert "\n" not in str(err)
            refused += 1
            continue
        assert target.read_text() == "{}\n"
        written += 1
    assert written and refused
    assert not [p for p in tmp_path.rglob("*") if ".mtl-tmp-" in p.name or p.name.endswith(".mtl-lock")]
