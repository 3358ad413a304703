"""bf16 autocast on CPU: a forward and a backward close to fp32's, finite, with float32 gates and gradients.

The tolerances are a few times the error measured on this code, not a generous guess. Measured with the loop of
this test (the tiny model perturbed by N(0, 0.05), CRF tagging decoder, batch lengths [7, 5, 6]) over 8 seeds
(model seed 4 + 10 s, perturbation 5 + 10 s, batch 6 + 10 s, s = 0..7) x the 6 ffn variants, torch 2.13 on an
Intel Xeon (AVX-512), the largest error seen was:
- logits: max |bf16 - fp32| / max |fp32| = 9.7e-3 (mlp, ner; 6-8e-3 for the gated variants);
- loss (about 6.2-6.7): |bf16 - fp32| = 5.6e-3 absolute, 8.1e-4 relative (cgc);
- all gradients as one vector: ||bf16 - fp32|| / ||fp32|| = 8.0e-3 (mlp; 6.1-7.0e-3 for the gated variants).
bf16 keeps 8 significant bits (unit round-off 2**-9 = 2.0e-3), so these are a few round-offs, as expected of
two layers. The bounds below are about 3-4x those maxima; a loss, gate or norm computed in bf16, or a residual
stream rounded to bf16, moves them by more.
"""

import pytest
import torch
from model_testkit import FFN_VARIANTS, perturb, tiny_batch, tiny_model

LOGITS_REL = 3e-2  # measured max 9.7e-3
LOSS_REL = 3e-3  # measured max 8.1e-4
GRAD_REL = 3e-2  # measured max 8.0e-3


def _forward_backward(model, batch, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], word_read=batch["word_read"])
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ffn", FFN_VARIANTS)
def test_bf16_autocast_forward_and_backward(ffn, seed):
    model = perturb(tiny_model(ffn=ffn, seed=4 + 10 * seed, tagging_decoder="crf"), seed=5 + 10 * seed, std=0.05)
    model.eval()
    batch = tiny_batch([7, 5, 6], seed=6 + 10 * seed)
    ref, ref_grads = _forward_backward(model, batch, bf16=False)
    out, grads = _forward_backward(model, batch, bf16=True)
    for name, logits in out.logits.items():
        assert torch.isfinite(logits).all()
        scale = ref.logits[name].abs().max().item()
        err = (logits.float() - ref.logits[name]).abs().max().item()
        assert err <= LOGITS_REL * scale, f"{name}: bf16 logits off by {err:.3g} (scale {scale:.3g})"
    for gates in out.gates:  # gates are always computed in float32
        assert all(w.dtype == torch.float32 for w in gates.values())
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    loss_err = abs(out.loss.item() - ref.loss.item())
    assert loss_err <= LOSS_REL * abs(ref.loss.item()), f"bf16 loss off by {loss_err:.3g} (loss {ref.loss.item():.3g})"
    assert grads.keys() == ref_grads.keys() and grads
    assert all(g.dtype == torch.float32 for g in grads.values())  # master weights stay fp32
    assert all(torch.isfinite(g).all() for g in grads.values())
    flat, flat_ref = (torch.cat([g[n].flatten() for n in sorted(g)]) for g in (grads, ref_grads))
    assert flat_ref.norm() > 0
    grad_err = ((flat - flat_ref).norm() / flat_ref.norm()).item()
    assert grad_err <= GRAD_REL, f"bf16 gradients off by {grad_err:.3g} of their norm"
