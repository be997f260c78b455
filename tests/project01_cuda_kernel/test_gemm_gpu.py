"""GPU tier: every ladder kernel against PyTorch on ragged and aligned shapes.

Inputs are fresh random draws (never zeros); outputs are poisoned with NaN first, so an element
a kernel forgets to write fails the test. Pass rule: the kernel's relative error
against a float64 reference is at most twice PyTorch's own error in the same dtype (cuBLAS with
TF32 off for float32), plus a small floor (see _floor) for shapes where cuBLAS is exact.
"""

from __future__ import annotations

import math

import pytest
import torch

from project01_cuda_kernel import gemm

pytestmark = pytest.mark.gpu

# (M, N, K): ones, primes and odd sizes, K = 1, tall, wide, N = 1, M = 1, and aligned shapes.
SHAPES = [
    (1, 1, 1),
    (17, 17, 17),
    (127, 127, 127),
    (1000, 1000, 1000),
    (4097, 4097, 4097),
    (1000, 1000, 1),
    (4097, 17, 127),
    (17, 4097, 1000),
    (127, 1, 4097),
    (1, 127, 4097),
    (333, 520, 8),
    (256, 256, 256),
    (1024, 768, 4096),
]
FLOORS = {torch.bfloat16: 1e-3, torch.float16: 1e-4}


def _floor(dtype: torch.dtype, k: int) -> float:
    """Slack for shapes where cuBLAS is (nearly) exact. float32: a plain sequential K-term dot
    product has rounding error ~sqrt(K) * 2^-24 (cuBLAS's blocked sums do better at N = 1), so
    the floor is 2 sqrt(K) 2^-24 (7.6e-6 at K = 4097): orders of magnitude under any bug."""
    return 2 * math.sqrt(k) * 2.0**-24 if dtype == torch.float32 else FLOORS[dtype]


def _cases():
    for kernel in gemm.GEMM_KERNELS:
        for dtype in gemm.kernel_dtypes(kernel):
            for shape in SHAPES:
                yield pytest.param(kernel, dtype, shape, id=f"{kernel}-{str(dtype)[6:]}-{shape}")


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize(("kernel", "dtype", "shape"), list(_cases()))
def test_kernel_matches_torch(kernel, dtype, shape):
    if kernel not in gemm.available_kernels():
        pytest.skip(f"{kernel} needs a Hopper GPU (compute capability 9.0)")
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(hash((kernel, str(dtype), shape)) % 2**31)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    b = torch.randn(k, n, device="cuda", generator=gen).to(dtype)
    ref = a.double() @ b.double()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    got = gemm.matmul(a, b, kernel=kernel, out=out)
    torch.cuda.synchronize()
    assert got is out and got.shape == (m, n) and got.dtype == dtype
    assert torch.isfinite(got).all(), "some outputs were not written (NaN poison left)"
    err = _rel_err(got, ref)
    torch_err = _rel_err(a @ b, ref)
    assert err <= 2 * torch_err + _floor(dtype, k), (err, torch_err)


@pytest.mark.smoke  # every kernel once, on an odd shape
@pytest.mark.parametrize("kernel", gemm.GEMM_KERNELS)
def test_kernel_is_deterministic_and_leaves_inputs_alone(kernel):
    """Same inputs twice: bit-identical outputs (a changing result means a race)."""
    if kernel not in gemm.available_kernels():
        pytest.skip(f"{kernel} needs a Hopper GPU (compute capability 9.0)")
    dtype = gemm.kernel_dtypes(kernel)[0]
    m, n, k = 1031, 777, 1536
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(k, n, device="cuda").to(dtype)
    a0, b0 = a.clone(), b.clone()
    x = gemm.matmul(a, b, kernel=kernel)
    y = gemm.matmul(a, b, kernel=kernel)
    assert torch.equal(x, y)
    assert torch.equal(a, a0) and torch.equal(b, b0)


@pytest.mark.smoke
def test_auto_and_unaligned_views():
    """kernel='auto' picks the top step; a contiguous view at an odd offset (not 16-byte
    aligned) still works on the vectorised paths."""
    base = torch.randn(1 + 300 * 200, device="cuda")
    a = base[1:].view(300, 200)  # data_ptr offset by 4 bytes
    b = torch.randn(200, 96, device="cuda")
    ref = a.double() @ b.double()
    for kernel in ("auto", "sgemm_06_vectorized", "sgemm_07_warptiling"):
        assert _rel_err(gemm.matmul(a, b, kernel=kernel), ref) < 1e-5
    hb = torch.randn(1 + 300 * 256, device="cuda").to(torch.bfloat16)
    ha = hb[1:].view(300, 256)  # 2-byte offset
    hbm = torch.randn(256, 72, device="cuda").to(torch.bfloat16)
    ref = ha.double() @ hbm.double()
    torch_err = _rel_err(ha @ hbm, ref)
    for kernel in gemm.available_kernels(torch.bfloat16):
        assert _rel_err(gemm.matmul(ha, hbm, kernel=kernel), ref) <= 2 * torch_err + 1e-3


def test_empty_and_k0():
    a = torch.randn(5, 0, device="cuda")
    b = torch.randn(0, 7, device="cuda")
    assert torch.equal(gemm.matmul(a, b), torch.zeros(5, 7, device="cuda"))
    assert gemm.matmul(
        torch.randn(0, 3, device="cuda"), torch.randn(3, 4, device="cuda")
    ).shape == (0, 4)


def test_wrong_device_and_out_checks():
    a = torch.randn(4, 4, device="cuda")
    with pytest.raises(ValueError, match=r"b must be on a's device cuda:0, got cpu"):
        gemm.matmul(a, torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"out must be a \(4, 4\) torch.float32 tensor"):
        gemm.matmul(a, a, out=torch.empty(4, 5, device="cuda"))
    with pytest.raises(ValueError, match="a must be contiguous"):
        gemm.matmul(a.t(), a)
