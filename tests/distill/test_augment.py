"""``mtl-decoder augment``: each rule does what it says, checked against plain references.

Drops leave an in-order subsequence at about the asked rate; swaps keep every word's shape (a regex shape written
here, not the library's) and draw by frequency; cuts leave a contiguous run of 1 to max-ngram words; the same seed
gives the same file, no copy repeats a text or another copy, and bad flags or records are one-line errors that
leave nothing at --output.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from mtl_decoder.cli import main

SHAPES = [("lower", r"[a-z]+"), ("capitalised", r"[A-Z][a-z]+"), ("caps", r"[A-Z]{2,}"), ("digits", r"[0-9]+"),
          ("punct", r"[.,!?]+")]  # fmt: skip
WORDS = {"lower": ["the", "film", "was", "dull", "bright"], "capitalised": ["Paris", "Anna", "Reuters"],
         "caps": ["UN", "NATO"], "digits": ["1996", "3"], "punct": [",", "."]}  # fmt: skip


def shape(word: str) -> str:
    return next(name for name, pattern in SHAPES if re.fullmatch(pattern, word))


def corpus(n: int, length: int = 10, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    kinds = list(WORDS)
    return [[rng.choice(WORDS[rng.choice(kinds)]) for _ in range(length)] for _ in range(n)]


def augmented(tmp_path: Path, texts: list[list[str]], *flags: str, name: str = "out.txt") -> list[list[str]]:
    source = tmp_path / "in.txt"
    source.write_text("".join(" ".join(words) + "\n" for words in texts))
    out = tmp_path / name
    assert main(["augment", "--input", str(source), "--output", str(out), *flags]) == 0
    return [line.split(" ") for line in out.read_text().splitlines()]


def is_subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return all(word in it for word in short)


def is_run(short: list[str], long: list[str]) -> bool:
    return any(long[i : i + len(short)] == short for i in range(len(long) - len(short) + 1))


def test_drops_leave_an_in_order_subsequence_at_the_asked_rate(tmp_path):
    texts = corpus(2000)
    copies = augmented(tmp_path, texts, "--drop", "0.3", "--swap", "0", "--ngram", "0")
    assert len(copies) == len(texts)  # one copy each, in input order
    assert all(is_subsequence(c, t) and len(c) < len(t) for c, t in zip(copies, texts, strict=True))
    dropped = 1 - sum(map(len, copies)) / sum(map(len, texts))
    # 20,000 words at 0.3: four standard deviations are 0.013; a copy with no word dropped is drawn again (2.8% of
    # ten-word texts), which lifts the rate by about 0.01
    assert 0.29 < dropped < 0.325


def test_swaps_keep_each_words_shape_and_draw_by_frequency(tmp_path):
    texts = corpus(500)
    copies = augmented(tmp_path, texts, "--drop", "0", "--swap", "1", "--ngram", "0")
    assert all(len(c) == len(t) for c, t in zip(copies, texts, strict=True))
    assert all(shape(a) == shape(b) for c, t in zip(copies, texts, strict=True) for a, b in zip(c, t, strict=True))
    counts = {}
    for words in texts:
        for word in words:
            counts[word] = counts.get(word, 0) + 1
    lower = [w for w in counts if shape(w) == "lower"]
    expected = {w: counts[w] / sum(counts[v] for v in lower) for w in lower}
    drawn = [w for c in copies for w in c if shape(w) == "lower"]
    for word, share in expected.items():  # ~1,000 lower-case draws: the share within 0.05 of the count's
        assert abs(drawn.count(word) / len(drawn) - share) < 0.05, word


def test_cuts_leave_a_run_of_one_to_max_ngram_words(tmp_path):
    texts = corpus(300, length=12)
    copies = augmented(tmp_path, texts, "--drop", "0", "--swap", "0", "--ngram", "1", "--max-ngram", "4")
    assert all(1 <= len(c) <= 4 and is_run(c, t) for c, t in zip(copies, texts, strict=True))
    assert {len(c) for c in copies} == {1, 2, 3, 4}


def test_the_same_seed_gives_the_same_file_and_no_copy_repeats(tmp_path, capsys):
    texts = corpus(200, length=6)
    first = augmented(tmp_path, texts, "--copies", "3", "--keep-inputs", name="a.txt")
    again = augmented(tmp_path, texts, "--copies", "3", "--keep-inputs", name="b.txt")
    other = augmented(tmp_path, texts, "--copies", "3", "--keep-inputs", "--seed", "1", name="c.txt")
    assert first == again and first != other
    assert first[: len(texts)] == texts  # --keep-inputs: the texts first, as they were
    copies = [" ".join(c) for c in first[len(texts) :]]
    assert len(copies) == len(set(copies)) and not set(copies) & {" ".join(t) for t in texts}
    report = capsys.readouterr().out
    left_out = 3 * len(texts) - len(copies)
    assert f"{len(copies):,} copies of {len(texts)} texts" in report
    assert (f"{left_out:,} left out" in report) == (left_out > 0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--drop", "1.5"], "--drop: must lie in [0, 1]"),
        (["--drop", "0.6", "--swap", "0.6"], "--drop + --swap"),
        (["--copies", "0"], "--copies: must be at least 1"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, flags, message):
    (tmp_path / "in.txt").write_text("a b c\n")
    assert main(["augment", "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o.txt"), *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "o.txt").exists()


def test_nothing_is_overwritten_or_half_written(tmp_path, capsys):
    good = tmp_path / "in.txt"
    good.write_text("the film was dull\n")
    out = tmp_path / "out.txt"
    out.write_text("kept\n")
    assert main(["augment", "--input", str(good), "--output", str(out)]) == 2
    assert "use --force" in capsys.readouterr().err and out.read_text() == "kept\n"
    assert main(["augment", "--input", str(good), "--output", str(good), "--force"]) == 2
    assert "is one of the inputs" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    fresh = tmp_path / "fresh.txt"
    assert main(["augment", "--input", str(good), "--input", str(bad), "--output", str(fresh)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: field 'text'" in err and not fresh.exists()
    assert main(["augment", "--input", str(good), "--output", str(out), "--force"]) == 0
    assert out.read_text() != "kept\n"
