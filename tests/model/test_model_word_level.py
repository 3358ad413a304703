"""Gathering each word's read position into word order, and word-level decoding, with truncated and empty rows."""

import pytest
import torch
from model_testkit import NER_LABELS, tiny_model

from mtl_decoder.config import TAGGING
from mtl_decoder.model import TaskHeadSpec, word_level

WORD_INDEX = torch.tensor(
    [
        [-1, 0, 0, 1, 2, 2, 2, -1],  # specials around three words
        [-1, 0, 0, 1, 1, 1, 1, 1],  # truncated inside word 1: words 2.. are absent
        [0, 1, 2, 3, -1, -1, -1, -1],  # no special tokens, right padding
        [-1, -1, -1, -1, -1, -1, -1, -1],  # no words at all
    ]
)
FIRST_COLS = [[1, 3, 4], [1], [0, 1, 2, 3], []]
"""Each row's read positions: its words' first sub-words (row 1: word 1 is cut part way, so only word 0 is whole)."""
WORD_READ = torch.tensor([[*cols, *[-1] * (4 - len(cols))] for cols in FIRST_COLS])


def test_word_level_gathers_first_sub_words():
    n, T, L = WORD_INDEX.shape[0], WORD_INDEX.shape[1], 3
    logits = torch.arange(n * T * L, dtype=torch.float32).view(n, T, L)
    labels = torch.full((n, T), -100)
    for i, cols in enumerate(FIRST_COLS):
        for j, c in enumerate(cols):
            labels[i, c] = (i + j) % L
    emissions, tags, mask = word_level(logits, WORD_READ, labels)
    W = 4
    assert emissions.shape == (n, W, L) and tags.shape == (n, W) and mask.shape == (n, W)
    assert mask.tolist() == [[j < len(cols) for j in range(W)] for cols in FIRST_COLS]
    for i, cols in enumerate(FIRST_COLS):
        for j in range(W):
            if j < len(cols):
                assert torch.equal(emissions[i, j], logits[i, cols[j]])
                assert tags[i, j] == (i + j) % L
            else:  # absent word (truncated or past the end): zero emission, no tag
                assert torch.count_nonzero(emissions[i, j]) == 0
                assert tags[i, j] == -100
    _, tags_without_labels, mask_again = word_level(logits, WORD_READ)
    assert (tags_without_labels == -100).all()
    assert torch.equal(mask_again, mask)


def test_word_level_gradient_flows_only_to_first_sub_words():
    logits = torch.randn(4, 8, 3, requires_grad=True)
    emissions, _, mask = word_level(logits, WORD_READ)
    (emissions * mask.unsqueeze(-1)).sum().backward()
    touched = (logits.grad != 0).any(-1)
    expected = torch.zeros(4, 8, dtype=torch.bool)
    for i, cols in enumerate(FIRST_COLS):
        expected[i, cols] = True
    assert torch.equal(touched, expected)


@pytest.mark.parametrize("decoder", ["softmax", "crf"])
def test_decode_tags_one_tag_per_present_word(decoder):
    # Regression (crf): a row without words used to decode to one tag.
    spec = TaskHeadSpec("ner", TAGGING, NER_LABELS)
    model = tiny_model(specs=[spec], tagging_decoder=decoder).eval()
    logits = torch.randn(4, 8, len(NER_LABELS), generator=torch.Generator().manual_seed(0))
    paths = model.decode_tags("ner", logits, WORD_READ)
    assert [len(p) for p in paths] == [len(c) for c in FIRST_COLS]
    if decoder == "softmax":
        assert paths == [logits[i, cols].argmax(-1).tolist() for i, cols in enumerate(FIRST_COLS)]


def test_word_features_put_each_distinct_words_vector_on_its_sub_words():
    """A word's features do not depend on where or how often it occurs, or on the rest of the batch; special
    tokens and padding get none."""
    from model_testkit import perturb

    from mtl_decoder.data.batching import Collator, EncodedExample

    model = perturb(tiny_model(char_embedding=8, word_features=True, word_hash_buckets=64), seed=3).eval()
    a = EncodedExample([2, 5, 6, 7, 3], [-1, 0, 0, 1, -1], ["Paris", "in"])
    b = EncodedExample([2, 8, 9, 3], [-1, 0, 1, -1], ["in", "Paris"])
    collate = Collator(0, {}, word_features=True, hash_buckets=64)
    batch = collate([a, b])
    keys = ("token_word", "char_ids", "shape_ids", "hash_ids")
    with torch.no_grad():
        x = model.word_features(*(batch[k] for k in keys))  # (2, 5, C)
        alone = model.word_features(*(collate([b])[k] for k in keys))  # (1, 4, C)
    assert x.shape == (2, 5, model.cfg.d_model)
    assert torch.equal(x[0, 1], x[0, 2]) and torch.equal(x[0, 1], x[1, 2])  # 'Paris': both sub-words, both rows
    assert torch.equal(x[0, 3], x[1, 1]) and not torch.equal(x[0, 1], x[0, 3])  # 'in' differs from 'Paris'
    assert torch.count_nonzero(x[0, [0, 4]]) == 0 and torch.count_nonzero(x[1, 3:]) == 0  # specials, padding
    torch.testing.assert_close(x[1, :4], alone[0])


