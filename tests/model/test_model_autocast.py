"""bf16 autocast on CPU: a forward close to fp32, finite, and a working backward."""

import pytest
import torch
from model_testkit import FFN_VARIANTS, perturb, tiny_batch, tiny_model


@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_bf16_autocast_forward_and_backward(ffn):
    model = perturb(tiny_model(ffn=ffn, seed=4, tagging_decoder="crf"), seed=5, std=0.05).eval()
    batch = tiny_batch([7, 5, 6], seed=6)
    args = (batch["input_ids"], batch["attention_mask"])
    kwargs = dict(labels=batch["labels"], word_read=batch["word_read"])
    with torch.no_grad():
        ref = model(*args, **kwargs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(*args, **kwargs)
    for name, logits in out.logits.items():
        assert torch.isfinite(logits).all()
        scale = ref.logits[name].abs().max().item()
        err = (logits.float() - ref.logits[name]).abs().max().item()
        assert err <= 0.05 * scale + 0.02, f"{name}: bf16 logits off by {err} (scale {scale})"
    for gates in out.gates:  # gates are always computed in float32
        assert all(w.dtype == torch.float32 for w in gates.values())
    assert torch.isfinite(out.loss)
    assert abs(out.loss.item() - ref.loss.item()) <= 0.05 * abs(ref.loss.item()) + 0.02
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert all(g.dtype == torch.float32 for g in grads)  # master weights stay fp32
    assert sum(g.abs().sum().item() for g in grads) > 0
