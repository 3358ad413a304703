"""predict_texts against the model itself: the same argmax tags and labels as a direct forward pass, long texts
tagged in windows, and inputs consumed as a stream."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from predict_testkit import SENTENCES, texts, write_lines

from mtl_decoder.data.batching import Collator, EncodedExample
from mtl_decoder.errors import UserError
from mtl_decoder.inference import Predictor
from mtl_decoder.prediction import predict_file, predict_texts
from mtl_decoder.saved import load_model


@pytest.fixture(scope="module")
def model(tiny_run):
    return load_model(tiny_run / "best")


@torch.no_grad()
def _direct(model, item) -> tuple[list[str], str, list[float]]:
    """Tags (argmax at each word's first sub-word) and label of one sentence, straight from the model."""
    enc = model.encoder.encode_text(item) if isinstance(item, str) else model.encoder.encode_words(item)
    assert not enc.truncated
    batch = Collator(model.encoder.pad_id, {})([EncodedExample(enc.ids, enc.word_index, enc.words)])
    out = model.model.eval()(**batch)
    ner_logits, first_seen = out.logits["ner"][0], set()
    tags = []
    for position, word in enumerate(enc.word_index):
        if word >= 0 and word not in first_seen:
            first_seen.add(word)
            tags.append(model.label_sets["ner"][int(ner_logits[position].argmax())])
    probs = out.logits["sentiment"][0].float().softmax(-1)
    return tags, model.label_sets["sentiment"][int(probs.argmax())], probs.tolist()


def test_predictions_equal_the_model_run_directly(model):
    items = [*SENTENCES[:3], *texts()[3:], "Peter Blackburn , of London ."]
    for item, pred in zip(items, predict_texts(model, items, batch_size=2), strict=True):
        tags, label, probs = _direct(model, item)
        assert pred["ner"]["tags"] == tags
        assert pred["sentiment"]["label"] == label
        assert list(pred["sentiment"]["probs"].values()) == pytest.approx(probs, abs=1e-5)
        assert pred["sentiment"]["truncated"] is False and pred["ner"]["windows"] == 1


def test_long_text_is_tagged_in_windows_and_classification_marked_truncated(model, tmp_path):
    words = [f"w{i % 7}" if i % 5 else "London" for i in range(150)]  # far past max_length 48
    text = " , ".join(" ".join(words[i : i + 10]) for i in range(0, 150, 10))
    [pred] = predict_texts(model, [text], batch_size=4)
    ner = pred["ner"]
    assert ner["windows"] > 1 and pred["sentiment"]["truncated"] is True
    assert len(ner["tags"]) == len(ner["words"]) == len(model.encoder.encode_text(text).words)
    assert all(text[s:e] == w for w, (s, e) in zip(ner["words"], ner["offsets"], strict=True))
    summary = predict_file(model, write_lines(tmp_path / "long.txt", [text, "short one"]), tmp_path / "o.jsonl")
    assert (summary.truncated, summary.windowed, summary.predicted) == (1, 1, 2)
    assert "warning: 1 records were longer" in summary.report()


def test_inputs_are_consumed_as_a_stream(model):
    pulled = 0

    def endless():
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            yield SENTENCES[i % len(SENTENCES)]

    stream = predict_texts(model, endless(), batch_size=2)
    first = next(stream)
    buffer = 2 * 16  # batch_size x buffer_batches
    assert first["ner"]["tags"] and pulled <= 2 * buffer + 1  # a buffer and one of lookahead, not the whole input
    assert len(list(itertools.islice(stream, 40))) == 40


def test_bad_items_name_their_index(model):
    with pytest.raises(UserError, match="unknown task 'nr'"):
        predict_texts(model, [], tasks="nr")  # checked at the call, before any item is read
    with pytest.raises(UserError, match="item 1: text is empty"):
        list(predict_texts(model, ["fine", "  "]))
    with pytest.raises(UserError, match="item 0: token 1 is int, not a string"):
        list(predict_texts(model, [["a", 3]]))
    with pytest.raises(UserError, match="item 0: must be a text or a list of tokens, got dict"):
        list(predict_texts(model, [{"text": "a"}]))
    [pred] = predict_texts(model, [("EU", "rejects")], tasks=["ner"])
    assert list(pred) == ["ner"] and len(pred["ner"]["tags"]) == 2


def test_bf16_runs_the_model_under_autocast_and_keeps_the_outputs_well_formed(model, tmp_path):
    dtypes = set()
    predictor = Predictor.from_saved(model, batch_size=2, precision="bf16")
    items = [*SENTENCES[:3], *texts()[3:]]
    preds = list(predictor.predict(items, on_batch=lambda out, batch: dtypes.add(out.logits["ner"].dtype)))
    assert dtypes == {torch.bfloat16}  # the heads' matrix products ran in bf16
    assert [p.words for p in preds] == [p.words for p in Predictor.from_saved(model, batch_size=2).predict(items)]
    for pred in predict_texts(model, items, precision="bf16"):
        assert sum(pred["sentiment"]["probs"].values()) == pytest.approx(1.0, abs=1e-5)
        assert set(pred["ner"]["tags"]) <= set(model.label_sets["ner"])
    summary = predict_file(model, write_lines(tmp_path / "in.txt", texts()), tmp_path / "o.jsonl", precision="bf16")
    assert summary.predicted == len(texts()) and "(bf16)" in summary.report()


@pytest.mark.parametrize(("precision", "message"), [("fp16", "for GPUs"), ("half", "one of fp32, bf16, fp16")])
def test_unsupported_precision_is_refused(model, precision, message):
    with pytest.raises(UserError, match=message):
        list(predict_texts(model, texts(), precision=precision))


def test_workers_give_the_same_predictions_in_order_and_leave_the_caller_as_it_was(model):
    long_text = " ".join(f"w{i % 7}" if i % 5 else "London" for i in range(150))  # tagged in windows
    items = [*SENTENCES, *texts(), long_text] * 7  # several buffers of 2 x 2 items
    one = list(Predictor.from_saved(model, batch_size=2, workers=1).predict(items))
    threads_before, calls = torch.get_num_threads(), []

    def on_batch(out, batch) -> None:
        calls.append((threading.get_ident(), len(batch["input_ids"])))

    predictor = Predictor(model.model, model.encoder, model.label_sets, batch_size=2, buffer_batches=2, workers=2)
    runners: set[str] = set()
    hook = model.model.register_forward_pre_hook(lambda module, args: runners.add(threading.current_thread().name))
    model.model.train()
    two = list(predictor.predict(items, on_batch=on_batch))
    hook.remove()
    assert runners and all(name.startswith("predict") for name in runners)  # the forward passes ran in workers
    assert model.model.training  # the caller's mode is restored
    model.model.eval()
    assert {thread for thread, _ in calls} == {threading.get_ident()}  # on_batch runs in the calling thread
    assert sum(size for _, size in calls) >= len(items)  # for every batch (long_text is several pieces)
    assert torch.get_num_threads() == threads_before
    assert [p.tags for p in two] == [p.tags for p in one] and [p.labels for p in two] == [p.labels for p in one]
    for a, b in zip(one, two, strict=True):
        assert a.probs["sentiment"] == pytest.approx(b.probs["sentiment"], abs=1e-5)
    with pytest.raises(UserError, match="workers must be at least 1"):
        Predictor.from_saved(model, workers=0)
