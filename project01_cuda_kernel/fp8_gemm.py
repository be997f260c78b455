"""Step 10 of the matmul ladder: FP8 on Hopper, `scaled_matmul(a, b, scale_a, scale_b)`.

C = (scale_a a) (scale_b b)^T in bfloat16, for a (M, K) and b (N, K) float8 e4m3 (both
row-major) and per-tensor float32 scales held in one-element tensors on a's device, with float32
accumulation: what `torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16)`
computes. B comes as (N, K), the layout of an `nn.Linear` weight, because FP8 `wgmma` reads both
operands K-major; `_scaled_mm` asks for the same bytes (its `b.t()` is column-major).

The kernel (csrc/gemm/fp8gemm_10_wgmma_tma.cu, compute capability 9.0 only) loads tiles with TMA,
so K must be a multiple of 16 (a row of K bytes is TMA's 16-byte stride unit); any M and N work
(TMA zero-fills the edges, the store is predicated). A view that does not start 16-byte aligned
is copied first.

`scaled_matmul` runs through the operator `project01::scaled_matmul` (ops.py): CUDA tensors run
the kernel, CPU tensors a float32 reference with the same checks (slow; there so the operator is
tested without a GPU). It is not differentiable. Importing this module needs no GPU and no
compiler.
"""

from __future__ import annotations

import torch

from ._build import CudaUnavailableError, is_hopper
from .gemm import _ext as _gemm_ext

KERNEL = "fp8gemm_10_wgmma_tma"
FP8_GEMM_KERNELS: tuple[str, ...] = (KERNEL,)
STEP = 10
IN_DTYPE = torch.float8_e4m3fn
OUT_DTYPE = torch.bfloat16
K_MULTIPLE = 16  # elements (= bytes) of K: TMA's row-stride unit
KERNEL_NOTE = "FP8 e4m3 wgmma 64x128x32, TMA, warp-specialised, persistent, fp32 promotion"
DEVICE_TYPES = ("cpu", "cuda")
_INT32_LIMIT = 2**31  # the kernel indexes with 32-bit ints

# The accumulation term of `error_bound`, per unit of sum |a_k b_k| (see there).
ACCUMULATION_BOUND = 2.0**-10
BF16_UNIT_ROUNDOFF = 2.0**-8  # round to nearest with 8 significant bits
# Relative (Frobenius) error slack beside twice the baseline's: a quarter of bfloat16's unit
# roundoff, for outputs that bfloat16 happens to hold almost exactly.
REL_ERR_FLOOR = 2.0**-10


def available() -> bool:
    """True where the FP8 kernel runs: compute capability 9.0."""
    return is_hopper()


