"""GPU tier: the FP8 step (fp8gemm_10_wgmma_tma) against torch._scaled_mm and the exact product.

Inputs are random normal matrices quantised to float8 e4m3 with per-tensor scales (A and B on
different scales); `exact` is the product of the dequantized inputs in float64 (the float8
values and their products are exact there). Outputs are poisoned with NaN first, so an element
the kernel forgets to write fails.

Tolerances, from the arithmetic (fp8_gemm.error_bound, fp8_gemm.within_baseline):
- elementwise, |C - exact| <= 2^-8 (1 + 2^-8) |exact| + (2^-10 + K 2^-24) scale_a scale_b
  (|A| |B|^T): bfloat16's rounding of the output (unit roundoff 2^-8), plus the accumulation:
  at most 4 reduced-precision tensor-core additions per 128-wide k-tile (>= 13 significant bits
  each, 2^-11, doubled) and float32 additions across k-tiles (at most K 2^-24), each relative to
  the sum of |products|;
- the relative Frobenius error at most twice torch._scaled_mm's on the same inputs (PyTorch's own
  FP8 kernel, the house rule for low-precision kernels) plus 2^-10.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from project01_cuda_kernel import _build, fp8_gemm, ops

E4M3 = torch.float8_e4m3fn
HOPPER = fp8_gemm.available()
needs_hopper = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (compute capability 9.0)")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# (M, N, K): odd M and N (N odd takes the element-by-element store), K a multiple of 16 but not
# of 128 (a zero-filled partial k-tile), one-row and one-column outputs, tile multiples.
SHAPES = [
    (127, 255, 512),
    (1000, 1000, 1024),
    (4096, 4096, 4096),
    (1, 1, 16),
    (17, 4097, 48),
    (4097, 129, 2064),
    (333, 520, 16),
    (1, 640, 4096),
    (640, 1, 4096),
    (256, 256, 256),
]


def _inputs(m: int, n: int, k: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, sa = fp8_gemm.quantize(torch.randn(m, k, device="cuda", generator=gen))
    b, sb = fp8_gemm.quantize(0.25 * torch.randn(n, k, device="cuda", generator=gen))
    return a, b, sa, sb


def _exact(a, b, sa, sb) -> torch.Tensor:
    return torch.matmul(a.double() * sa.double(), (b.double() * sb.double()).t())


def _scaled_mm(a, b, sa, sb) -> torch.Tensor:
    """torch._scaled_mm(a, b.t(), ...) in bfloat16; N is padded to a multiple of 16 with zero
    rows of b (its shape rule; the padded columns are sliced off and change no other)."""
    n = b.shape[0]
    pad = (-n) % 16
    if pad:
        b = F.pad(b.view(torch.uint8), (0, 0, 0, pad)).view(E4M3)
    out = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    return out[:, :n]


def _run(a, b, sa, sb) -> torch.Tensor:
    out = torch.full((a.shape[0], b.shape[0]), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = fp8_gemm.launch(a, b, sa, sb, out)
    torch.cuda.synchronize()
    assert got is out
    return out


def _assert_within_bound(got, a, b, sa, sb, exact) -> None:
    assert torch.isfinite(got).all(), "some outputs were not written (NaN poison left)"
    bound = fp8_gemm.error_bound(a, b, sa, sb, exact)
    err = (got.double() - exact).abs()
    worst = (err / bound).max().item()
    assert (err <= bound).all(), f"error reaches {worst:.3g} x the bound"


@needs_hopper
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_scaled_mm_and_the_exact_product(shape):
    m, n, k = shape
    a, b, sa, sb = _inputs(m, n, k, seed=m * 7 + n * 13 + k * 17)
    exact = _exact(a, b, sa, sb)
    got = _run(a, b, sa, sb)
    _assert_within_bound(got, a, b, sa, sb, exact)
    theirs = _scaled_mm(a, b, sa, sb)
    err, base = fp8_gemm.relative_error(got, exact), fp8_gemm.relative_error(theirs, exact)
    assert fp8_gemm.within_baseline(err, base), (err, base)


@needs_hopper
@pytest.mark.smoke  # the FP8 step once, on an odd shape: correct, deterministic, inputs untouched
def test_fp8_step_is_deterministic_and_leaves_inputs_alone():
    a, b, sa, sb = _inputs(1031, 777, 1536, seed=3)
    a0, b0 = a.view(torch.uint8).clone(), b.view(torch.uint8).clone()
    x = _run(a, b, sa, sb)
    y = fp8_gemm.scaled_matmul(a, b, sa, sb)  # through the operator
    assert torch.equal(x, y)
    assert torch.equal(a.view(torch.uint8), a0) and torch.equal(b.view(torch.uint8), b0)
    _assert_within_bound(x, a, b, sa, sb, _exact(a, b, sa, sb))


@needs_hopper
def test_the_scales_are_read_from_the_device_and_applied_in_float32():
    """scale_a scale_b multiplies the float32 sums before the one rounding to bfloat16, so a
    factor 2 moved between the scales changes no bit, and doubling one doubles every output
    exactly (a power of two commutes with rounding, away from overflow)."""
    a, b, sa, sb = _inputs(300, 200, 256, seed=5)
    c = _run(a, b, sa, sb)
    assert torch.equal(_run(a, b, sa * 2, sb / 2), c)
    assert torch.equal(_run(a, b, sa * 2, sb), c * 2)


@needs_hopper
def test_a_view_that_is_not_16_byte_aligned_is_copied_first():
    m, n, k = 100, 72, 64
    a, b, sa, sb = _inputs(m, n, k, seed=7)
    flat = torch.empty(1 + m * k, device="cuda", dtype=torch.uint8)
    shifted = flat[1:].view(m, k).view(E4M3)  # data_ptr 1 byte past an aligned block
    shifted.view(torch.uint8).copy_(a.view(torch.uint8))
    assert shifted.data_ptr() % 16 != 0
    assert torch.equal(_run(shifted, b, sa, sb), _run(a, b, sa, sb))


@needs_hopper
def test_empty_and_k0():
    a, b, sa, sb = _inputs(5, 7, 16, seed=9)
    assert torch.equal(
        fp8_gemm.scaled_matmul(a[:, :0], b[:, :0], sa, sb),
        torch.zeros(5, 7, device="cuda", dtype=torch.bfloat16),
    )
    assert fp8_gemm.scaled_matmul(a[:0], b, sa, sb).shape == (0, 7)


@needs_hopper
def test_opcheck_and_compile_on_cuda():
    a, b, sa, sb = _inputs(48, 40, 256, seed=11)
    torch.library.opcheck(
        ops.scaled_matmul,
        (a, b, sa, sb),
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    compiled = torch.compile(lambda *t: fp8_gemm.scaled_matmul(*t) * 2, fullgraph=True)
    assert torch.equal(compiled(a, b, sa, sb), fp8_gemm.scaled_matmul(a, b, sa, sb) * 2)


_REFUSALS = r"""
import sys, torch
from project01_cuda_kernel import fp8_gemm
ext = fp8_gemm._ext()
g = torch.Generator(device="cuda").manual_seed(13)
a, sa = fp8_gemm.quantize(torch.randn(32, 64, device="cuda", generator=g))
b, sb = fp8_gemm.quantize(torch.randn(32, 64, device="cuda", generator=g))
c = torch.empty(32, 32, device="cuda", dtype=torch.bfloat16)
cases = {
    "cpu": lambda: ext.fp8gemm(a.cpu(), b.cpu(), sa.cpu(), sb.cpu(), c.cpu()),
    "dtype": lambda: ext.fp8gemm(a.bfloat16(), b, sa, sb, c),
    "out": lambda: ext.fp8gemm(a, b, sa, sb, c.float()),
    "k": lambda: ext.fp8gemm(a[:, :40].contiguous(), b[:, :40].contiguous(), sa, sb, c),
}
if sys.argv[1:] == ["cc"]:  # off Hopper: a well-formed call names the compute capability
    cases["cc"] = lambda: ext.fp8gemm(a, b, sa, sb, c)
