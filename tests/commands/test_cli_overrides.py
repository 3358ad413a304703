"""The command line (issue 38 case 13): ``key=value`` overrides are taken wherever they stand among the flags, an
argument that is neither stays an error, and a name holding a control or bidirectional-override character is
printed escaped, never raw."""

from __future__ import annotations

import argparse

import pytest

from mtl_decoder.cli import main, printable


def _parsed(argv: list[str]) -> argparse.Namespace:
    seen: list[argparse.Namespace] = []
    assert main(argv, run=seen.append) == 0
    return seen[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--config", "c.yaml", "a=1", "--resume", "b=2"],
        ["train", "--config", "c.yaml", "--resume", "a=1", "b=2"],
        ["train", "a=1", "--config", "c.yaml", "b=2", "--resume"],
        ["train", "--config", "c.yaml", "a=1", "--output-dir", "runs/x", "b=2", "--resume"],
    ],
)
def test_overrides_are_taken_anywhere_in_order(argv):
    args = _parsed(argv)
    assert args.overrides == ["a=1", "b=2"] and args.resume and args.config == "c.yaml"


def test_overrides_after_a_flag_for_debug_data_and_distill():
    assert _parsed(["debug-data", "--config", "c.yaml", "--json", "a=1"]).overrides == ["a=1"]
    assert _parsed(["distill", "--config", "c.yaml", "--unlabelled", "u.txt", "a=1"]).overrides == ["a=1"]


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--config", "c.yaml", "--resume", "a=1", "--nope"],
        ["train", "--config", "c.yaml", "a=1", "--resume", "stray"],
        ["evaluate", "--model", "m", "a=1"],  # evaluate takes no overrides
    ],
)
def test_what_is_not_an_override_is_still_unrecognized(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv, run=lambda args: 0)
    assert info.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_printable_escapes_controls_and_bidi_overrides_only():
    assert printable("tasks.ner\u202eabc: x\x1b[2J") == "tasks.ner\\u202eabc: x\\x1b[2J"
    assert printable("实体 café\tline\nnext") == "实体 café\tline\nnext"


def test_a_task_name_with_a_right_to_left_override_is_printed_escaped(tmp_path, capsys):
    (tmp_path / "t.yaml").write_text(
        'name: "ner\\u202eabc"\nkind: token_tagging\ndata: {train: x.jsonl}\n', encoding="utf-8"
    )
    (tmp_path / "c.yaml").write_text("tasks: [t.yaml]\n", encoding="utf-8")
    assert main(["debug-data", "--config", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "\u202e" not in err and "ner\\u202eabc" in err and err.count("\n") == 1
