"""The matmul optimisation ladder: `matmul(a, b, kernel=...)` over the CUDA kernels in csrc/gemm/.

Each ladder step is one kernel file; `GEMM_KERNELS` lists them in order:

- float32 on CUDA cores: naive, coalesced, shared-memory tiling, 1D and 2D register blocking,
  128-bit vectorised loads, warp tiling with double buffering;
- bfloat16/float16 on tensor cores with float32 accumulation: mma.sync + ldmatrix + cp.async,
  then (Hopper, compute capability 9.0 only) TMA + wgmma, warp-specialised and persistent.

Inputs: row-major contiguous tensors, (M, K) @ (K, N), any M, N, K. `matmul` runs through the
operators `project01::matmul` and `project01::matmul_out` (ops.py), so torch.compile sees one
operator: on CUDA tensors one kernel of the ladder, on CPU tensors a float32 reference (slow; for
machines without a GPU). The extension is built on first use (see `_build.py`); importing this
module needs no GPU and no compiler.
"""

from __future__ import annotations

import torch

from ._build import CudaUnavailableError, is_hopper, load_extension

GEMM_KERNELS: tuple[str, ...] = (
    "sgemm_01_naive",
    "sgemm_02_coalesced",
    "sgemm_03_smem_tiling",
    "sgemm_04_1d_blocktiling",
    "sgemm_05_2d_blocktiling",
    "sgemm_06_vectorized",
    "sgemm_07_warptiling",
    "hgemm_08_mma_sync",
    "hgemm_09_wgmma_tma",
)

FLOAT32_KERNELS = tuple(k for k in GEMM_KERNELS if k.startswith("sgemm_"))
TENSOR_CORE_KERNELS = tuple(k for k in GEMM_KERNELS if k.startswith("hgemm_"))
HOPPER_ONLY_KERNELS = ("hgemm_09_wgmma_tma",)
HALF_DTYPES = (torch.bfloat16, torch.float16)
DEVICE_TYPES = ("cpu", "cuda")  # CUDA: the kernels; CPU: the operator's reference (ops.py)

# One line per step: what it changes from the step before (used by the benchmark and report).
KERNEL_NOTES: dict[str, str] = {
    "sgemm_01_naive": "one thread per output, threads walk down columns (uncoalesced A reads)",
    "sgemm_02_coalesced": "threads walk along rows: coalesced B reads and C writes",
    "sgemm_03_smem_tiling": "32x32 tiles of A and B staged in shared memory",
    "sgemm_04_1d_blocktiling": "8 outputs per thread (a column strip), B value reused from a register",
    "sgemm_05_2d_blocktiling": "8x8 outputs per thread, outer product from registers",
    "sgemm_06_vectorized": "128-bit global and shared loads, A transposed in shared memory",
    "sgemm_07_warptiling": "warp tiles, conflict-free LDS.128, double-buffered shared memory",
    "hgemm_08_mma_sync": "tensor cores: mma.sync m16n8k16, ldmatrix, 4-stage cp.async, swizzle",
    "hgemm_09_wgmma_tma": "Hopper: TMA, wgmma 64x256x16, warp-specialised, persistent",
}

_EXTENSION = "p01_gemm"
_SOURCES = (
    "gemm/binding.cpp",
    "gemm/sgemm_01_naive.cu",
    "gemm/sgemm_02_coalesced.cu",
    "gemm/sgemm_03_smem_tiling.cu",
    "gemm/sgemm_04_1d_blocktiling.cu",
    "gemm/sgemm_05_2d_blocktiling.cu",
    "gemm/sgemm_06_vectorized.cu",
    "gemm/sgemm_07_warptiling.cu",
    "gemm/hgemm_08_mma_sync.cu",
    "gemm/hgemm_09_wgmma_tma.cu",
    "gemm/fp8gemm_10_wgmma_tma.cu",  # step 10, FP8 (fp8_gemm.py), in the same extension
)
_INT32_LIMIT = 2**31  # the kernels index with 32-bit ints


