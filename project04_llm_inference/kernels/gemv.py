"""Projections of a decode step of a few tokens (csrc/gemv.cu), with RMSNorm and SwiGLU folded in.

`linear(x, w)` is `F.linear` and `norm_linear(...)` is the RMSNorm, the projection and (for the
MLP) silu-and-mul in sequence, or (for the attention, `rope=RopeWrite(...)`) RoPE and the KV-cache
write after the QKV projection; on a CUDA device, for at most `GEMV_MAX_TOKENS` tokens of a
16-bit dtype, each is one launch of the GEMV kernel instead of cuBLAS plus the other kernels
(from three tokens up to `MMA_MAX_TOKENS`, on sm_80 and newer, its tensor-core variant). Every
other case (CPU tensors, prefill, large batches, odd sizes) takes the composed path, so the CPU
engine computes exactly what it computed before these kernels existed. An FP8 KV cache is
written by `rope_and_cache` after the projection (the GEMV kernel's fused cache write stores the
model dtype only).

An FP8 weight (`fp8.Fp8Weight`: e4m3 (N, K), one float32 scale per row) takes the kernel's FP8
variant for one and two tokens (`GEMV_MAX_TOKENS`) of a 16-bit dtype on a GPU of compute
capability >= 8.9, with K a multiple of 16 (any N): the same folds, half the weight bytes, the
activations kept in their 16-bit dtype (weight-only, W8A16: no activation quantization error).
The tensor-core variant reads 16-bit weights only, so from three tokens on an FP8 projection
takes the composed path, `fp8.fp8_linear` (`torch._scaled_mm` W8A8 where it applies, else the
dequantizing reference, which is also the CPU path). `fp8_route` says which path a shape takes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .fp8 import MIN_FP8_CAPABILITY, SCALED_MM_ALIGN, Fp8Weight, fp8_linear
from .kv_quant import is_fp8
from .norm_act import fused_add_rms_norm, rms_norm, silu_and_mul
from .pdl import pdl_enabled
from .rope_cache import check_rope_inputs, rope_and_cache

CSRC = Path(__file__).resolve().parent.parent / "csrc"

# The most tokens the kernel takes: against cuBLAS plus the separate norm and activation kernels
# it wins or ties at one and two tokens (`gemv-kernel`: gemv_kernel.json), and a build for up to 8
# rows lost from four on (gemv_kernel_rows_1_to_8.json), so larger steps go elsewhere.
GEMV_MAX_TOKENS = 2
# The tensor-core variant (gemv_mma_kernel: mma.sync with the weight as the A operand and up to
# eight staged rows as B, so a weight chunk costs a few mma instead of converting every row) takes
# 3..MMA_MAX_TOKENS tokens on sm_80 and newer (0: off, steps of 3-8 tokens go to cuBLAS). A chain
# of 16 layers with it beats the cuBLAS path at 4 and 8 tokens, though single plain projections
# can trail it (gemv_kernel_mma.json: gemv-kernel --mma-max-tokens 8 --tokens 3 4 5 6 7 8
# --chain-tokens 4 8).
MMA_MAX_TOKENS = 8
MMA_KERNEL_MAX_TOKENS = 8  # the most rows the tensor-core kernel stages (B's eight columns)
CTAS_PER_SM = 4  # the grid's bound; warps loop over the remaining rows
# Every CTA stages its input rows in shared memory: beyond this bound (two rows of K > 40,960)
# cuBLAS takes the product.
MAX_STAGED_BYTES = 160 * 1024
# The tensor-core kernel's bound (eight rows of K > 9,216): it pads each row by 64 bytes and adds
# 8.25 KB of static shared memory, 153 KB at most, within an A100's 163 KB a CTA (sm_90: 227).
# Llama-3.2-1B's widest input (K = 8,192) needs 137 KB at eight tokens.
MMA_MAX_STAGED_BYTES = 144 * 1024

_GEMV_DTYPES = (torch.bfloat16, torch.float16)
# FP8 weights: the kernel's e4m3 variant for up to GEMV_MAX_TOKENS tokens (False: every FP8
# projection takes fp8.fp8_linear, as before the variant existed; the benchmarks compare both).
FP8_GEMV = True
# A 16-byte load holds 16 e4m3 weights, and each row must start on a 16-byte boundary.
FP8_GEMV_K_ALIGN = 16


class RopeWrite(NamedTuple):
    """What follows a fused QKV projection: `rope_cache.rope_and_cache`'s arguments besides q,
    k and v, which are the projection's output split by heads (q, then k, then v)."""

    n_heads: int
    n_kv_heads: int
    positions: torch.Tensor  # (T,) int64
    cos_sin: torch.Tensor  # (max_positions, D) float32
    k_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # (T,) int64; -1: not written
    k_scale: torch.Tensor | None = None  # (Hkv,) float32: an FP8 cache's scales
    v_scale: torch.Tensor | None = None


