"""shared.fused_loss against the unfused F.cross_entropy(F.linear(h, W).float(), targets).

Tolerances, from the arithmetic: both compute the same products and exponentials; only the order
of sums differs (the mean over tokens is summed chunk by chunk; dL/dW adds one term per chunk).
Summing n terms in another order moves the result by at most (n - 1) u sum|terms|. Here n is at
most D + V + N < 150 and every term is O(1) (losses ~ ln V, gradients <= 1/N per element), so in
float64 (u = 1.1e-16) the gap is under 2e-14 and in float32 (u = 6e-8) under 1e-5; bfloat16
rounds the logits and the gradient as the unfused path does, checked at float32's tolerance on
the float32 loss and at one bfloat16 ulp (2^-8 relative) on the gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shared.fused_loss import linear_cross_entropy
from shared.model import ModelArgs, Transformer

TOL = {torch.float64: 2e-14, torch.float32: 1e-5}


def _case(n=37, d=16, v=50, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g)).to(dtype).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    return h, w, t


def _grads(loss_fn, h, w, t, scale=3.0):
    h.grad = w.grad = None
    loss = loss_fn(h, w, t)
    (scale * loss).backward()  # the incoming gradient is scaled, as a loss scale or 1/accum
    return loss.detach(), h.grad.clone(), w.grad.clone()


def _unfused(h, w, t):
    return F.cross_entropy(F.linear(h, w).to(torch.promote_types(h.dtype, torch.float32)), t)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk", [1, 8, 36, 37, 4096])  # one token, ragged, whole, larger
def test_loss_and_gradients_match_the_unfused_path(dtype, chunk):
    h, w, t = _case(dtype=dtype)
    got = _grads(lambda h, w, t: linear_cross_entropy(h, w, t, chunk), h, w, t)
    want = _grads(_unfused, h, w, t)
    assert got[0].dtype == want[0].dtype
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=TOL[dtype])


def test_bfloat16_rounds_as_the_unfused_path():
    h, w, t = _case(dtype=torch.bfloat16)
    got = _grads(lambda h, w, t: linear_cross_entropy(h, w, t, 8), h, w, t)
    want = _grads(_unfused, h, w, t)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(got[1:], want[1:]):
        torch.testing.assert_close(a.float(), b.float(), rtol=2**-8, atol=2**-8 * b.abs().max())


def test_batched_inputs_and_bad_arguments():
    h, w, t = _case(n=12)
    flat = linear_cross_entropy(h, w, t, 5)
    torch.testing.assert_close(linear_cross_entropy(h.view(3, 4, -1), w, t.view(3, 4), 5), flat)
    with pytest.raises(ValueError, match="same D"):
        linear_cross_entropy(h, w[:, :8], t)
    with pytest.raises(ValueError, match="one entry per token"):
        linear_cross_entropy(h, w, t[:5])
    with pytest.raises(ValueError, match="int64"):
        linear_cross_entropy(h, w, t.int())
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(h, w, t, 0)
    with pytest.raises(ValueError, match="share a dtype"):
        linear_cross_entropy(h.float(), w, t)
    with pytest.raises(ValueError, match="no tokens"):
        linear_cross_entropy(h[:0], w, t[:0])


def test_the_model_returns_the_fused_loss_given_targets():
    args = ModelArgs(dim=32, n_layers=2, n_heads=4, vocab_size=64, ffn_hidden=64, max_seq_len=16)
    torch.manual_seed(0)
    model = Transformer(args).double()
    model.init_weights(seed=0)
    x = torch.randint(0, 64, (3, 16))
    y = torch.randint(0, 64, (3, 16))
    fused = model(x, targets=y, loss_chunk=7)
    fused.backward()
    g_fused = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    unfused = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    unfused.backward()
    assert model.compute_dtype == torch.float64
    torch.testing.assert_close(fused, unfused, rtol=2e-14, atol=2e-14)
    for k, p in model.named_parameters():
        torch.testing.assert_close(g_fused[k], p.grad, rtol=1e-12, atol=1e-13, msg=k)