def _ext():
    return load_extension(_EXTENSION, _SOURCES)


def step_of(kernel: str) -> int:
    """The ladder step number of a kernel name ('sgemm_07_warptiling' -> 7)."""
    return int(kernel.split("_")[1])


def kernel_dtypes(kernel: str) -> tuple[torch.dtype, ...]:
    """The input dtypes a kernel takes."""
    _check_kernel_name(kernel)
    return (torch.float32,) if kernel in FLOAT32_KERNELS else HALF_DTYPES


def available_kernels(dtype: torch.dtype | None = None) -> tuple[str, ...]:
    """The ladder kernels that can run on this machine's GPU (optionally for one dtype).

    The Hopper kernels are offered only on compute capability 9.0.
    """
    hopper = is_hopper()
    out = tuple(k for k in GEMM_KERNELS if hopper or k not in HOPPER_ONLY_KERNELS)
    if dtype is not None:
        out = tuple(k for k in out if dtype in kernel_dtypes(k))
    return out


def default_kernel(dtype: torch.dtype) -> str:
    """What kernel="auto" picks: the top step of the ladder that runs here for `dtype`."""
    candidates = available_kernels(dtype)
    if not candidates:
        raise TypeError(f"no ladder kernel takes dtype {dtype}")
    return candidates[-1]


def _check_kernel_name(kernel: object) -> None:
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str, got {type(kernel).__name__}")
    if kernel not in GEMM_KERNELS:
        raise ValueError(f"kernel must be 'auto' or one of {GEMM_KERNELS}, got {kernel!r}")


