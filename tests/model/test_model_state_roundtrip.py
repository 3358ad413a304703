"""Weights survive a safetensors round trip bit for bit.

There is no save/load module yet: this covers model.state_dict() <-> model.safetensors only.
tests/test_pretrained.py will cover the full run-directory round trip (config, tokenizer, labels).
"""

import pytest
import torch
from model_testkit import FFN_VARIANTS, perturb, tiny_batch, tiny_model
from safetensors.torch import load_file, save_file


@pytest.mark.parametrize("decoder", ["softmax", "crf"])
@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_safetensors_round_trip_gives_identical_logits(tmp_path, ffn, decoder):
    overrides = dict(ffn=ffn, tagging_decoder=decoder, char_embedding=8, word_features=True)
    model = perturb(tiny_model(seed=1, **overrides), seed=2).eval()
    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))

    fresh = tiny_model(seed=99, **overrides).eval()  # a different init: loading must overwrite everything
    state = load_file(str(path))
    assert set(state) == set(fresh.state_dict())
    missing, unexpected = fresh.load_state_dict(state, strict=True)
    assert not missing and not unexpected

    batch = tiny_batch([6, 3, 5], seed=3)
    gen = torch.Generator().manual_seed(4)
    U = int(batch["word_index"].max()) + 1  # the words of row 0 stand for every row's words
    features = dict(
        word_read=batch["word_read"],
        token_word=batch["word_index"],
        char_ids=torch.randint(1, 128, (U, 5), generator=gen),
        shape_ids=torch.randint(1, 5, (U,), generator=gen),
    )
    with torch.no_grad():
        a = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], **features)
        b = fresh(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], **features)
    assert a.logits.keys() == b.logits.keys() == {"ner", "sent"}
    for name in a.logits:
        assert torch.equal(a.logits[name], b.logits[name])
    assert torch.equal(a.loss, b.loss)
    ner_rows = a.examples["ner"]
    assert model.decode_tags("ner", a.logits["ner"], batch["word_read"][ner_rows]) == fresh.decode_tags(
        "ner", b.logits["ner"], batch["word_read"][ner_rows]
    )
