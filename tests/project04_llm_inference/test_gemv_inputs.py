"""CPU tier: the GEMV ops' arguments and their composed path (what CPU tensors and the shapes the
kernel does not take run). The kernel itself is checked in test_gemv_gpu.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from project04_llm_inference.kernels import gemv, reference

EPS = 1e-5


def _t(*shape, seed=0, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_cpu_tensors_take_the_composed_path():
    x, w = _t(2, 64), _t(48, 64, seed=1)
    assert not gemv.gemv_applies(x, w)
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("silu_mul", [True, False])
def test_norm_linear_on_cpu_is_norm_then_linear(with_residual, silu_mul):
    x, g, w = _t(3, 64), 1 + 0.1 * _t(64, seed=2), _t(48, 64, seed=3)
    res = _t(3, 64, seed=4) if with_residual else None
    if res is None:
        want_h, want_stream = reference.rms_norm(x, g, EPS), x.clone()
    else:
        want_h, want_stream = reference.fused_add_rms_norm(x.clone(), res.clone(), g, EPS)
    want = F.linear(want_h, w)
    if silu_mul:
        want = reference.silu_and_mul(want)
    out, stream = gemv.norm_linear(x, res, g, w, EPS, silu_mul=silu_mul)
    assert torch.equal(out, want)
    assert torch.equal(stream, want_stream)
    assert out.shape == (3, 24 if silu_mul else 48)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: gemv.linear(_t(2, 64), _t(8, 32)), "differ in K"),
        (lambda: gemv.linear(_t(64), _t(8, 64)), "x must have 2 dims"),
        (lambda: gemv.linear([[1.0]], _t(8, 64)), "x must be a torch.Tensor"),
        (lambda: gemv.norm_linear(_t(2, 64), None, _t(32), _t(8, 64), EPS), "norm_weight"),
        (lambda: gemv.norm_linear(_t(2, 64), None, _t(64), _t(8, 32), EPS), "weight"),
        (lambda: gemv.norm_linear(_t(2, 64), _t(3, 64), _t(64), _t(8, 64), EPS), "residual"),
        (
            lambda: gemv.norm_linear(_t(2, 64), None, _t(64), _t(7, 64), EPS, silu_mul=True),
            "even number of weight rows",
        ),
    ],
)
def test_bad_arguments_name_what_is_wrong(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()