def qkv_views(qkv: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int):
    """q (T, Hq, D), k and v (T, Hkv, D): views into a fused (T, (Hq + 2 Hkv) D) projection."""
    t, q_size, kv_size = qkv.shape[0], n_heads * head_dim, n_kv_heads * head_dim
    return (
        qkv[:, :q_size].view(t, n_heads, head_dim),
        qkv[:, q_size : q_size + kv_size].view(t, n_kv_heads, head_dim),
        qkv[:, q_size + kv_size :].view(t, n_kv_heads, head_dim),
    )


@functools.cache
def _ext():
    from shared.cuda_build import load_extension

    return load_extension("p04_gemv", CSRC, ("gemv.cu", "gemv_binding.cpp"))


@functools.cache
def _max_ctas(device_index: int) -> int:
    return CTAS_PER_SM * torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def max_tokens(capability: tuple[int, int]) -> int:
    """The most tokens one launch takes on a device of this compute capability: `GEMV_MAX_TOKENS`,
    or `MMA_MAX_TOKENS` where the tensor-core variant is enabled and the device has mma (sm_80)."""
    if MMA_MAX_TOKENS == 0:
        return GEMV_MAX_TOKENS
    if not GEMV_MAX_TOKENS < MMA_MAX_TOKENS <= MMA_KERNEL_MAX_TOKENS:
        raise ValueError(
            f"MMA_MAX_TOKENS must be 0 (off) or in {GEMV_MAX_TOKENS + 1}..{MMA_KERNEL_MAX_TOKENS}, "
            f"got {MMA_MAX_TOKENS}"
        )
    return MMA_MAX_TOKENS if tuple(capability) >= (8, 0) else GEMV_MAX_TOKENS


