"""project01: CUDA C++ kernels for PyTorch: a matmul optimisation ladder and FlashAttention.

Public API (see the project README):

- `matmul(a, b, *, kernel="auto")`: (M, K) @ (K, N) with a kernel of the ladder `GEMM_KERNELS`.
- `flash_attention(q, k, v, *, causal=False, softmax_scale=None)`: fused attention, (B, H, S, D),
  forward and backward kernels.
- `scaled_matmul(a, b, scale_a, scale_b)`: the FP8 step, (scale_a a) (scale_b b)^T in bfloat16
  for float8 e4m3 a (M, K) and b (N, K) (`torch._scaled_mm(a, b.t(), ...)`'s contract).

All three run through PyTorch operators (`ops.py`: `torch.ops.project01.*`), so torch.compile keeps
them in one graph. CUDA tensors run the kernels; CPU tensors run a slow float32 reference, there
so the operators are tested without a GPU. Importing this package needs no GPU and no compiler;
extensions are built on first use.
"""

from __future__ import annotations

from importlib import import_module

PROJECT = __name__  # the results folder: reports/<PROJECT>/

_LAZY = {
    "matmul": ".gemm",
    "GEMM_KERNELS": ".gemm",
    "flash_attention": ".attention",
    "scaled_matmul": ".fp8_gemm",
}

__all__ = ["GEMM_KERNELS", "flash_attention", "matmul", "scaled_matmul", "CudaUnavailableError"]

from ._build import CudaUnavailableError  # noqa: E402


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