def _check_matrix(name: str, t: object, shape_hint: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D {shape_hint}, got shape {tuple(t.shape)}")


def _validate(a, b, kernel: str, out) -> None:
    """Check the arguments of `matmul`; raise TypeError/ValueError naming the bad one.

    Every check runs on tensor metadata alone and is the same for CPU and CUDA tensors, so both
    devices accept the same inputs. Which concrete kernel runs is decided on CUDA, at launch
    (`resolve_kernel`).
    """
    _check_matrix("a", a, "(M, K)")
    _check_matrix("b", b, "(K, N)")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"b must be (K, N) with K = a.shape[1] = {a.shape[1]}, got b of shape {tuple(b.shape)}"
        )
    if b.dtype != a.dtype:
        raise TypeError(f"b must have a's dtype {a.dtype}, got {b.dtype}")
    if kernel == "auto":
        if a.dtype != torch.float32 and a.dtype not in HALF_DTYPES:
            raise TypeError(f"a must be float32, bfloat16 or float16, got {a.dtype}")
    else:
        _check_kernel_name(kernel)
        if a.dtype not in kernel_dtypes(kernel):
            wanted = " or ".join(str(d) for d in kernel_dtypes(kernel))
            raise TypeError(f"a must be {wanted} for kernel {kernel!r}, got {a.dtype}")
    for name, t in (("a", a), ("b", b)):
        if t.device.type not in DEVICE_TYPES:
            raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (row-major); call .contiguous() first")
        if t.numel() >= _INT32_LIMIT:
            raise ValueError(f"{name} must have fewer than 2^31 elements, got {t.numel()}")
    if b.device != a.device:
        raise ValueError(f"b must be on a's device {a.device}, got {b.device}")
    m, n = a.shape[0], b.shape[1]
    if m * n >= _INT32_LIMIT:
        raise ValueError(f"the output (M, N) = ({m}, {n}) must have fewer than 2^31 elements")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
        if tuple(out.shape) != (m, n) or out.dtype != a.dtype or out.device != a.device:
            raise ValueError(
                f"out must be a ({m}, {n}) {a.dtype} tensor on {a.device}, got "
                f"{tuple(out.shape)} {out.dtype} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError("out must be contiguous (row-major)")


def resolve_kernel(kernel: str, a: torch.Tensor) -> str:
    """The concrete CUDA kernel for a checked `kernel` argument and input `a` ("auto":
    `default_kernel` for a's dtype).

    Raises CudaUnavailableError for a Hopper-only kernel on a GPU that is not compute
    capability 9.0.
    """
    if kernel == "auto":
        return default_kernel(a.dtype)
    if kernel in HOPPER_ONLY_KERNELS and not is_hopper():
        raise CudaUnavailableError(
            f"kernel {kernel!r} needs a Hopper GPU (compute capability 9.0); this one is "
            f"{torch.cuda.get_device_capability(a.device)}."
        )
    return kernel


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _round_up(x: int, to: int) -> int:
    return (x + to - 1) // to * to


def _wgmma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Step 9 needs 16-byte aligned rows (K % 8 == 0, N % 8 == 0) for TMA; other shapes are
    zero-padded into aligned copies (extra traffic, which the benchmark's aligned shapes avoid)."""
    m, k = a.shape
    n = b.shape[1]
    kp, np_ = _round_up(k, 8), _round_up(n, 8)
    if kp != k or not _aligned(a):
        a = torch.nn.functional.pad(a, (0, kp - k)).contiguous()
    if kp != k or np_ != n or not _aligned(b):
        b = torch.nn.functional.pad(b, (0, np_ - n, 0, kp - k)).contiguous()
    if np_ == n and _aligned(out):
        _ext().hgemm(9, a, b, out)
        return out
    tmp = torch.empty((m, np_), dtype=out.dtype, device=out.device)
    _ext().hgemm(9, a, b, tmp)
    out.copy_(tmp[:, :n])
    return out


def launch(a: torch.Tensor, b: torch.Tensor, kernel: str, out: torch.Tensor) -> torch.Tensor:
    """Run one ladder kernel on checked CUDA inputs (see `_validate`), writing every element of
    `out`; `kernel` may be "auto". The CUDA implementation of the `project01::matmul*` ops."""
    kernel = resolve_kernel(kernel, a)
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    step = step_of(kernel)
    if kernel in FLOAT32_KERNELS:
        _ext().sgemm(step, a, b, out)
    elif kernel in HOPPER_ONLY_KERNELS:
        _wgmma(a, b, out)
    else:
        _ext().hgemm(step, a, b, out)
    return out


def matmul(
    a: torch.Tensor, b: torch.Tensor, *, kernel: str = "auto", out: torch.Tensor | None = None
) -> torch.Tensor:
    """C = a @ b with one kernel of the ladder, through the operator `project01::matmul`
    (`project01::matmul_out` when `out` is given).

    a: (M, K), b: (K, N), both row-major contiguous on one device; float32 for the sgemm_*
    kernels, bfloat16 or float16 for the hgemm_* kernels (float32 accumulation, output in the
    input dtype). kernel: a name from GEMM_KERNELS, or "auto" for the top step that runs here.
    out: optional (M, N) tensor to write into (every element is overwritten).

    CUDA tensors run the chosen kernel. CPU tensors run the operator's CPU implementation, a
    float32-accumulation reference (`torch.matmul` in float32, rounded to the input dtype) that
    is slow and ignores the kernel choice once the name and dtype have been checked: it is there
    so the operator (schema, fake tensors, autograd, torch.compile) works and is tested on
    machines without a GPU. Differentiable without `out` (the backward is two products through
    the same operator and kernel); `out=` does not support autograd, like torch's own out=.

    Raises TypeError/ValueError naming the bad argument; on CUDA tensors, CudaUnavailableError
    when the kernels cannot run here (no nvcc, or a Hopper kernel on another GPU).
    """
    _validate(a, b, kernel, out)
    from . import ops

    if out is None:
        return ops.matmul(a, b, kernel)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise RuntimeError(
            "matmul(out=...) does not support autograd, but a or b requires grad "
            "(call it without out=, or under torch.no_grad())"
        )
    ops.matmul_out(a, b, kernel, out)
    return out
