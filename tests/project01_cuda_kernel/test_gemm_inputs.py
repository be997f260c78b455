"""CPU tier: the GEMM API's contract without a GPU (input validation, kernel names, arch logic)."""

from __future__ import annotations

import pytest
import torch

import project01_cuda_kernel as p01
from project01_cuda_kernel import _build, gemm


def test_import_needs_no_gpu_and_lists_the_ladder_in_order():
    names = p01.GEMM_KERNELS
    assert names == gemm.GEMM_KERNELS
    assert len(names) == len(set(names))
    assert [gemm.step_of(k) for k in names] == list(range(1, len(names) + 1))
    assert all(k.startswith("sgemm_") for k in gemm.FLOAT32_KERNELS)
    assert gemm.FLOAT32_KERNELS + gemm.TENSOR_CORE_KERNELS == names
    assert set(gemm.KERNEL_NOTES) == set(names)


def test_every_kernel_has_its_source_file_and_the_extension_lists_them_all():
    csrc = _build.CSRC / "gemm"
    for name in gemm.GEMM_KERNELS:
        assert (csrc / f"{name}.cu").exists(), name
        assert f"gemm/{name}.cu" in gemm._SOURCES
    assert "gemm/binding.cpp" in gemm._SOURCES


@pytest.mark.parametrize("kernel", gemm.GEMM_KERNELS)
def test_kernel_dtypes(kernel):
    dts = gemm.kernel_dtypes(kernel)
    if kernel.startswith("sgemm_"):
        assert dts == (torch.float32,)
    else:
        assert dts == (torch.bfloat16, torch.float16)


def _cpu(m, k, dtype=torch.float32):
    return torch.randn(m, k).to(dtype)


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "exc", "match"),
    [
        ([[1.0]], _cpu(1, 1), {}, TypeError, "a must be a torch.Tensor"),
        (_cpu(2, 3), None, {}, TypeError, "b must be a torch.Tensor"),
        (torch.randn(2, 3, 4), _cpu(4, 5), {}, ValueError, r"a must be 2-D \(M, K\)"),
        (_cpu(2, 3), torch.randn(3), {}, ValueError, r"b must be 2-D \(K, N\)"),
        (
            _cpu(2, 3),
            _cpu(4, 5),
            {},
            ValueError,
            "b must be \\(K, N\\) with K = a.shape\\[1\\] = 3",
        ),
        (_cpu(2, 3), _cpu(3, 5, torch.bfloat16), {}, TypeError, "b must have a's dtype"),
        (_cpu(2, 3, torch.float64), _cpu(3, 5, torch.float64), {}, TypeError, "float32, bfloat16"),
        (_cpu(2, 3), _cpu(3, 5), {"kernel": "cublas"}, ValueError, "kernel must be 'auto' or"),
        (_cpu(2, 3), _cpu(3, 5), {"kernel": 7}, TypeError, "kernel must be a str"),
        (
            _cpu(2, 3),
            _cpu(3, 5),
            {"kernel": "hgemm_08_mma_sync"},
            TypeError,
            "bfloat16 or torch.float16 for kernel 'hgemm_08_mma_sync'",
        ),
        (
            _cpu(2, 3, torch.bfloat16),
            _cpu(3, 5, torch.bfloat16),
            {"kernel": "sgemm_07_warptiling"},
            TypeError,
            "float32 for kernel 'sgemm_07_warptiling'",
        ),
        (
            _cpu(2, 3).to("meta"),
            _cpu(3, 5),
            {},
            ValueError,
            "a must be a CPU or CUDA tensor, got device meta",
        ),
        (_cpu(2, 3), _cpu(3, 5).to("meta"), {}, ValueError, "b must be a CPU or CUDA tensor"),
    ],
)
def test_bad_input_raises_naming_the_argument(a, b, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        p01.matmul(a, b, **kwargs)


def test_layout_is_checked_after_device():
    """Non-contiguous inputs are refused with the fix in the message, on CPU as on CUDA (the
    checks are the same on both devices); an unsupported device is named first."""
    a = torch.randn(3, 2).t()  # (2, 3), not contiguous
    b = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"a must be contiguous \(row-major\); call .contiguous"):
        p01.matmul(a, b, kernel="sgemm_01_naive")
    with pytest.raises(ValueError, match="a must be a CPU or CUDA tensor, got device meta"):
        p01.matmul(a.to("meta"), b, kernel="sgemm_01_naive")


def test_arch_detection_uses_the_gpu_or_the_override(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert _build.target_arch_list() == "9.0a"  # wgmma/TMA need the arch-specific target
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert _build.target_arch_list() == "8.0"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.6;9.0a")
    assert _build.target_arch_list() == "8.6;9.0a"


@pytest.mark.parametrize(("cc", "hopper"), [((9, 0), True), ((8, 0), False), ((10, 0), False)])
def test_hopper_kernels_are_offered_only_on_compute_capability_9_0(monkeypatch, cc, hopper):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cc)
    offered = gemm.available_kernels()
    assert ("hgemm_09_wgmma_tma" in offered) == hopper
    assert gemm.available_kernels(torch.float32) == gemm.FLOAT32_KERNELS
    expected = "hgemm_09_wgmma_tma" if hopper else "hgemm_08_mma_sync"
    assert gemm.default_kernel(torch.bfloat16) == expected
    assert gemm.default_kernel(torch.float32) == "sgemm_07_warptiling"


def test_missing_cuda_is_one_clear_sentence():
    if torch.cuda.is_available() and torch.version.cuda is not None:
        pytest.skip("CUDA is available here: the no-GPU message cannot be produced")
    reason = _build.cuda_unavailable_reason()
    assert reason and reason.endswith(".") and "\n" not in reason
    with pytest.raises(p01.CudaUnavailableError):
        _build.require_cuda()