def check_inputs(a, b, scale_a, scale_b) -> None:
    """Raise TypeError/ValueError naming the bad argument of `scaled_matmul`.

    Metadata only (no device read), the same on CPU and CUDA, so both accept the same inputs.
    """
    for name, t, hint in (("a", a, "(M, K)"), ("b", b, "(N, K)")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != IN_DTYPE:
            raise TypeError(f"{name} must be {IN_DTYPE}, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D {hint}, got shape {tuple(t.shape)}")
    if b.shape[1] != a.shape[1]:
        raise ValueError(
            f"b must be (N, K) with K = a.shape[1] = {a.shape[1]} (C = a b^T), got b of shape "
            f"{tuple(b.shape)}"
        )
    k = a.shape[1]
    if k % K_MULTIPLE:
        raise ValueError(
            f"K = a.shape[1] must be a multiple of {K_MULTIPLE} (the kernel's TMA loads need "
            f"16-byte rows), got {k}; pad a and b with zero columns"
        )
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32 or t.numel() != 1:
            raise TypeError(
                f"{name} must be a float32 tensor of one element (a per-tensor scale), got "
                f"{t.dtype} of shape {tuple(t.shape)}"
            )
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if t.device.type not in DEVICE_TYPES:
            raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
        if t.device != a.device:
            raise ValueError(f"{name} must be on a's device {a.device}, got {t.device}")
    for name, t in (("a", a), ("b", b)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major); call .contiguous() first")
        if t.numel() >= _INT32_LIMIT:
            raise ValueError(f"{name} must have fewer than 2^31 elements, got {t.numel()}")
    m, n = a.shape[0], b.shape[0]
    if m * n >= _INT32_LIMIT:
        raise ValueError(f"the output (M, N) = ({m}, {n}) must have fewer than 2^31 elements")


def new_output(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """An uninitialised (M, N) bfloat16 tensor on a's device."""
    return a.new_empty((a.shape[0], b.shape[0]), dtype=OUT_DTYPE)


def _ext():
    """The GEMM ladder's extension, which holds this kernel and its binding too."""
    return _gemm_ext()


def launch(a, b, scale_a, scale_b, out: torch.Tensor) -> torch.Tensor:
    """Run the kernel on checked CUDA inputs (see `check_inputs`), writing every element of
    `out`, a contiguous (M, N) bfloat16 tensor. The CUDA implementation of the operator.

    Raises CudaUnavailableError off compute capability 9.0.
    """
    if not available():
        raise CudaUnavailableError(
            f"{KERNEL} needs a Hopper GPU (compute capability 9.0); this one is "
            f"{torch.cuda.get_device_capability(a.device)}."
        )
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    # TMA reads from 16-byte aligned addresses: a view at an odd offset is copied (a fresh
    # allocation is aligned).
    a = a if a.data_ptr() % 16 == 0 else a.clone()
    b = b if b.data_ptr() % 16 == 0 else b.clone()
    _ext().fp8gemm(a, b, scale_a, scale_b, out)
    return out


def reference(a, b, scale_a, scale_b) -> torch.Tensor:
    """The kernel's arithmetic in float32 on any device: a b^T from the float8 values (exact in
    float32), times scale_a * scale_b, rounded once to bfloat16. The operator's CPU path."""
    acc = torch.matmul(a.float(), b.float().t())
    return (acc * (scale_a.float().reshape(()) * scale_b.float().reshape(()))).to(OUT_DTYPE)


def error_bound(a, b, scale_a, scale_b, exact: torch.Tensor) -> torch.Tensor:
    """An elementwise bound on |C - exact| for C from this kernel (or any FP8 GEMM with float32
    promotion and bfloat16 output), `exact` the product of the dequantized inputs (float64).

    - bfloat16 rounding of the output: at most 2^-8 |C| (round to nearest, 8 significant bits),
      taken as 2^-8 |exact| (1 + 2^-8) to cover that |C| may exceed |exact|;
    - accumulation: inside a 128-wide k-tile the tensor cores add the 4 instructions' 32-product
      sums with at least 13 significant bits kept (truncation error below 2^-13 of the running
      sum's magnitude, itself at most sum |a_k b_k|): 4 additions, 2^-11, doubled to 2^-10 for
      the products' own alignment inside an instruction; the float32 additions across k-tiles
      add at most (K / 128) 2^-24, below K 2^-24 of sum |a_k b_k|.
    The second term is scale_a scale_b (|a| |b|^T) times (2^-10 + K 2^-24). Returned in float64.
    """
    k = a.shape[1]
    s = scale_a.double().reshape(()) * scale_b.double().reshape(())
    abs_sum = torch.matmul(a.double().abs(), b.double().abs().t()) * s
    rounding = BF16_UNIT_ROUNDOFF * (1 + BF16_UNIT_ROUNDOFF) * exact.abs()
    return rounding + (ACCUMULATION_BOUND + k * 2.0**-24) * abs_sum


def relative_error(x: torch.Tensor, exact: torch.Tensor) -> float:
    """||x - exact||_F / ||exact||_F, in float64."""
    return ((x.double() - exact).norm() / exact.norm().clamp_min(1e-300)).item()


def within_baseline(err: float, baseline_err: float) -> bool:
    """The house rule for a low-precision kernel: its relative error against the exact product
    at most twice that of PyTorch's own kernel in the same dtype (`torch._scaled_mm`), plus
    REL_ERR_FLOOR. Both round the same float32 sums to bfloat16, so their errors are alike; a
    wrong scale, a lost k-tile or a misplaced tile is many times larger."""
    return err <= 2 * baseline_err + REL_ERR_FLOOR


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale as float8 e4m3, scale): per-tensor scaling that maps max |x| to e4m3's largest
    finite value (448), as FP8 training recipes do. scale is a float32 one-element tensor."""
    amax = x.abs().amax().float().clamp_min(1e-12)
    scale = (amax / torch.finfo(IN_DTYPE).max).reshape(1)
    return (x.float() / scale).to(IN_DTYPE), scale


def scaled_matmul(a, b, scale_a, scale_b) -> torch.Tensor:
    """C = (scale_a a) (scale_b b)^T, bfloat16 (M, N), through the operator
    `project01::scaled_matmul`.

    a: (M, K), b: (N, K), both float8_e4m3fn, contiguous, K a multiple of 16; scale_a, scale_b:
    float32 tensors of one element on a's device. CUDA tensors run `fp8gemm_10_wgmma_tma`
    (compute capability 9.0); CPU tensors run the float32 `reference`.

    Raises TypeError/ValueError naming the bad argument; on CUDA tensors CudaUnavailableError
    where the kernel cannot run.
    """
    check_inputs(a, b, scale_a, scale_b)
    from . import ops

    return ops.scaled_matmul(a, b, scale_a, scale_b)
