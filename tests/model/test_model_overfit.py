"""One tiny model per head kind learns a few examples by heart, and decodes them back."""

import pytest
import torch
from model_testkit import NER_LABELS, SENT_LABELS, gold_word_tags, tiny_batch, tiny_model

from mtl_decoder.config import CLASSIFICATION, TAGGING
from mtl_decoder.model import TaskHeadSpec

TARGET, MAX_STEPS = 0.05, 300


def fit(model, batch, labels):
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    first = None
    for _step in range(MAX_STEPS):
        out = model(batch["input_ids"], batch["attention_mask"], labels=labels, word_read=batch["word_read"])
        first = out.loss.item() if first is None else first
        if out.loss.item() < TARGET:
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    model.eval()
    return first, out.loss.item()


@pytest.mark.parametrize(
    ("decoder", "ffn", "attention"),
    [("softmax", "ple", "bidirectional"), ("crf", "cgc", "bidirectional"), ("softmax", "mlp", "causal")],
)
def test_tagging_overfits_and_decodes_gold(decoder, ffn, attention):
    spec = TaskHeadSpec("ner", TAGGING, NER_LABELS)
    model = tiny_model(specs=[spec], tagging_decoder=decoder, ffn=ffn, attention=attention, seed=1)
    batch = tiny_batch([9, 5, 10, 4, 8, 7, 10, 6], seed=2)
    labels = {"ner": batch["labels"]["ner"]}
    first, last = fit(model, batch, labels)
    assert last < TARGET < first
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"], tasks=["ner"])
    rows = out.examples["ner"]
    decoded = model.decode_tags("ner", out.logits["ner"], batch["word_read"][rows])
    assert decoded == gold_word_tags(labels["ner"][rows], batch["word_index"][rows])


@pytest.mark.parametrize(("ffn", "attention"), [("ple", "causal"), ("mmoe", "bidirectional")])
def test_classification_overfits(ffn, attention):
    spec = TaskHeadSpec("sent", CLASSIFICATION, SENT_LABELS)
    model = tiny_model(specs=[spec], ffn=ffn, attention=attention, seed=3)
    batch = tiny_batch([7, 5, 6, 4, 6, 3, 9, 8], seed=4)
    labels = {"sent": batch["labels"]["sent"]}
    assert len(set(labels["sent"].tolist())) > 1
    first, last = fit(model, batch, labels)
    assert last < TARGET < first
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"])
    assert out.logits["sent"].shape == (8, len(SENT_LABELS))
    assert torch.equal(out.logits["sent"].argmax(-1), labels["sent"][out.examples["sent"]])