def _check_matrix(name: str, t: torch.Tensor, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")


def _fits(*tensors: torch.Tensor) -> bool:
    """Whether the kernel can take these tensors (else the composed PyTorch path runs)."""
    x = tensors[0]
    if x.device.type != "cuda" or x.shape[0] <= 0:
        return False
    if x.shape[0] > GEMV_MAX_TOKENS and x.shape[0] > max_tokens(_capability(x.device.index or 0)):
        return False
    if x.dtype not in _GEMV_DTYPES or x.shape[-1] % 8:
        return False
    bound = MAX_STAGED_BYTES if x.shape[0] <= GEMV_MAX_TOKENS else MMA_MAX_STAGED_BYTES
    if x.shape[0] * x.shape[-1] * x.element_size() > bound:
        return False
    return all(t.dtype == x.dtype and t.is_contiguous() and t.data_ptr() % 16 == 0 for t in tensors)


def fp8_route(
    tokens: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device_type: str,
    capability: tuple[int, int] = (0, 0),
) -> str:
    """The path a projection of (tokens, k) activations of `dtype` onto an (n, k) `Fp8Weight`
    takes (`linear` and `norm_linear`): 'gemv' (the kernel's FP8 variant, W8A16), 'scaled_mm'
    (`torch._scaled_mm`, W8A8) or 'reference' (the dequantizing reference: the CPU, GPUs below
    compute capability 8.9, and shapes `_scaled_mm` does not take). `capability` is the CUDA
    device's; tensors that are not contiguous or 16-byte aligned leave the kernel too."""
    if device_type != "cuda" or tuple(capability) < MIN_FP8_CAPABILITY or tokens <= 0:
        return "reference"
    if (
        FP8_GEMV
        and tokens <= GEMV_MAX_TOKENS
        and dtype in _GEMV_DTYPES
        and k % FP8_GEMV_K_ALIGN == 0
        and tokens * k * torch.finfo(dtype).bits // 8 <= MAX_STAGED_BYTES
    ):
        return "gemv"
    if n % SCALED_MM_ALIGN == 0 and k % SCALED_MM_ALIGN == 0:
        return "scaled_mm"
    return "reference"


def _fits_fp8(w: Fp8Weight, *tensors: torch.Tensor) -> bool:
    """Whether the kernel's FP8 variant takes w and these activations (x first)."""
    x = tensors[0]
    if x.device.type != "cuda" or x.dim() != 2 or x.shape[1] != w.shape[1]:
        return False
    route = fp8_route(x.shape[0], *w.shape, x.dtype, "cuda", _capability(x.device.index or 0))
    if route != "gemv":
        return False
    q, s = w.qweight, w.scale
    if q.device != x.device or s.device != x.device or q.data_ptr() % 16:
        return False
    return all(t.dtype == x.dtype and t.is_contiguous() and t.data_ptr() % 16 == 0 for t in tensors)


def gemv_applies(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> bool:
    """Whether `linear(x, weight)` runs the GEMV kernel (the rest goes to cuBLAS, or for an
    `Fp8Weight` to `fp8.fp8_linear`)."""
    if isinstance(weight, Fp8Weight):
        return _fits_fp8(weight, x)
    return _fits(x, weight)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(T, K) @ (N, K)^T -> (T, N) in x's dtype, float32 accumulation. An `Fp8Weight`'s rows
    are multiplied by their scales after the accumulation (see `fp8_route` for its path)."""
    scale = None
    if isinstance(weight, Fp8Weight):
        if not isinstance(x, torch.Tensor) or not _fits_fp8(weight, x):
            return fp8_linear(x, weight)
        weight, scale = weight.qweight, weight.scale
    else:
        _check_matrix("x", x, 2)
        _check_matrix("weight", weight, 2)
        if x.shape[1] != weight.shape[1]:
            raise ValueError(f"x (T, {x.shape[1]}) and weight {tuple(weight.shape)} differ in K")
        if not _fits(x, weight):
            return F.linear(x, weight)
    out = x.new_empty(x.shape[0], weight.shape[0])
    dev = x.device.index or 0
    _ext().gemv(
        out,
        x,
        weight,
        None,
        None,
        None,
        False,
        0.0,
        _max_ctas(dev),
        pdl_enabled(x.device),
        None,
        None,
        None,
        None,
        None,
        0,
        0,
        scale,
    )
    return out


def norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    silu_mul: bool = False,
    rope: RopeWrite | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm, projection, and optionally SwiGLU or RoPE: returns (out, the residual stream).

    h = x + residual (rounded to x's dtype), or h = x when residual is None (the first layer);
    out = rms_norm(h) * norm_weight @ weight^T, and with silu_mul the (T, 2F) product becomes
    silu(gate) * up, (T, F). With `rope` the product is a fused QKV projection and then
    `rope_and_cache` runs on its q, k and v (`qkv_views`): q and k rotated in out, k and v
    written to the cache; on the GEMV path in the same launch, bit for bit the same. The
    returned residual stream is h. On the composed path x and residual are updated in place (as
    `fused_add_rms_norm` does): use only what is returned.
    """
    _check_matrix("x", x, 2)
    fp8 = isinstance(weight, Fp8Weight)
    if not fp8:
        _check_matrix("weight", weight, 2)
    k = x.shape[1]
    if weight.shape[1] != k or norm_weight.shape != (k,):
        raise ValueError(
            f"x (T, {k}) needs norm_weight ({k},) and weight (N, {k}), got "
            f"{tuple(norm_weight.shape)} and {tuple(weight.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs "
            f"{tuple(x.shape)} {x.dtype}"
        )
    if silu_mul and weight.shape[0] % 2:
        raise ValueError(f"silu_mul needs an even number of weight rows, got {weight.shape[0]}")
    views = None
    if rope is not None:
        if silu_mul:
            raise ValueError("rope and silu_mul exclude each other (QKV vs MLP projection)")
        d = rope.cos_sin.shape[-1] if isinstance(rope.cos_sin, torch.Tensor) else 0
        if d <= 0 or weight.shape[0] != (rope.n_heads + 2 * rope.n_kv_heads) * d:
            raise ValueError(
                f"rope: weight {tuple(weight.shape)} is not a fused QKV projection of "
                f"{rope.n_heads} + 2 x {rope.n_kv_heads} heads of cos_sin's head dim {d}"
            )
    if rope is not None and is_fp8(rope.k_cache):
        # the projection (GEMV or cuBLAS), then RoPE and the quantizing cache write
        out, residual = norm_linear(x, residual, norm_weight, weight, eps)
        rope_and_cache(*qkv_views(out, rope.n_heads, rope.n_kv_heads, d), *rope[2:])
        return out, residual
    parts = (x, norm_weight) if residual is None else (x, residual, norm_weight)
    if not (_fits_fp8(weight, *parts) if fp8 else _fits(*parts, weight)):
        if residual is None:
            h, residual = rms_norm(x, norm_weight, eps), x
        else:
            h, residual = fused_add_rms_norm(x, residual, norm_weight, eps)
        out = fp8_linear(h, weight) if fp8 else F.linear(h, weight)
        if rope is not None:
            q, k, v = qkv_views(out, rope.n_heads, rope.n_kv_heads, d)
            rope_and_cache(q, k, v, *rope[2:])
        return (silu_and_mul(out) if silu_mul else out), residual
    n_out = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = x.new_empty(x.shape[0], n_out)
    if rope is not None:
        views = qkv_views(out, rope.n_heads, rope.n_kv_heads, d)
        check_rope_inputs(*views, *rope[2:])  # metadata only: out is not written yet
    res_out = None if residual is None else torch.empty_like(x)
    dev = x.device.index or 0
    _ext().gemv(
        out,
        x,
        weight.qweight if fp8 else weight,
        residual,
        res_out,
        norm_weight,
        silu_mul,
        float(eps),
        _max_ctas(dev),
        pdl_enabled(x.device),
        *(
            (None,) * 5 + (0, 0)
            if rope is None
            else (rope.cos_sin, rope.positions, rope.slot_mapping, rope.k_cache, rope.v_cache)
            + (rope.n_heads, rope.n_kv_heads)
        ),
        weight.scale if fp8 else None,
    )
    return out, (x if residual is None else res_out)
