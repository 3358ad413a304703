"""predict --shard K/N and merge-predictions: the parts of any N, merged in any order, are the output (and errors
file) of one run, byte for byte; each shard holds its blocks, with input index and line; merge refuses, in one
line, parts that are missing, repeated, from another job, incomplete or edited, and an existing output."""

from __future__ import annotations

import json

import pytest
import torch
from predict_testkit import read_jsonl, same_predictions
from test_predict_processes import PREDICT_CASES, write_inputs

from mtl_decoder.cli import main
from mtl_decoder.errors import UserError
from mtl_decoder.prediction import merge_predictions, predict_file
from mtl_decoder.processes import Share
from mtl_decoder.saved import load_model

RECORDS, BATCH = 150, 4  # blocks of 64 records: 3 blocks, the last one short


@pytest.fixture(scope="module")
def model(best):
    return load_model(best)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("shard-inputs"), RECORDS)


def predict(model, source, out, mode="skip", shard=None, batch_size=BATCH):
    return predict_file(model, source, out, batch_size=batch_size, on_error=mode, progress=False, shard=shard)


def parts(model, source, folder, n, mode="skip", batch_size=BATCH) -> list:
    out = []
    for k in range(n):
        out.append(folder / f"part-{k}-of-{n}.jsonl")
        predict(model, source, out[-1], mode, f"{k}/{n}", batch_size)
    return out


