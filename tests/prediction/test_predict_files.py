"""predict on files: every format agrees, fields and order are kept, bad records stop or are set aside, outputs
are never half-written or silently overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from predict_testkit import (
    SENTENCES,
    read_jsonl,
    same_predictions,
    texts,
    write_conll,
    write_delimited,
    write_jsonl,
    write_lines,
)

from mtl_decoder.cli import main
from mtl_decoder.errors import DataError, UserError
from mtl_decoder.prediction import predict_file, predict_texts
from mtl_decoder.saved import load_model

KINDS = {"ner": "token_tagging", "sentiment": "sentence_classification"}


@pytest.fixture(scope="module")
def model(best):
    return load_model(best)


def _inputs(folder) -> dict:
    rows = [{"id": i, "text": t} for i, t in enumerate(texts())]
    return {
        "tokens.jsonl": write_jsonl(folder / "tokens.jsonl", [{"id": i, "tokens": s} for i, s in enumerate(SENTENCES)]),
        "conll": write_conll(folder / "in.conll", SENTENCES),
        "text.jsonl": write_jsonl(folder / "text.jsonl", rows),
        "csv": write_delimited(folder / "in.csv", rows, ","),
        "tsv": write_delimited(folder / "in.tsv", [{"text": r["text"], "id": r["id"]} for r in rows], "\t"),
        "txt": write_lines(folder / "in.txt", texts()),
    }


def test_every_format_gives_the_same_predictions(model, tmp_path):
    outputs = {}
    for name, path in _inputs(tmp_path).items():
        out = tmp_path / f"out-{name}.jsonl"
        summary = predict_file(model, path, out, batch_size=2, progress=False)
        assert (summary.read, summary.predicted, summary.skipped) == (len(SENTENCES), len(SENTENCES), 0), name
        outputs[name] = read_jsonl(out)
    reference = [r["predictions"] for r in outputs["tokens.jsonl"]]
    for name, records in outputs.items():
        assert len(records) == len(SENTENCES), name
        for record, expected, tokens in zip(records, reference, SENTENCES, strict=True):
            assert same_predictions(record["predictions"], expected, KINDS), name
            if "words" in record["predictions"]["ner"]:  # raw text: the words it was tagged in, with offsets
                assert record["predictions"]["ner"]["words"] == tokens
    assert [r["id"] for r in outputs["text.jsonl"]] == list(range(len(SENTENCES)))
    assert [r["id"] for r in outputs["csv"]] == [str(i) for i in range(len(SENTENCES))]  # CSV cells are text
    assert list(outputs["tsv"][0]) == ["text", "id", "predictions"]
    assert outputs["conll"][0]["tokens"] == SENTENCES[0] and outputs["conll"][0]["columns"][0] == ["NNP", "O"]
    assert outputs["txt"][1]["text"] == texts()[1]


def test_order_is_kept_with_length_grouped_batches(model, tmp_path):
    long = " ".join(["word"] * 70)  # longer than max_length 48: tagged in windows
    items = [texts()[0], long, "a b", SENTENCES[1], "x " * 30, texts()[2], "ok", SENTENCES[3], long + " end"]
    records = [{"n": i, "tokens": x} if isinstance(x, list) else {"n": i, "text": x} for i, x in enumerate(items)]
    out = tmp_path / "out.jsonl"
    summary = predict_file(model, write_jsonl(tmp_path / "mixed.jsonl", records), out, batch_size=2, progress=False)
    got = read_jsonl(out)
    assert [r["n"] for r in got] == list(range(len(items)))
    assert summary.windowed == 2 and summary.truncated == 2
    for record in got:  # each record's prediction is the one it gets alone
        alone = tmp_path / f"alone{record['n']}.jsonl"
        predict_file(model, write_jsonl(tmp_path / "one.jsonl", [records[record["n"]]]), alone, force=True)
        assert same_predictions(record["predictions"], read_jsonl(alone)[0]["predictions"], KINDS)


def _bad_file(folder):
    lines = [json.dumps({"text": t}) for t in texts()]
    lines[2] = '{"text": "unterminated'
    lines.insert(1, "")
    return write_lines(folder / "in.jsonl", lines)  # the bad record is on line 4


def test_fail_mode_names_the_line_and_leaves_no_output(best, tmp_path, capsys):
    source, out = _bad_file(tmp_path), tmp_path / "out.jsonl"
    code = main(["predict", "--model", str(best), "--input", str(source), "--output", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {source}:4: malformed JSON") and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output, no temporary file


def test_skip_mode_sets_bad_records_aside_with_counts(best, tmp_path, capsys):
    source, out = _bad_file(tmp_path), tmp_path / "out.jsonl"
    args = ["predict", "--model", str(best), "--input", str(source), "--output", str(out)]
    assert main([*args, "--on-error", "skip", "--batch-size", "2"]) == 0
    report = capsys.readouterr().out
    assert "read 5 records: predicted 4, skipped 1" in report and "empty lines skipped 1" in report
    assert "records/s" in report and "words/s" in report
    assert [r["text"] for r in read_jsonl(out)] == [t for i, t in enumerate(texts()) if i != 2]
    [error] = read_jsonl(tmp_path / "out.errors.jsonl")
    assert error["line"] == 4 and error["reason"].startswith("malformed JSON")
    assert error["raw"] == '{"text": "unterminated'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.errors.jsonl", "out.jsonl"]


def test_existing_output_needs_force(model, best, tmp_path, capsys):
    source = write_lines(tmp_path / "in.txt", texts())
    out = tmp_path / "out.jsonl"
    out.write_text("keep me\n", encoding="utf-8")
    args = ["predict", "--model", str(best), "--input", str(source), "--output", str(out)]
    assert main(args) == 2
    assert "already exists (use --force" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "keep me\n"
    (tmp_path / "new.errors.jsonl").write_text("old\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"new\.errors\.jsonl: already exists"):  # skip mode also writes the errors file
        predict_file(model, source, tmp_path / "new.jsonl", on_error="skip")
    assert not (tmp_path / "new.jsonl").exists()
    assert main([*args, "--force"]) == 0
    assert len(read_jsonl(out)) == len(SENTENCES)
    with pytest.raises(UserError, match="overwrite the input"):
        predict_file(model, source, source, force=True)


def test_task_selection_and_bad_arguments(model, tmp_path):
    source = write_lines(tmp_path / "in.txt", texts()[:2])
    summary = predict_file(model, source, tmp_path / "out.jsonl", tasks="sentiment", progress=False)
    assert summary.predicted == 2
    assert all(list(r["predictions"]) == ["sentiment"] for r in read_jsonl(tmp_path / "out.jsonl"))
    with pytest.raises(UserError, match="did you mean 'sentiment'"):
        predict_file(model, source, tmp_path / "x.jsonl", tasks="sentimnt")
    with pytest.raises(DataError, match="--format"):
        predict_file(model, write_lines(tmp_path / "in.dat", ["x"]), tmp_path / "y.jsonl")
    assert predict_file(model, tmp_path / "in.dat", tmp_path / "y.jsonl", fmt="txt").predicted == 1


def test_cli_precision_flag(best, tmp_path, capsys):
    argv = ["predict", "--model", str(best), "--input", str(write_lines(tmp_path / "in.txt", texts()))]
    assert main([*argv, "--output", str(tmp_path / "a.jsonl"), "--precision", "bf16"]) == 0
    assert "(bf16)" in capsys.readouterr().out and len(read_jsonl(tmp_path / "a.jsonl")) == len(texts())
    assert main([*argv, "--output", str(tmp_path / "b.jsonl"), "--precision", "fp16"]) == 2
    assert "fp16 is for GPUs" in capsys.readouterr().err and not (tmp_path / "b.jsonl").exists()


# ------------------------------------------------------------------------------------------------ --max-tokens


def _spy_batches(monkeypatch) -> list[tuple[int, list[tuple[int, int]]]]:
    """Every batch the Predictor forms from here on, as (its max_tokens, [(rows, longest sub-word count)])."""
    from mtl_decoder.inference import Predictor

    seen = []
    form = Predictor._batches

    def spy(self, pieces):
        batches = form(self, pieces)
        seen.append((self.max_tokens, [(len(b), max(len(p.encoded.ids) for p in b)) for b in batches]))
        return batches

    monkeypatch.setattr(Predictor, "_batches", spy)
    return seen


def _mixed_records() -> list[dict]:
    """The fixtures' test token lists and texts, of 2 to ~40 words: short and long ones in one buffer."""
    fixtures = Path(__file__).parent.parent / "fixtures"
    ner = [json.loads(line) for line in (fixtures / "ner_test.jsonl").read_text(encoding="utf-8").splitlines()]
    texts_ = [json.loads(line) for line in (fixtures / "sentiment_test.jsonl").read_text(encoding="utf-8").splitlines()]
    return [{"tokens": r["tokens"]} for r in ner] + [{"text": r["text"]} for r in texts_]


