"""Metal kernels launched through `mx.fast.metal_kernel`: a matmul ladder and fused attention.

They mirror project01's CUDA ladder on Apple GPUs (sources in `apple_track/metal/`, one step a
file):

    matmul_01_naive             one thread per output, operands from device memory
    matmul_02_threadgroup_tiled 16 x 16 tiles in threadgroup memory (CUDA's shared memory)
    matmul_03_simdgroup         8 x 8 simdgroup matrices (CUDA's warp mma), 32 x 32 block tiles
    attention_01_flash          online-softmax attention, K/V blocks in threadgroup memory

Inputs are MLX arrays; arguments are checked before anything is launched, so a wrong dtype,
rank or shape is a ValueError/TypeError naming the argument on any machine. Launching needs
Metal (macOS on Apple silicon): elsewhere `MetalUnavailableError` says so.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import mlx.core as mx

KERNEL_DIR = Path(__file__).resolve().parent / "metal"
MATMUL_KERNELS = ("naive", "threadgroup_tiled", "simdgroup")
_MATMUL_FILES = {
    "naive": "matmul_01_naive.metal",
    "threadgroup_tiled": "matmul_02_threadgroup_tiled.metal",
    "simdgroup": "matmul_03_simdgroup.metal",
}
_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
_HEADER = "#include <metal_simdgroup_matrix>\n"


class MetalUnavailableError(RuntimeError):
    """Raised when a kernel is launched where MLX has no Metal device."""


def metal_available() -> bool:
    try:
        return bool(mx.metal.is_available())
    except Exception:  # an MLX build without the Metal backend at all
        return False


def _require_metal() -> None:
    if not metal_available():
        raise MetalUnavailableError(
            "Metal is not available here (MLX runs on the CPU): the Metal kernels need macOS "
            "on Apple silicon"
        )


def kernel_source(filename: str) -> str:
    path = KERNEL_DIR / filename
    if not path.exists():
        raise FileNotFoundError(f"Metal source {filename} not found in {KERNEL_DIR}")
    return path.read_text()


@functools.cache
def _compiled(filename: str, input_names: tuple[str, ...], output_names: tuple[str, ...]):
    return mx.fast.metal_kernel(
        name=Path(filename).stem,
        input_names=list(input_names),
        output_names=list(output_names),
        source=kernel_source(filename),
        header=_HEADER,
    )


def _check_array(name: str, x, ndim: int) -> None:
    if not isinstance(x, mx.array):
        raise TypeError(f"{name} must be an mlx.core.array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def _ceil_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def matmul(a: mx.array, b: mx.array, *, kernel: str = "simdgroup") -> mx.array:
    """(M, K) @ (K, N) -> (M, N) in a's dtype, float32 accumulation; any M, N, K >= 1."""
    if kernel not in MATMUL_KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(MATMUL_KERNELS)}")
    _check_array("a", a, 2)
    _check_array("b", b, 2)
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if min(M, N, K) < 1:
        raise ValueError(f"empty matrices are not supported: a {tuple(a.shape)}, b {b.shape}")
    _require_metal()
    if kernel == "naive":
        grid, group = (N, M, 1), (16, 16, 1)
    elif kernel == "threadgroup_tiled":
        grid, group = (_ceil_to(N, 16), _ceil_to(M, 16), 1), (16, 16, 1)
    else:  # simdgroup: one 128-thread group per 32 x 32 tile of c
        grid, group = (_ceil_to(N, 32) // 32 * 128, _ceil_to(M, 32) // 32, 1), (128, 1, 1)
    (c,) = _compiled(_MATMUL_FILES[kernel], ("a", "b"), ("c",))(
        inputs=[a, b],
        template=[("T", a.dtype)],
        grid=grid,
        threadgroup=group,
        output_shapes=[(M, N)],
        output_dtypes=[a.dtype],
    )
    return c


ATTENTION_BQ = 32  # query rows per threadgroup (one thread each)


def attention(
    q: mx.array, k: mx.array, v: mx.array, *, causal: bool = False, scale: float | None = None
) -> mx.array:
    """softmax(scale q k^T) v with the layout of SDPA: q (B, H, S_q, D), k/v (B, H, S_k, D).

    D: a multiple of 8 from 8 to 128. causal: top-left aligned, so S_q must equal S_k.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x, 4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, Sq, D = q.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape, got {k.shape} and {v.shape}")
    if tuple(k.shape[:2]) != (B, H) or k.shape[3] != D:
        raise ValueError(f"k must be (B={B}, H={H}, S_k, D={D}) to match q, got {tuple(k.shape)}")
    if D % 8 or not 8 <= D <= 128:
        raise ValueError(f"head dim D must be a multiple of 8 in [8, 128], got {D}")
    Sk = k.shape[2]
    if min(B, H, Sq, Sk) < 1:
        raise ValueError(f"empty inputs are not supported: q {q.shape}, k {k.shape}")
    if causal and Sq != Sk:
        raise ValueError(f"causal attention needs S_q == S_k, got {Sq} and {Sk}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    _require_metal()
    bkv = min(32, 2048 // D)  # K and V blocks: 2 * bkv * D * 4 bytes <= 16 KiB of threadgroup
    (o,) = _compiled("attention_01_flash.metal", ("q", "k", "v", "scale"), ("o",))(
        inputs=[q, k, v, mx.array([scale], dtype=mx.float32)],
        template=[
            ("T", q.dtype),
            ("D", D),
            ("BQ", ATTENTION_BQ),
            ("BKV", bkv),
            ("CAUSAL", bool(causal)),
        ],
        grid=(_ceil_to(Sq, ATTENTION_BQ), B * H, 1),
        threadgroup=(ATTENTION_BQ, 1, 1),
        output_shapes=[(B, H, Sq, D)],
        output_dtypes=[q.dtype],
    )
    return o


def metal_attention_fn(q, k, v, causal: bool = True):
    """`attention` with the attn_fn signature of the models (for MLXTransformer(attn_fn=...))."""
    return attention(q, k, v, causal=causal)
