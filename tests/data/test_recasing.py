"""model.all_caps: the truecase table, the recased words and texts (same lengths, same offsets), and the encoder
that tokenises the recased line while its outputs keep the line's own words."""

from __future__ import annotations

import json

import pytest
from hf_testkit import tiny_tokenizer

from mtl_decoder.config import ModelConfig
from mtl_decoder.data.recasing import Recaser, build_table, is_all_caps
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.errors import ConfigError, UserError

LINES = [
    ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
    ["The", "German", "call", "was", "rejected", "in", "Brussels", "."],
    ["German", "lamb", "sales", "fell", "."],  # "German" first: counts only where nowhere else (it is elsewhere)
    ["Brussels", "said", "the", "EU", "would", "decide", "."],
    ["Sales", "rose", "."],  # "Sales" only first, but "sales" elsewhere: the inner form wins
    ["Reuters", "reported", "."],  # "Reuters" seen only first: kept as it is
    ["GERMAN", "LAMB", "BAN", "."],  # all caps: says nothing of a word's usual form
    ["the", "germans", "liked", "it"],  # all lower case (as SST-2): says nothing either
]


def test_the_table_counts_mixed_case_lines_and_first_words_only_as_a_last_resort():
    table = build_table(LINES)
    assert table["german"] == "German" and table["eu"] == "EU" and table["lamb"] == "lamb"
    assert table["sales"] == "sales" and table["reuters"] == "Reuters" and table["the"] == "the"
    assert "ban" not in table and "germans" not in table and "." not in table  # no letters: never recased


def test_headlines_are_the_lines_whose_lettered_words_are_all_upper_case():
    assert is_all_caps(["SOCCER", "-", "JAPAN", "WIN", "2-1", "."]) and is_all_caps(["U.S.", "EU"])
    assert not is_all_caps(["BRUSSELS", "1996-08-22"]) and not is_all_caps(["EU", "rejects"])


def test_truecase_recases_a_headline_word_by_word_and_title_cases_the_unknown():
    recaser = Recaser("truecase", build_table(LINES))
    headline = ["EU", "BANS", "GERMAN", "LAMB", "IN", "BRUSSELS", "."]
    assert recaser.words(headline) == ["EU", "Bans", "German", "lamb", "in", "Brussels", "."]
    line = ["EU", "rejects", "German", "lamb"]
    assert recaser.words(line) is line  # not a headline: the very list, untouched
    assert Recaser("lower").words(headline) == ["eu", "bans", "german", "lamb", "in", "brussels", "."]
    assert Recaser("title").words(["U.S.", "WIN"]) == ["U.s.", "Win"]
    assert Recaser("keep").words(headline) is headline


def test_a_word_whose_recased_form_changes_length_is_kept():
    assert "İ".lower() != "i" and len("İSTANBUL".lower()) == 9  # U+0130 lower-cases to two code points
    assert Recaser("lower").words(["İSTANBUL", "WINS"]) == ["İSTANBUL", "wins"]


def test_a_recased_text_keeps_every_offset():
    recaser = Recaser("truecase", build_table(LINES))
    text = "  EU\tBANS  GERMAN LAMB .\n"
    shown = recaser.text(text)
    assert shown == "  EU\tBans  German lamb .\n" and len(shown) == len(text)
    assert recaser.text("EU rejects lamb") == "EU rejects lamb"


def test_the_encoder_tokenises_the_recased_headline_and_reports_its_own_words():
    table = build_table(LINES)
    headline = ["EU", "BANS", "GERMAN", "LAMB", "."]
    plain = TextEncoder(tiny_tokenizer(), 64, words_as_text=True)
    recasing = TextEncoder(tiny_tokenizer(), 64, words_as_text=True, recaser=Recaser("truecase", table))
    got = recasing.encode_words(headline)
    expected = plain.encode_words(["EU", "Bans", "German", "lamb", "."])
    assert got.ids == expected.ids and got.alignment == expected.alignment and got.words == headline
    assert got.ids != plain.encode_words(headline).ids  # the tokenizer did see other text
    text = "EU BANS  GERMAN LAMB ."
    from_text = recasing.encode_text(text)
    assert from_text.ids == plain.encode_text("EU Bans  German lamb .").ids
    assert from_text.words == ["EU", "BANS", "GERMAN", "LAMB", "."]
    assert [text[s:e] for s, e in from_text.spans] == from_text.words
    batched = recasing.encode_batch([headline, text, ["EU", "rejects", "lamb"]])
    singles = [recasing.encode_words(headline), from_text, recasing.encode_words(["EU", "rejects", "lamb"])]
    assert [(b.ids, b.words, b.spans) for b in batched] == [(s.ids, s.words, s.spans) for s in singles]


def test_the_table_is_saved_beside_the_tokenizer_and_read_back(tmp_path):
    encoder = TextEncoder(tiny_tokenizer(), 64, True, recaser=Recaser("truecase", build_table(LINES)))
    encoder.save(tmp_path)
    loaded = TextEncoder.load(tmp_path, 64, True, "first", "truecase")
    assert loaded.recaser.table == build_table(LINES)
    (tmp_path / "truecase.json").write_text(json.dumps({"eu": 3}))
    with pytest.raises(UserError, match=r"truecase\.json: not a truecase table"):
        TextEncoder.load(tmp_path, 64, True, "first", "truecase")
    (tmp_path / "truecase.json").unlink()
    with pytest.raises(UserError, match=r"no truecase\.json"):
        TextEncoder.load(tmp_path, 64, True, "first", "truecase")


def test_an_unknown_mode_names_the_key():
    with pytest.raises(ConfigError, match="all_caps"):
        ModelConfig(all_caps="upper")
