"""One word alignment (data/alignment.py): every word's tag is read from a real, non-whitespace piece of that word that
reached the model, for every input length from 1 to 300 words, byte-level BPE and SentencePiece-style tokenizers,
word lists encoded word by word (native) and joined as text (pretrained trunks); windows never overflow; a head that
never predicts 'O' gives no word 'O' past max_length."""

from __future__ import annotations

import pytest
import torch
from alignment_testkit import TOKENIZERS, brute_reads, words_of_length

from mtl_decoder.config import TAGGING, ModelConfig
from mtl_decoder.data.alignment import is_blank
from mtl_decoder.data.batching import Collator, EncodedExample
from mtl_decoder.data.tokenization import TextEncoder
from mtl_decoder.inference.predictor import Predictor, _Piece
from mtl_decoder.model import MTLDecoder, TaskHeadSpec, word_level
from mtl_decoder.model.trunks.native import NativeTrunk

MAX_LENGTH = 40
LABELS = ("O", "B-X", "I-X")


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request):
    build, lead = TOKENIZERS[request.param]
    return build(), lead, request.param


def tiny_model(vocab: int, attention: str = "bidirectional", word_token: str = "auto") -> MTLDecoder:
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=16, n_layers=1, n_heads=2, expert_hidden=8, dropout=0.0, attention=attention, word_token=word_token
    )
    return NativeTrunk(cfg).bind(MTLDecoder(cfg, [TaskHeadSpec("ner", TAGGING, LABELS)], vocab_size=vocab)).eval()


def test_blank_pieces_are_whitespace_only():
    assert is_blank("Ġ") and is_blank("▁") and is_blank("ĠĠ") and is_blank("Ċ") and is_blank(" ")
    assert not any(is_blank(p) for p in ("Ġ1", "▁The", "1", "##s", "Ã©", "."))


@pytest.mark.parametrize("as_text", [False, True], ids=["native", "words_as_text"])
@pytest.mark.parametrize("word_token", ["first", "last"])
def test_every_word_is_read_at_a_real_piece_that_reached_the_model(tokenizer, as_text, word_token):
    tok, lead, name = tokenizer
    encoder = TextEncoder(tok, MAX_LENGTH, words_as_text=as_text, word_token=word_token)
    model = tiny_model(tok.get_vocab_size(), word_token=word_token)
    predictor = Predictor(model, encoder, {"ner": list(LABELS)}, workers=1)
    collate = Collator(encoder.pad_id, {})
    blank_seen = windowed = 0
    for n in range(1, 301):
        words = words_of_length(n)
        enc = encoder.encode_words(words)
        expected, blanks = brute_reads(tok, words, as_text, word_token, MAX_LENGTH, lead)
        blank_seen += blanks
        # the whole input's own encoding: the words that fit whole are kept, each read where the brute force says
        kept = [k for k, r in enumerate(expected) if r is not None]
        assert kept == list(range(len(kept))), "the words that fit are a prefix"
        assert enc.alignment.reads == expected[: len(kept)] and enc.kept_words == len(kept)
        assert enc.truncated == (len(kept) < n)
        # what predict runs: the input whole, or windows; each word read (by the heads) in some window it reached
        pieces = predictor._windows(0, enc) if enc.truncated else [_Piece(0, 0, n, enc)]
        windowed += len(pieces) > 1
        batch = collate([EncodedExample.unlabelled(p.encoded) for p in pieces])
        T = batch["input_ids"].shape[1]
        logits = torch.eye(T).expand(len(pieces), T, T)  # (B, T, T): a word's emission argmax is its read position
        emissions, _, mask = word_level(logits, batch["word_read"])
        tagged = [False] * n
        for row, p in enumerate(pieces):
            assert len(p.encoded.ids) <= MAX_LENGTH, f"{n} words: a window overflows max_length"
            window_words = words[p.start : p.end]
            want, _ = brute_reads(tok, window_words, as_text, word_token, MAX_LENGTH, lead)
            assert all(r is not None for r in want), f"{n} words: window {p.start}:{p.end} does not fit whole"
            got = emissions[row].argmax(-1)[mask[row]].tolist()
            assert got == want, f"{n} words, window {p.start}:{p.end}"
            for k in range(p.start, p.end):
                tagged[k] = True
        assert all(tagged), f"{n} words: words {[k for k, t in enumerate(tagged) if not t]} reached no window"
    assert windowed > 200  # most lengths do not fit in one pass
    if as_text or name == "metaspace":  # (byte-level words encoded one by one carry no space)
        assert blank_seen > 0, "the test's words give whitespace-only pieces"


