"""Each task's loss is averaged per labelled example (PLE, Eq. 9): a long sentence counts as much as a short one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from model_testkit import perturb, tiny_batch, tiny_model


def test_softmax_tagging_loss_is_the_mean_of_per_sentence_means():
    model = perturb(tiny_model(ffn="ple", tagging_decoder="softmax")).eval()
    batch = tiny_batch([9, 3, 6], seed=2)
    labels = batch["labels"]["ner"].clone()
    labels[2] = -100  # the third sentence carries no tag: it must not count at all
    batch["labels"] = {"ner": labels}
    out = model(**batch)
    logits = out.logits["ner"]
    per_sentence = []
    for i in (0, 1):
        keep = labels[i] != -100
        per_sentence.append(F.cross_entropy(logits[i][keep].float(), labels[i][keep]))
    expected = torch.stack(per_sentence).mean()
    torch.testing.assert_close(out.losses["ner"], expected)
    # and it differs from the mean over all labelled tokens, which weights the long sentence more
    pooled = F.cross_entropy(logits[:2][labels[:2] != -100].float(), labels[:2][labels[:2] != -100])
    assert not torch.allclose(out.losses["ner"], pooled)
