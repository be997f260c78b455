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


def _rope_write(hq=4, hkv=2, d=16, t=3):
    inv = 1.0 / (10_000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos_sin = reference.rope_cos_sin_cache(inv.float(), 64)
    caches = [torch.zeros(4, 16, hkv, d, dtype=torch.float32) for _ in range(2)]
    pos, slots = torch.tensor([3, 9, 40][:t]), torch.tensor([0, -1, 17][:t])
    return gemv.RopeWrite(hq, hkv, pos, cos_sin, caches[0], caches[1], slots)


def test_norm_linear_with_rope_on_cpu_is_norm_linear_then_rope_and_cache():
    hq, hkv, d = 4, 2, 16
    x, g = _t(3, 64, dtype=torch.float32), 1 + 0.1 * _t(64, seed=2, dtype=torch.float32)
    w = _t((hq + 2 * hkv) * d, 64, seed=3, dtype=torch.float32)
    rope = _rope_write(hq, hkv, d)
    got, _ = gemv.norm_linear(x.clone(), None, g, w, EPS, rope=rope)
    want, _ = gemv.norm_linear(x.clone(), None, g, w, EPS)
    kc, vc = torch.zeros_like(rope.k_cache), torch.zeros_like(rope.v_cache)
    reference.rope_and_cache(
        *gemv.qkv_views(want, hq, hkv, d), rope.positions, rope.cos_sin, kc, vc, rope.slot_mapping
    )
    assert torch.equal(got, want)
    assert torch.equal(rope.k_cache, kc) and torch.equal(rope.v_cache, vc)
    written = rope.k_cache.flatten(0, 1).abs().sum(dim=(1, 2)) > 0  # per slot
    assert written.nonzero().flatten().tolist() == [0, 17]  # the token of slot -1 is not written


def test_norm_linear_rope_arguments_are_checked():
    x, g = _t(3, 64, dtype=torch.float32), torch.ones(64)
    rope = _rope_write()
    with pytest.raises(ValueError, match="not a fused QKV projection"):
        gemv.norm_linear(x, None, g, _t(100, 64, dtype=torch.float32), EPS, rope=rope)
    with pytest.raises(ValueError, match="exclude each other"):
        gemv.norm_linear(
            x, None, g, _t(128, 64, dtype=torch.float32), EPS, rope=rope, silu_mul=True
        )


def test_the_tensor_core_variant_is_off_unless_enabled(monkeypatch):
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", 0)
    assert gemv.max_tokens((9, 0)) == gemv.max_tokens((8, 0)) == gemv.GEMV_MAX_TOKENS == 2
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", 8)
    assert gemv.max_tokens((9, 0)) == gemv.max_tokens((8, 6)) == 8
    assert gemv.max_tokens((7, 5)) == 2  # no bf16 mma.sync before sm_80: cuBLAS
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", 5)
    assert gemv.max_tokens((9, 0)) == 5


@pytest.mark.parametrize("bad", [1, 2, 9, -1])
def test_a_tensor_core_bound_the_kernel_cannot_take_is_refused(monkeypatch, bad):
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", bad)
    with pytest.raises(ValueError, match="MMA_MAX_TOKENS must be 0 .off. or in 3..8"):
        gemv.max_tokens((9, 0))


@pytest.mark.parametrize("tokens", [3, 8])
def test_cpu_tensors_take_the_composed_path_with_the_tensor_core_variant_on(monkeypatch, tokens):
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", 8)
    x, g, w, res = (
        _t(tokens, 64),
        1 + 0.1 * _t(64, seed=2),
        _t(48, 64, seed=3),
        _t(tokens, 64, seed=4),
    )
    assert not gemv.gemv_applies(x, w)
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))
    want_h, want_stream = reference.fused_add_rms_norm(x.clone(), res.clone(), g, EPS)
    out, stream = gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)
    assert torch.equal(out, reference.silu_and_mul(F.linear(want_h, w)))
    assert torch.equal(stream, want_stream)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("mma_max_tokens", 2, "mma_max_tokens must be 0 or in 3..8"),
        ("mma_max_tokens", 9, "mma_max_tokens must be 0 or in 3..8"),
        ("tokens", [3, 9], "tokens must be in 1..8"),
        ("repeats", 0, "repeats must be >= 1"),
    ],
)
def test_the_benchmark_config_is_checked_before_any_gpu_work(field, value, match):
    from project04_llm_inference.bench.gemv import GemvBenchConfig, check_config

    check_config(GemvBenchConfig(mma_max_tokens=8, tokens=[3, 4, 5, 6, 7, 8]))
    with pytest.raises(ValueError, match=match):
        check_config(GemvBenchConfig(**{field: value}))


# ---- FP8 weights: which path a projection takes ------------------------------------------------

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
H200, A100 = (9, 0), (8, 0)


@pytest.mark.parametrize(
    "tokens,n,k,dtype,device,cap,want",
    [
        (1, 3072, 2048, BF16, "cuda", H200, "gemv"),
        (2, 3072, 2048, F16, "cuda", (8, 9), "gemv"),
        (1, 201, 1040, BF16, "cuda", H200, "gemv"),  # odd N: the kernel takes any row count
        (3, 3072, 2048, BF16, "cuda", H200, "scaled_mm"),  # the tensor-core variant: 16-bit only
        (8, 3072, 2048, BF16, "cuda", H200, "scaled_mm"),
        (64, 3072, 2048, BF16, "cuda", H200, "scaled_mm"),
        (3, 201, 1040, BF16, "cuda", H200, "reference"),  # _scaled_mm needs N % 16 == 0
        (1, 3072, 2056, BF16, "cuda", H200, "reference"),  # K % 16 != 0: neither kernel
        (1, 3072, 2048, F32, "cuda", H200, "scaled_mm"),  # the kernel stages 16-bit rows only
        (2, 64, gemv.MAX_STAGED_BYTES // 4 + 16, BF16, "cuda", H200, "scaled_mm"),  # too wide
        (1, 3072, 2048, BF16, "cuda", A100, "reference"),  # no e4m3 instructions below 8.9
        (1, 3072, 2048, BF16, "cpu", (0, 0), "reference"),
        (0, 3072, 2048, BF16, "cuda", H200, "reference"),
    ],
)
def test_fp8_route(tokens, n, k, dtype, device, cap, want):
    assert gemv.fp8_route(tokens, n, k, dtype, device, cap) == want


def test_fp8_gemv_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(gemv, "FP8_GEMV", False)
    assert gemv.fp8_route(1, 3072, 2048, BF16, "cuda", H200) == "scaled_mm"


def test_fp8_weights_on_the_cpu_take_the_dequantizing_reference():
    from project04_llm_inference.kernels.fp8 import Fp8Weight, fp8_linear_reference

    x, fw = _t(1, 64), Fp8Weight.from_float(_t(48, 64, seed=1))
    assert not gemv.gemv_applies(x, fw)
    assert torch.equal(gemv.linear(x, fw), fp8_linear_reference(x, fw))