@pytest.mark.parametrize("as_text", [False, True], ids=["native", "words_as_text"])
@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_a_head_that_never_says_O_leaves_no_word_O_past_max_length(tokenizer, as_text, attention):
    """End to end through Predictor.predict: inputs longer than max_length (word lists and raw text) come back with
    every word tagged. Before the alignment, windows sized by word-by-word counts overflowed when joined as text,
    and the last word of a window kept the default 'O'."""
    tok, _, _ = tokenizer
    model = tiny_model(tok.get_vocab_size(), attention)
    with torch.no_grad():
        model.heads["ner"].weight.zero_()
        model.heads["ner"].bias.copy_(torch.tensor([-1e4, 1.0, 0.5]))  # 'O' never wins
    position = model.cfg.word_token_position
    encoder = TextEncoder(tok, 24, words_as_text=as_text, word_token=position)
    predictor = Predictor(model, encoder, {"ner": list(LABELS)}, batch_size=8, workers=1)
    items = [words_of_length(n) for n in range(20, 90, 3)]
    items += [" ".join(w) for w in items[:5]]
    preds = list(predictor.predict(items))
    assert len(preds) == len(items)
    for pred in preds:
        assert pred.windows > 1 and pred.untagged == 0
        assert "O" not in pred.tags["ner"], f"{len(pred.words)} words: {pred.tags['ner'].index('O')} is 'O'"


def test_a_word_longer_than_max_length_is_counted_untagged(tokenizer):
    tok, _, _ = tokenizer
    model = tiny_model(tok.get_vocab_size())
    with torch.no_grad():
        model.heads["ner"].weight.zero_()
        model.heads["ner"].bias.copy_(torch.tensor([-1e4, 1.0, 0.5]))
    encoder = TextEncoder(tok, 12, words_as_text=True)  # reads the first sub-word, as the bidirectional model does
    long_word = "1234567890" * 3  # digits split one by one: 30 pieces
    words = ["The", "cats", long_word, "sat", "on", "Paris"]
    pred = next(Predictor(model, encoder, {"ner": list(LABELS)}, workers=1).predict([words]))
    assert pred.untagged == 1
    assert [t == "O" for t in pred.tags["ner"]] == [w == long_word for w in words]


def test_a_predictor_refuses_an_encoder_that_reads_elsewhere_than_the_model(tokenizer):
    tok, _, _ = tokenizer
    model = tiny_model(tok.get_vocab_size(), attention="causal")  # auto: the last sub-word
    with pytest.raises(ValueError, match="for_model"):
        Predictor(model, TextEncoder(tok, 16, word_token="first"), {"ner": list(LABELS)})
    Predictor(model, TextEncoder.for_model(tok, model.cfg, 16), {"ner": list(LABELS)})


def test_debug_data_counts_whitespace_led_words_and_cut_words(tokenizer):
    """length_stats (debug-data) reads the alignment: words led by a lone space piece, and words max_length cuts,
    both equal to the brute force from the tokenizer's offsets."""
    from mtl_decoder.data.tasks import Example
    from mtl_decoder.diagnostics.data import length_stats

    tok, lead, _ = tokenizer
    sentences = [words_of_length(n) for n in (3, 10, 30, 60)]
    unlimited = TextEncoder(tok, 1 << 30, words_as_text=True)
    stats = length_stats([Example(w, None, {}) for w in sentences], unlimited, MAX_LENGTH)
    led = cut = 0
    for words in sentences:
        _, blanks = brute_reads(tok, words, True, "first", 1 << 30, lead)
        led += blanks
        cut += sum(r is None for r in brute_reads(tok, words, True, "first", MAX_LENGTH, lead)[0])
    assert stats["whitespace_led_words"] == led > 0
    assert stats["words_cut"] == cut > 0


def test_predict_file_reports_words_too_long_to_tag(tmp_path, capsys):
    """Through the CLI: a word that alone exceeds data.max_length is counted in the record ("untagged") and in the
    summary, with a warning; the other words of the record are tagged as usual."""
    import json

    from stream_testkit import saved_model

    from mtl_decoder.cli import main

    folder = saved_model(tmp_path, ["data.max_length=8"])
    long_word = "Xqzvwkblorftzzqqxxjjvvkk"  # unseen: many more than 6 sub-words
    records = [
        {"tokens": ["Peter", "went", long_word, "to", "Paris", "again", "and", "again", "today"]},
        {"tokens": ["Hi"]},
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert main(["predict", "--model", str(folder), "--input", str(src), "--output", str(out), "--tasks", "ner"]) == 0
    first, second = (json.loads(line)["predictions"]["ner"] for line in out.read_text(encoding="utf-8").splitlines())
    assert first["untagged"] == 1 and first["tags"][2] == "O" and first["windows"] > 1
    assert "untagged" not in second
    said = capsys.readouterr()
    assert "warning: 1 words were longer than the model's maximum length on their own" in said.out + said.err


def test_word_token_defaults_to_auto_and_old_folders_keep_first(tmp_path):
    """A new causal model reads each word's last sub-word (auto); a folder saved before the key existed (its
    config.yaml without model.word_token) was trained on first sub-words and still reads them."""
    import yaml
    from stream_testkit import saved_model

    from mtl_decoder.saved import load_model

    folder = saved_model(tmp_path, [])  # causal, word_token not set
    fresh = load_model(folder)
    assert fresh.config.model.word_token == "auto" and fresh.encoder.word_token == "last"
    config = yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8"))
    del config["model"]["word_token"]
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (folder / "manifest.json").unlink()  # folders saved before word_token existed had no manifest either
    old = load_model(folder)
    assert old.config.model.word_token == "first" and old.encoder.word_token == "first"
    assert old.model.cfg.word_token_position == "first"
