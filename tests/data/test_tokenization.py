"""Tokenizer: word labels on first sub-words, truncation counted, save/load round trip, raw-text offsets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import normalizers

from mtl_decoder.config import TAGGING, TokenizerConfig
from mtl_decoder.data.batching import encode_example
from mtl_decoder.data.tasks import Example
from mtl_decoder.data.tokenization import TextEncoder, train_tokenizer
from mtl_decoder.errors import UserError

FIXTURES = Path(__file__).parents[1] / "fixtures"
SENTENCES = [json.loads(line)["tokens"] for line in (FIXTURES / "ner_train.jsonl").read_text().splitlines()]
WORDS = ["Netanyahu", "visited", "Xqzvwk-Blorft", "in", "1996", "."]  # long / unseen words split into pieces


@pytest.fixture(scope="module", params=["wordpiece", "bpe"])
def encoder(request) -> TextEncoder:
    tok = train_tokenizer(SENTENCES, TokenizerConfig(kind=request.param, vocab_size=300, min_frequency=1))
    return TextEncoder(tok, 64)


def first_subwords(word_index: list[int]) -> list[int]:
    return [i for i, w in enumerate(word_index) if w >= 0 and (i == 0 or word_index[i - 1] != w)]


def test_labels_sit_on_the_first_subword_only(encoder):
    enc = encoder.encode_words(WORDS)
    assert len(enc.ids) == len(enc.word_index) and enc.word_index[0] == enc.word_index[-1] == -1
    assert len(enc.ids) > len(WORDS) + 2  # some words really are several sub-words
    inner = enc.word_index[1:-1]
    assert inner == sorted(inner) and sorted(set(inner)) == list(range(len(WORDS)))
    tags = [10 + i for i in range(len(WORDS))]
    labels = enc.alignment.labels(tags)
    assert len(labels) == len(enc.ids)
    firsts = first_subwords(enc.word_index)
    assert [labels[i] for i in firsts] == tags
    assert all(lab == -100 for i, lab in enumerate(labels) if i not in firsts)
    assert not enc.truncated and enc.kept_words == len(WORDS)


def test_truncation_keeps_a_prefix_and_counts_cut_words(encoder):
    words = WORDS * 6
    full = TextEncoder(encoder.tokenizer, 512).encode_words(words)
    short = TextEncoder(encoder.tokenizer, 12).encode_words(words)
    assert len(short.ids) == 12 and short.truncated
    # the truncated encoding is the full one cut after 10 sub-words, then closed with [SEP]
    assert short.ids[:-1] == full.ids[:11] and short.ids[-1] == full.ids[-1]
    assert short.word_index[:-1] == full.word_index[:11] and short.word_index[-1] == -1
    # kept: the words all of whose sub-words are among the 10 kept (a word cut part way is not tagged)
    whole = [w for w in range(len(words)) if w in full.word_index[1:11] and w not in full.word_index[11:]]
    assert short.kept_words == len(whole) < len(words) and whole == list(range(short.kept_words))
    labels = short.alignment.labels(list(range(len(words))))
    assert [lab for lab in labels if lab != -100] == list(range(short.kept_words))
    assert all(labels[p] == -100 for p, w in enumerate(short.word_index) if w >= short.kept_words)

    ex = Example(words, None, {"ner": ["O"] * len(words)})
    encoded = encode_example(ex, TextEncoder(encoder.tokenizer, 12), {"ner": {"O": 0}}, {"ner": TAGGING})
    assert encoded.truncated_words == len(words) - short.kept_words
    assert sum(lab != -100 for lab in encoded.labels["ner"]) == short.kept_words


def test_save_load_round_trip(encoder, tmp_path):
    encoder.save(tmp_path)
    loaded = TextEncoder.load(tmp_path, encoder.max_length)
    text = "Prime Minister Benjamin Netanyahu said on Tuesday , in Jerusalem."
    for a, b in ((encoder.encode_words(WORDS), loaded.encode_words(WORDS)),
                 (encoder.encode_text(text), loaded.encode_text(text))):  # fmt: skip
        assert a.ids == b.ids and a.word_index == b.word_index and a.words == b.words and a.spans == b.spans
    assert (loaded.pad_id, loaded.unk_id, loaded.vocab_size) == (encoder.pad_id, encoder.unk_id, encoder.vocab_size)


def test_load_from_a_folder_without_tokenizer(tmp_path):
    with pytest.raises(UserError, match=r"tokenizer\.json"):
        TextEncoder.load(tmp_path, 16)


def test_raw_text_offsets_slice_back_to_words(encoder):
    text = "  Peter Blackburn's  café,in BRUSSELS (1996)!  "
    enc = encoder.encode_text(text)
    assert enc.spans is not None and len(enc.spans) == len(enc.words) == enc.kept_words
    assert [text[s:e] for s, e in enc.spans] == enc.words
    assert all(w and not any(c.isspace() for c in w) for w in enc.words)
    assert enc.words[:2] == ["Peter", "Blackburn"] and "café" in enc.words and "BRUSSELS" in enc.words
    assert all(a[1] <= b[0] for a, b in zip(enc.spans, enc.spans[1:], strict=False))
    assert set(enc.word_index) - {-1} == set(range(len(enc.words)))


def test_trained_tokenizer_is_cased():
    tok = train_tokenizer(SENTENCES, TokenizerConfig(vocab_size=300, min_frequency=1))
    enc = TextEncoder(tok, 32)
    assert enc.encode_words(["The"]).ids != enc.encode_words(["the"]).ids
    lower = TextEncoder(train_tokenizer(SENTENCES, TokenizerConfig(vocab_size=300, lowercase=True)), 32)
    assert lower.encode_words(["The"]).ids == lower.encode_words(["the"]).ids


def test_a_word_the_normalizer_erases_becomes_unk():
    tok = train_tokenizer(SENTENCES, TokenizerConfig(vocab_size=300, min_frequency=1))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, strip_accents=False, lowercase=False)
    enc = TextEncoder(tok, 32)
    out = enc.encode_words(["a", "\x00", "b"])  # clean_text removes the control character entirely
    assert out.word_index == [-1, 0, 1, 2, -1] and out.ids[2] == enc.unk_id and out.kept_words == 3


def test_bpe_training_is_deterministic():
    # (WordPiece training in `tokenizers` is not: its '##' pieces break merge ties in hash order; see config.py)
    cfg = TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1)
    first, second = train_tokenizer(SENTENCES, cfg), train_tokenizer(SENTENCES, cfg)
    assert first.get_vocab() == second.get_vocab()
    assert first.encode(WORDS, is_pretokenized=True).ids == second.encode(WORDS, is_pretokenized=True).ids


def test_encode_batch_equals_one_at_a_time(encoder):
    long_words = ["Xqzvwk-Blorft"] * 40  # truncated at max_length 64
    items = [WORDS, "Café au lait in Zürich, twice: Zürich!", long_words, "naïve résumé", ["a", "Ünïcödé", "."]]
    assert encoder.encode_batch(items) == [
        encoder.encode_text(x) if isinstance(x, str) else encoder.encode_words(x) for x in items
    ]
    assert encoder.encode_batch([]) == []