def test_word_features_backward_is_deterministic():
    """The same batch gives bit-identical gradients every time (an index-based gather would accumulate its
    repeated rows in a thread-dependent order on CPU at this size)."""
    from model_testkit import tiny_config

    from mtl_decoder.model.decoder import WordFeatures

    torch.manual_seed(0)
    features = WordFeatures(tiny_config(char_embedding=8, word_features=True, word_hash_buckets=64))
    U, B, T = 200, 32, 40
    inputs = (
        torch.randint(-1, U, (B, T)),  # token_word: many repeats of each word, and sub-words of no word
        torch.randint(0, 128, (U, 16)),
        torch.randint(0, 5, (U,)),
        torch.randint(1, 64, (U, 8)),
    )
    upstream = torch.randn(B, T, 32)
    grads, threads = [], torch.get_num_threads()
    torch.set_num_threads(2)  # the session runs on one thread (conftest); a race needs two
    try:
        for _ in range(30):  # the race shows in some passes of an index-based gather, not in every one
            features.zero_grad()
            (features(*inputs) * upstream).sum().backward()
            grads.append([p.grad.clone() for p in features.parameters()])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for other in grads[1:] for a, b in zip(grads[0], other, strict=True))


def test_last_word_token_reads_and_labels_each_words_last_sub_word():
    """model.word_token=last: a word's tag sits on, and is read from, its last sub-word (causal trunks: the only
    one that has seen the whole word); 'auto' picks it under causal attention."""
    from mtl_decoder.config import ModelConfig
    from mtl_decoder.data.alignment import WordAlignment

    word_index = [-1, 0, 0, 1, 2, 2, 2, -1]
    logits = torch.arange(8.0).view(1, 8, 1).expand(1, 8, 2).clone()
    first_al, last_al = (WordAlignment.from_word_index(word_index, p) for p in ("first", "last"))
    first, _, _ = word_level(logits, torch.tensor([first_al.reads]))
    last, _, mask = word_level(logits, torch.tensor([last_al.reads]))
    assert first[0, :, 0].tolist() == [1.0, 3.0, 4.0] and last[0, :, 0].tolist() == [2.0, 3.0, 6.0]
    assert mask.all()
    assert last_al.labels([7, 8, 9]) == [-100, -100, 7, 8, -100, -100, 9, -100]
    assert first_al.labels([7, 8, 9]) == [-100, 7, -100, 8, 9, -100, -100, -100]
    assert ModelConfig(word_token="auto", attention="causal").word_token_position == "last"
    assert ModelConfig(word_token="auto", attention="bidirectional").word_token_position == "first"


def test_word_hash_dropout_blanks_only_the_word_itself_for_about_that_fraction_of_words():
    """model.word_hash_dropout: in training each distinct word keeps all its hashed features, or loses exactly the
    two naming the word (its affixes kept), at about the rate asked; in eval nothing is dropped."""
    from model_testkit import tiny_config

    from mtl_decoder.data.wordfeatures import hashed_features
    from mtl_decoder.model.decoder import WordFeatures

    words = [f"Word{i}x" for i in range(2000)]
    full = torch.tensor([hashed_features(w, 64) for w in words])  # (U, 8)
    blanked = full.clone()
    blanked[:, :2] = 0  # the word as written and lower-cased: what an unseen word would not have
    token_word = torch.arange(len(words)).view(1, -1)
    torch.manual_seed(0)
    features = WordFeatures(tiny_config(word_hash_buckets=64, word_hash_dropout=0.3))
    with torch.no_grad():
        features.eval()
        keep, drop = features(token_word, hash_ids=full)[0], features(token_word, hash_ids=blanked)[0]  # (U, C)
        assert not torch.allclose(keep, drop)
        assert torch.equal(features(token_word, hash_ids=full)[0], keep)  # eval: never dropped
        features.train()
        out = features(token_word, hash_ids=full)[0]
    as_kept = torch.isclose(out, keep, rtol=0, atol=1e-6).all(-1)
    as_dropped = torch.isclose(out, drop, rtol=0, atol=1e-6).all(-1)
    assert bool((as_kept ^ as_dropped).all())  # each word one or the other, never a part of its features
    n = len(words)
    assert abs(int(as_dropped.sum()) - 0.3 * n) < 4 * (n * 0.3 * 0.7) ** 0.5  # binomial, 4 standard deviations


@pytest.mark.parametrize("settings", [dict(word_hash_dropout=0.2), dict(word_hash_buckets=64, word_hash_dropout=1.0)])
def test_word_hash_dropout_errors_name_the_key(settings):
    from mtl_decoder.config import ModelConfig
    from mtl_decoder.errors import ConfigError

    with pytest.raises(ConfigError, match="word_hash_dropout"):
        ModelConfig(d_model=32, n_layers=2, n_heads=2, expert_hidden=16, **settings)
