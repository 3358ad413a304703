"""Per-word features: character ids and shape classes."""

from mtl_decoder.data.wordfeatures import MAX_WORD_CHARS, N_CHAR_IDS, SHAPES, char_id, char_ids, shape_id


def test_char_ids_agree_with_the_per_character_rule():
    for word in ["Berlin", "U.S.", "a\0b", "Zürich", "東京", "x" * 40, "", "über-long-compound-word"]:
        kept = word if len(word) <= MAX_WORD_CHARS else word[:8] + word[-8:]
        assert char_ids(word) == [char_id(c) for c in kept]
    assert char_ids("a\0b") == [ord("a"), 1, ord("b")]  # 0 is padding: NUL takes id 1
    assert all(128 <= i < N_CHAR_IDS for i in char_ids("東京"))
    assert char_ids("abcdefgh12345678XYZ") == [ord(c) for c in "abcdefgh" + "345678XYZ"[-8:]]


def test_shape_classes():
    expected = {"Berlin": "capitalised", "EU": "all_caps", "I": "single_cap", "1996": "digits", "B2B": "has_digit"}
    expected |= {",": "punct", "iPhone": "mixed_case", "the": "lower", "": "other"}
    assert {w: SHAPES[shape_id(w)] for w in expected} == expected