@pytest.mark.parametrize("name", ["jsonl-bad-skip", "txt-bad-skip", "csv", "csv-bad-skip"])
def test_merged_parts_are_the_output_of_one_run(model, inputs, tmp_path, name):
    source, mode = PREDICT_CASES[name]
    whole = predict(model, inputs[source], tmp_path / "one.jsonl", mode)
    for n in (1, 3) if name == "csv-bad-skip" else (3,):
        pieces = parts(model, inputs[source], tmp_path, n, mode)
        merged = merge_predictions(tmp_path / f"merged-{n}.jsonl", pieces[::-1])  # any order
        assert (tmp_path / f"merged-{n}.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
        if mode == "skip":
            errors = (tmp_path / f"merged-{n}.errors.jsonl").read_bytes()
            assert errors == (tmp_path / "one.errors.jsonl").read_bytes()
        else:
            assert not (tmp_path / f"merged-{n}.errors.jsonl").exists()
        counts = ("read", "predicted", "skipped", "truncated", "windowed", "tokens", "empty_lines")
        assert {k: getattr(merged, k) for k in counts} == {k: getattr(whole, k) for k in counts}


def test_each_shard_holds_its_blocks_with_input_index_and_line(model, inputs, tmp_path):
    pieces = parts(model, inputs["jsonl-bad"], tmp_path, 3)
    source_lines = inputs["jsonl-bad"].read_text(encoding="utf-8").splitlines()
    share = [Share(BATCH * 16, k, 3) for k in range(3)]
    indices = []
    dealt = 0  # readable records before each one (bad records go with the block the stream is in)
    for index, text in enumerate(source_lines):
        bad = text.startswith('{"tokens": []') or not text.endswith("}")
        indices.append((index, dealt, bad))
        dealt += not bad
    for k, path in enumerate(pieces):
        entries = read_jsonl(path)
        footer = entries.pop()["part"]
        assert (footer["shard"], footer["shards"], footer["block"], footer["records"]) == (k, 3, 64, RECORDS + 2)
        expected = [i for i, d, bad in indices if share[k].in_shard(d)]
        assert sorted(e["index"] for e in entries) == expected
        for entry in entries:
            assert entry["line"] == entry["index"] + 1  # one record per line in this file
            if "record" in entry:
                assert entry["record"]["tokens"] == json.loads(source_lines[entry["index"]])["tokens"]
            else:
                assert entry["error"]["raw"] == source_lines[entry["index"]]
        assert footer["read"] == len(entries) and footer["skipped"] == sum("error" in e for e in entries)
    assert sum(read_jsonl(p)[-1]["part"]["read"] for p in pieces) == RECORDS + 2


def test_merge_refuses_what_is_not_one_whole_job(model, inputs, tmp_path):
    pieces = parts(model, inputs["csv"], tmp_path, 3, "fail")
    out = tmp_path / "out.jsonl"
    with pytest.raises(UserError, match=r"shard 1/3 is missing \(1 of 3; given: 0/3, 2/3\)"):
        merge_predictions(out, [pieces[0], pieces[2]])
    with pytest.raises(UserError, match=r"part-0-of-3.jsonl: shard 0/3 again"):
        merge_predictions(out, [*pieces, pieces[0]])
    other = tmp_path / "other"
    other.mkdir()
    smaller = parts(model, inputs["csv"], other, 3, "fail", batch_size=2)
    with pytest.raises(UserError, match=r"block is 32, but .* has 64: not parts of one job"):
        merge_predictions(out, [pieces[0], pieces[1], smaller[2]])
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("".join(pieces[1].read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(UserError, match=r"truncated.jsonl: not a complete part written by predict --shard"):
        merge_predictions(out, [pieces[0], truncated, pieces[2]])
    lines = pieces[1].read_text().splitlines(keepends=True)
    repeated = tmp_path / "repeated.jsonl"
    repeated.write_text(lines[0] + "".join(lines))  # its first record twice
    with pytest.raises(UserError, match=r"repeated.jsonl:2: record index 64 after 64: the part is out of order"):
        merge_predictions(out, [pieces[0], repeated, pieces[2]])
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text("".join(lines[1:]))  # its first record lost
    with pytest.raises(UserError, match=r"record index 64 is in no part \(next: 65"):
        merge_predictions(out, [pieces[0], dropped, pieces[2]])
    assert not out.exists()
    merge_predictions(out, pieces)
    with pytest.raises(UserError, match="already exists"):
        merge_predictions(out, pieces)
    with pytest.raises(UserError, match="is one of the parts"):
        merge_predictions(pieces[0], pieces, force=True)


def test_merge_refuses_parts_of_another_model_or_another_input(model, best, inputs, tmp_path):
    """A part predicted by another model, or read from another file of the same name and length, is refused in one
    line naming the part, however alike the footers' other fields are."""
    import shutil

    from mtl_decoder.saved import save_model

    pieces = parts(model, inputs["csv"], tmp_path, 3, "fail")
    out = tmp_path / "out.jsonl"
    other_model = load_model(best)
    with torch.no_grad():
        next(other_model.model.parameters()).add_(0.01)
    save_model(tmp_path / "other-model", other_model.model, other_model.encoder, other_model.config,
               other_model.label_sets)  # fmt: skip
    other = tmp_path / "other"
    other.mkdir()
    theirs = parts(load_model(tmp_path / "other-model"), inputs["csv"], other, 3, "fail")
    with pytest.raises(UserError, match=r"other/part-2-of-3.jsonl: predicted by another model .*not parts of one job"):
        merge_predictions(out, [pieces[0], pieces[1], theirs[2]])
    same_name = tmp_path / "same-name"
    same_name.mkdir()
    lines = inputs["csv"].read_text(encoding="utf-8").splitlines(keepends=True)
    lines[5] = lines[5].replace(",", ",edited ", 1)  # one text changed: same name, same number of records
    (same_name / inputs["csv"].name).write_text("".join(lines), encoding="utf-8")
    edited = parts(model, same_name / inputs["csv"].name, same_name, 3, "fail")
    with pytest.raises(UserError, match=r"same-name/part-1-of-3.jsonl: read another input .*not parts of one job"):
        merge_predictions(out, [pieces[0], edited[1], pieces[2]])
    copied = tmp_path / "copied.csv"
    shutil.copy(inputs["csv"], copied)  # the same content elsewhere: the same fingerprints
    moved = tmp_path / "moved"
    moved.mkdir()
    again = parts(model, copied, moved, 3, "fail")
    footers = [read_jsonl(p)[-1]["part"] for p in (pieces[0], again[1])]
    assert footers[0]["input_sha256"] == footers[1]["input_sha256"] and footers[0]["model"] == footers[1]["model"]
    assert not out.exists()


def test_cli_shard_and_merge(best, inputs, tmp_path, capsys):
    source = str(inputs["txt-bad"])
    for k in range(2):
        argv = ["predict", "--model", str(best), "--input", source, "--output", str(tmp_path / f"p{k}.jsonl"),
                "--on-error", "skip", "--shard", f"{k}/2", "--batch-size", str(BATCH)]  # fmt: skip
        assert main(argv) == 0
    capsys.readouterr()
    out = tmp_path / "all.jsonl"
    assert main(["merge-predictions", str(out), str(tmp_path / "p0.jsonl"), str(tmp_path / "p1.jsonl")]) == 0
    said = capsys.readouterr().out
    assert said.startswith("merged 2 parts") and f"read {RECORDS + 1} records: predicted {RECORDS}, skipped 1," in said
    assert len(read_jsonl(out)) == RECORDS and len(read_jsonl(tmp_path / "all.errors.jsonl")) == 1
    assert main(["merge-predictions", str(out), str(tmp_path / "p0.jsonl")]) == 2
    assert "shard 1/2 is missing" in capsys.readouterr().err
    for bad in ("2/2", "-1/2", "1", "a/b", "1/0"):
        argv = ["predict", "--model", str(best), "--input", source, "--output", str(tmp_path / "x.jsonl"),
                f"--shard={bad}"]  # fmt: skip
        assert main(argv) == 2
        assert "--shard must be K/N with 0 <= K < N" in capsys.readouterr().err
    stream = ["predict", "--stream", "--model", str(best), "--input", source, "--output", "-", "--shard", "0/2"]
    assert main(stream) == 2
    assert "--stream reads one text in one process" in capsys.readouterr().err


def test_every_shard_batches_within_max_tokens(best, inputs, tmp_path, monkeypatch, capsys):
    """--max-tokens reaches the Predictor a shard builds: each part's batches hold 16 padded sub-words at most (a
    longer row alone), and the merged parts predict what one default run does."""
    from mtl_decoder.inference import Predictor

    source, shapes, form = str(inputs["jsonl"]), [], Predictor._batches

    def spy(self, pieces):
        batches = form(self, pieces)
        shapes.extend((self.max_tokens, len(b), max(len(p.encoded.ids) for p in b)) for b in batches)
        return batches

    monkeypatch.setattr(Predictor, "_batches", spy)
    whole = tmp_path / "whole.jsonl"
    assert main(["predict", "--model", str(best), "--input", source, "--output", str(whole)]) == 0
    default, shapes[:] = shapes[:], []
    for k in range(2):
        argv = ["predict", "--model", str(best), "--input", source, "--output", str(tmp_path / f"p{k}.jsonl"),
                "--shard", f"{k}/2", "--max-tokens", "16"]  # fmt: skip
        assert main(argv) == 0
    assert {bound for bound, _, _ in shapes} == {16} and {bound for bound, _, _ in default} == {2048}
    assert all(rows * longest <= 16 or rows == 1 for _, rows, longest in shapes)
    assert sum(rows for _, rows, _ in shapes) == sum(rows for _, rows, _ in default)  # the same pieces (windows)
    assert len(shapes) > len(default) and any(rows > 1 for _, rows, _ in shapes)
    merged = tmp_path / "merged.jsonl"
    assert main(["merge-predictions", str(merged), str(tmp_path / "p0.jsonl"), str(tmp_path / "p1.jsonl")]) == 0
    capsys.readouterr()
    got, want = read_jsonl(merged), read_jsonl(whole)
    assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
    kinds = {"ner": "token_tagging", "sentiment": "sentence_classification"}
    assert all(same_predictions(a["predictions"], b["predictions"], kinds) for a, b in zip(got, want, strict=True))


def test_the_merge_is_reachable_from_the_package():
    import mtl_decoder

    assert mtl_decoder.merge_predictions is merge_predictions
