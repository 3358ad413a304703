"""Offsets of words and entities in raw text: text[start:end] is always the word or the entity (pure functions,
hand-made tags, a real tokenizer trained in the test)."""

from __future__ import annotations

import pytest

from mtl_decoder.config import TokenizerConfig
from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.inference import Prediction
from mtl_decoder.prediction.outputs import entity_dicts, prediction_dict, word_spans

KINDS = {"ner": "token_tagging", "sentiment": "sentence_classification"}
TEXTS = [
    "Müller met Müller in São Paulo, then Müller left (again)!",
    "“Quoted” names: O'Neil & Zoë-Ann, Ærø; 東京 and Kraków.",
    "Jose\u0301 Mu\u0308ller visited Zu\u0308rich e\u0301te\u0301 \u1100\u1161\u11a8 ok",  # decomposed accents, jamo
    "  leading spaces,\ttabs  and   gaps 😀 emoji😀 end  ",
]


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    corpus = ["Müller met Paulo in London .", "the movie is good , then it left"] * 5
    return TextEncoder(train_tokenizer(corpus, TokenizerConfig(vocab_size=120, min_frequency=1)), max_length=512)


def _every_other_entity(n: int) -> list[str]:
    """B-PER on even words, then I-PER on the word after every fourth: single and two-word entities."""
    tags = []
    for i in range(n):
        tags.append("B-PER" if i % 2 == 0 else ("I-PER" if i % 4 == 1 else "O"))
    return tags


@pytest.mark.parametrize("text", TEXTS)
def test_words_and_entities_slice_the_text(encoder, text):
    enc = encoder.encode_text(text)
    tags = _every_other_entity(len(enc.words))
    pred = Prediction(enc.words, enc.spans, tags={"ner": tags}, labels={"sentiment": "positive"})
    pred.probs = {"sentiment": {"negative": 0.25, "positive": 0.75}}
    out = prediction_dict(pred, text, list(KINDS), KINDS)["ner"]
    assert out["tags"] == tags and len(out["words"]) == len(out["offsets"]) == len(tags)
    for word, (start, end) in zip(out["words"], out["offsets"], strict=True):
        assert text[start:end] == word and word == word.strip() and word
    assert out["entities"], "the hand-made tags hold entities"
    for entity in out["entities"]:
        assert text[entity["start"] : entity["end"]] == entity["text"]
    covered = "".join(text[s:e] for s, e in out["offsets"])
    assert covered == "".join(text.split()), "every non-space character belongs to exactly one word"


def test_repeated_words_get_their_own_offsets():
    text = "Müller met Müller in São Paulo, then Müller left"
    words = ["Müller", "met", "Müller", "in", "São", "Paulo", ",", "then", "Müller", "left"]
    spans, pos = [], 0
    for word in words:
        pos = text.index(word, pos)
        spans.append((pos, pos + len(word)))
        pos += len(word)
    tags = ["B-PER", "O", "B-PER", "O", "B-LOC", "I-LOC", "O", "O", "B-PER", "O"]
    found = entity_dicts(tags, words, spans, text)
    assert found == [
        {"type": "PER", "start": 0, "end": 6, "text": "Müller"},
        {"type": "PER", "start": 11, "end": 17, "text": "Müller"},
        {"type": "LOC", "start": 21, "end": 30, "text": "São Paulo"},
        {"type": "PER", "start": 37, "end": 43, "text": "Müller"},
    ]


def test_token_input_entities_are_token_indices():
    tokens = ["EU", "rejects", "German", "call", "by", "New", "York", "Times"]
    tags = ["B-ORG", "O", "B-MISC", "O", "O", "B-ORG", "I-ORG", "I-ORG"]
    assert entity_dicts(tags, tokens, None, None) == [
        {"type": "ORG", "start": 0, "end": 1, "text": "EU"},
        {"type": "MISC", "start": 2, "end": 3, "text": "German"},
        {"type": "ORG", "start": 5, "end": 8, "text": "New York Times"},
    ]
    pred = Prediction(tokens, None, tags={"ner": tags})
    out = prediction_dict(pred, tokens, ["ner"], KINDS)["ner"]
    assert "words" not in out and "offsets" not in out and out["tags"] == tags


def test_word_spans_take_back_characters_the_normalizer_merged():
    text = "x e\u0301 \u1100\u1161\u11a8, y"
    # what the tokenizer reports after NFC: each merged character ends where its first part ends
    assert word_spans(text, [(0, 1), (2, 3), (5, 6), (8, 9), (10, 11)]) == [(0, 1), (2, 4), (5, 8), (8, 9), (10, 11)]


def test_stray_inside_tag_starts_an_entity_and_classification_is_reported():
    pred = Prediction(["a", "b"], [(0, 1), (2, 3)], tags={"ner": ["I-LOC", "I-LOC"]}, truncated=True)
    pred.labels, pred.probs = {"sentiment": "negative"}, {"sentiment": {"negative": 0.6, "positive": 0.4}}
    out = prediction_dict(pred, "a b", list(KINDS), KINDS)
    assert out["ner"]["entities"] == [{"type": "LOC", "start": 0, "end": 3, "text": "a b"}]
    assert out["sentiment"] == {"label": "negative", "probs": {"negative": 0.6, "positive": 0.4}, "truncated": True}