for name, call in cases.items():
    print(name, "...", flush=True)
    try:
        call()
        print(name, "NO ERROR", flush=True)
    except RuntimeError as e:
        print(name, "RuntimeError:", str(e).splitlines()[0], flush=True)
"""


def test_the_binding_refuses_bad_tensors_with_a_clear_error():
    """The extension's own checks, behind the Python ones: CPU tensors, a wrong dtype, K not a
    multiple of 16, and (off Hopper) the compute capability, named. Run in a child process: a
    check that crashed instead of raising would otherwise end the whole GPU tier."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    args = [] if HOPPER else ["cc"]
    p = subprocess.run(
        [sys.executable, "-c", _REFUSALS, *args], capture_output=True, text=True, env=env
    )
    out = p.stdout
    assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{p.stderr[-2000:]}"
    assert "cpu RuntimeError: fp8gemm: a, b, scale_a, scale_b and c must be CUDA" in out
    assert "dtype RuntimeError: fp8gemm: a and b must be float8_e4m3fn" in out
    assert "out RuntimeError: fp8gemm: c must be bfloat16" in out
    assert "k RuntimeError: fp8gemm: K must be a multiple of 16" in out
    if not HOPPER:
        assert "cc RuntimeError: fp8gemm_10_wgmma_tma needs compute capability 9.0" in out


@pytest.mark.skipif(HOPPER, reason="on Hopper the kernel runs")
def test_off_hopper_the_operator_names_the_compute_capability():
    a, b, sa, sb = _inputs(32, 32, 64, seed=15)
    with pytest.raises(_build.CudaUnavailableError, match="compute capability 9.0"):
        fp8_gemm.scaled_matmul(a, b, sa, sb)


@needs_hopper
def test_one_and_two_k_tiles_in_flight_agree_bit_for_bit(monkeypatch):
    """P01_FP8_PROMOTE=serial (each k-tile promoted before the next is issued) against the
    default (two in flight): the same wgmma groups promoted in the same order, so the same bits;
    K = 1040 gives an odd number of k-tiles (9), K = 1024 an even one (8)."""
    for k in (1040, 1024):
        a, b, sa, sb = _inputs(257, 385, k, seed=k)
        monkeypatch.delenv("P01_FP8_PROMOTE", raising=False)
        overlap = _run(a, b, sa, sb)
        monkeypatch.setenv("P01_FP8_PROMOTE", "serial")
        serial = _run(a, b, sa, sb)
        assert torch.equal(overlap, serial), k
        _assert_within_bound(serial, a, b, sa, sb, _exact(a, b, sa, sb))
