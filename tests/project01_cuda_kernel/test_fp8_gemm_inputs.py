"""CPU tier: the FP8 step's contract without a GPU: input checks (one clear error naming the
argument), the operator on CPU (opcheck, its float32 reference), the error bound and the
baseline rule that the GPU tests and the benchmark judge the kernel by, each shown to fail on a
planted bug, and the source files the extension builds."""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel import _build, fp8_gemm, gemm, ops
from project01_cuda_kernel.compile_check import NO_SPILL_MARKER

E4M3 = torch.float8_e4m3fn


def _fp8(rows: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return fp8_gemm.quantize(torch.randn(rows, k, generator=gen))


@pytest.fixture(scope="module")
def case():
    """a (M, K), b (N, K) quantised with per-tensor scales, and the exact product of the
    dequantized inputs in float64."""
    a, sa = _fp8(48, 512, seed=1)
    b, sb = _fp8(40, 512, seed=2)
    exact = torch.matmul(a.double() * sa.double(), (b.double() * sb.double()).t())
    return a, b, sa, sb, exact


def test_the_kernel_source_header_and_extension_list():
    csrc = _build.CSRC
    src = (csrc / "gemm" / f"{fp8_gemm.KERNEL}.cu").read_text()
    assert f"gemm/{fp8_gemm.KERNEL}.cu" in gemm._SOURCES  # built with the ladder's extension
    assert NO_SPILL_MARKER in src and '#include "common/fp8.cuh"' in src
    header = (csrc / "common" / "fp8.cuh").read_text()
    # FP8 wgmma: e4m3 x e4m3, k = 32, and no transpose immediates (both operands K-major)
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in header
    assert ", %64, %65, p, 1, 1;" in header
    assert fp8_gemm.KERNEL not in gemm.GEMM_KERNELS  # matmul's ladder keeps its contract
    assert fp8_gemm.STEP == gemm.step_of(gemm.GEMM_KERNELS[-1]) + 1


def test_shape_and_dtype_of_the_result(case):
    a, b, sa, sb, _ = case
    c = fp8_gemm.scaled_matmul(a, b, sa, sb)
    assert c.shape == (48, 40) and c.dtype == torch.bfloat16 and c.is_contiguous()
    empty = fp8_gemm.scaled_matmul(a[:, :0], b[:, :0], sa, sb)  # K = 0: a zero product
    assert torch.equal(empty, torch.zeros(48, 40, dtype=torch.bfloat16))


def test_opcheck_on_cpu(case):
    """Fake tensors, autograd registration and AOT dispatch with dynamic shapes. opcheck's
    schema test is left out: it compares inputs with allclose, which float8 lacks on CPU, so
    that the inputs are left unchanged is checked here by hand."""
    a, b, sa, sb, _ = case
    a0, b0 = a.view(torch.uint8).clone(), b.view(torch.uint8).clone()
    torch.library.opcheck(
        ops.scaled_matmul,
        (a, b, sa, sb),
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    assert torch.equal(a.view(torch.uint8), a0) and torch.equal(b.view(torch.uint8), b0)


def test_cpu_reference_is_within_the_bound_and_the_bound_catches_planted_bugs(case):
    """The CPU path (float32 sums of float8 products, exact in float32 up to K 2^-24, then
    rounded to bfloat16) lies inside `error_bound` everywhere; a result that lost one 16-wide
    slice of K, or wrote zeros in one 16x16 tile, does not."""
    a, b, sa, sb, exact = case
    bound = fp8_gemm.error_bound(a, b, sa, sb, exact)
    c = fp8_gemm.scaled_matmul(a, b, sa, sb).double()
    assert ((c - exact).abs() <= bound).all()
    lost = fp8_gemm.reference(a[:, :-16].contiguous(), b[:, :-16].contiguous(), sa, sb).double()
    assert not ((lost - exact).abs() <= bound).all()
    hole = c.clone()
    hole[16:32, 16:32] = 0
    assert not ((hole - exact).abs() <= bound).all()


def test_baseline_rule_catches_a_one_percent_scale_error(case):
    """within_baseline with the reference as the baseline (both round the same float32 sums to
    bfloat16): the reference passes, the same result scaled by 1.01 fails."""
    a, b, sa, sb, exact = case
    c = fp8_gemm.reference(a, b, sa, sb)
    base = fp8_gemm.relative_error(c, exact)
    assert 0 < base < 2.0**-8  # bfloat16 rounding
    assert fp8_gemm.within_baseline(fp8_gemm.relative_error(c, exact), base)
    off = fp8_gemm.reference(a, b, sa * 1.01, sb)
    assert not fp8_gemm.within_baseline(fp8_gemm.relative_error(off, exact), base)


def test_quantize_maps_the_largest_magnitude_to_448():
    x = torch.tensor([[-3.0, 1.5, 0.0, 2.0]])
    q, s = fp8_gemm.quantize(x)
    assert q.dtype == E4M3 and s.dtype == torch.float32 and s.shape == (1,)
    assert q.float().abs().max().item() == 448.0 and s.item() == pytest.approx(3.0 / 448)


def _a(m=4, k=32):
    return torch.zeros(m, k).to(E4M3)


_S = torch.ones(1)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (
            (_a().float(), _a(), _S, _S),
            TypeError,
            "a must be torch.float8_e4m3fn, got torch.float32",
        ),
        ((_a(), _a().bfloat16(), _S, _S), TypeError, "b must be torch.float8_e4m3fn"),
        ((_a(), _a().to(torch.float8_e5m2), _S, _S), TypeError, "b must be torch.float8_e4m3fn"),
        (([[0.0]], _a(), _S, _S), TypeError, "a must be a torch.Tensor"),
        ((_a()[0], _a(), _S, _S), ValueError, r"a must be 2-D \(M, K\)"),
        ((_a(), _a()[None], _S, _S), ValueError, r"b must be 2-D \(N, K\)"),
        ((_a(4, 32), _a(5, 48), _S, _S), ValueError, r"b must be \(N, K\) with K = a.shape\[1\]"),
        ((_a(4, 40), _a(5, 40), _S, _S), ValueError, "K = a.shape.1. must be a multiple of 16"),
        ((_a(), _a(), 1.0, _S), TypeError, "scale_a must be a torch.Tensor"),
        ((_a(), _a(), _S.double(), _S), TypeError, "scale_a must be a float32 tensor of one"),
        ((_a(), _a(), _S, torch.ones(2)), TypeError, "scale_b must be a float32 tensor of one"),
        ((_a().to("meta"), _a(), _S, _S), ValueError, "a must be a CPU or CUDA tensor"),
        ((_a(), _a(), _S, _S.to("meta")), ValueError, "scale_b must be a CPU or CUDA tensor"),
        ((_a(4, 64)[:, ::2], _a(), _S, _S), ValueError, "a must be contiguous"),
    ],
)
def test_bad_input_raises_naming_the_argument(args, exc, match):
    with pytest.raises(exc, match=match):
        fp8_gemm.scaled_matmul(*args)


def test_off_hopper_the_launch_names_the_compute_capability(monkeypatch):
    """On a GPU other than compute capability 9.0 the CUDA path refuses before building
    anything, naming what it needs and what it found."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert not fp8_gemm.available()
    c = torch.empty(4, 4, dtype=torch.bfloat16)
    with pytest.raises(_build.CudaUnavailableError, match=r"compute capability 9.0.*\(8, 9\)"):
        fp8_gemm.launch(_a(), _a(), _S, _S, c)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert fp8_gemm.available()