def _without_probs(records: list[dict]) -> list[dict]:
    return [{**r, "predictions": {**r["predictions"], "sentiment": {**r["predictions"]["sentiment"], "probs": None}}}
            for r in records]  # fmt: skip


def test_max_tokens_bounds_the_batches_and_leaves_the_predictions_alone(best, tmp_path, monkeypatch, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", _mixed_records())
    argv = ["predict", "--model", str(best), "--input", str(source), "--workers", "1"]
    seen, formed = _spy_batches(monkeypatch), {}
    for flag in (None, "0", "16"):
        out = tmp_path / f"out-{flag}.jsonl"
        extra = [] if flag is None else ["--max-tokens", flag]
        assert main([*argv, "--output", str(out), *extra]) == 0, capsys.readouterr().err
        formed[flag] = seen[:]
        seen.clear()
    reference = read_jsonl(tmp_path / "out-None.jsonl")
    assert len(reference) == len(_mixed_records())
    for flag in ("0", "16"):  # the same file but for float32 rounding of the probabilities (other batch shapes)
        assert _without_probs(read_jsonl(tmp_path / f"out-{flag}.jsonl")) == _without_probs(reference), flag
        for got, want in zip(read_jsonl(tmp_path / f"out-{flag}.jsonl"), reference, strict=True):
            probs = got["predictions"]["sentiment"]["probs"]
            assert probs == pytest.approx(want["predictions"]["sentiment"]["probs"], abs=1e-6), flag

    assert {bound for bound, _ in formed[None]} == {2048} and {bound for bound, _ in formed["0"]} == {0}
    [(bound, small)] = formed["16"]  # one buffer of 40 records: one call
    assert bound == 16
    for rows, longest in small:  # 16 padded sub-words at most, unless one row alone is longer
        assert rows * longest <= 16 or rows == 1, (rows, longest)
    assert any(rows > 1 for rows, _ in small)  # the bound packs short rows together, not one row per batch
    [(_, default)] = formed[None]
    assert len(small) > len(default)
    assert sum(rows for rows, _ in small) == sum(rows for rows, _ in default)  # the same pieces, cut finer


def test_negative_max_tokens_is_a_one_line_error_and_writes_nothing(best, tmp_path, capsys):
    source, out = write_lines(tmp_path / "in.txt", texts()), tmp_path / "out.jsonl"
    for extra in ([], ["--shard", "0/2"]):
        argv = ["predict", "--model", str(best), "--input", str(source), "--output", str(out), *extra]
        assert main([*argv, "--max-tokens", "-1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == "error: --max-tokens must be 0 (no token bound) or a positive number of sub-words, got -1"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no output, no temporary file
    with pytest.raises(UserError, match="max_tokens must be 0"):
        predict_texts(best, texts(), max_tokens=-3)
