"""Fused RoPE + KV-cache write: CUDA tensors run `csrc/rope_cache.cu`, CPU tensors the reference.

Same signature and meaning as `reference.rope_and_cache`: q and k are rotated in place, the
rotated k and v land in their cache slots (slot -1: rotated, not written). q, k and v may be
views into a fused qkv projection output (T, (Hq + 2 Hkv) * D): any token stride, heads and dims
contiguous within a token. Only metadata is validated (never values, so a CUDA graph can capture
the call): a bad argument raises ValueError/TypeError naming it. An FP8 cache (float8_e4m3fn)
takes per-KV-head scales `k_scale`, `v_scale` (Hkv,) float32 and stores x / scale rounded to
e4m3 (`kv_quant.py`), on both paths.

Importing this module needs no GPU and no compiler; the extension is built on the first CUDA call.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import reference
from .kv_quant import check_kv_cache
from .pdl import pdl_enabled

CSRC = Path(__file__).resolve().parent.parent / "csrc"
EXTENSION = "p04_rope_cache"
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _ext():
    from shared.cuda_build import load_extension

    return load_extension(EXTENSION, CSRC, ("rope_cache.cu",))


def _check_tensor(name: str, x, ndim: int, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(x.shape)}")


def check_rope_inputs(
    q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None
) -> None:
    """Validate metadata only (never values): raise ValueError/TypeError naming the argument."""
    _check_tensor("q", q, 3, "(T, Hq, D)")
    _check_tensor("k", k, 3, "(T, Hkv, D)")
    _check_tensor("v", v, 3, "(T, Hkv, D)")
    _check_tensor("positions", positions, 1, "(T,)")
    _check_tensor("cos_sin", cos_sin, 2, "(max_positions, D)")
    _check_tensor("k_cache", k_cache, 4, "(num_blocks, block_size, Hkv, D)")
    _check_tensor("v_cache", v_cache, 4, "(num_blocks, block_size, Hkv, D)")
    _check_tensor("slot_mapping", slot_mapping, 1, "(T,)")
    named = (
        ("k", k),
        ("v", v),
        ("positions", positions),
        ("cos_sin", cos_sin),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("slot_mapping", slot_mapping),
    )
    for name, x in named:
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must be a floating-point tensor, got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
    for name, x in (("positions", positions), ("slot_mapping", slot_mapping)):
        if x.dtype != torch.int64:
            raise TypeError(f"{name} must be torch.int64, got {x.dtype}")
    if cos_sin.dtype != torch.float32:
        raise TypeError(f"cos_sin must be torch.float32, got {cos_sin.dtype}")
    t, _, d = q.shape
    if d % 2:
        raise ValueError(f"q's head dim must be even (rotate-half pairs), got {d}")
    if k.shape[0] != t or k.shape[2] != d:
        raise ValueError(f"k must be (T={t}, Hkv, D={d}), got {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    for name, x in (("positions", positions), ("slot_mapping", slot_mapping)):
        if x.shape[0] != t:
            raise ValueError(f"{name} must have q's {t} tokens, got {x.shape[0]}")
    if cos_sin.shape[1] != d:
        raise ValueError(f"cos_sin must be (max_positions, D={d}), got {tuple(cos_sin.shape)}")
    hkv = k.shape[1]
    if k_cache.shape[2] != hkv or k_cache.shape[3] != d:
        raise ValueError(
            f"k_cache must be (num_blocks, block_size, Hkv={hkv}, D={d}), "
            f"got {tuple(k_cache.shape)}"
        )
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}"
        )
    check_kv_cache(q, k_cache, v_cache, k_scale, v_scale)
    if q.device.type != "cuda":
        return
    # What the CUDA kernel needs on top of the reference's contract: 16-byte loads of x1 and x2.
    vec = 16 // q.element_size()  # elements per 16-byte load
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"q must be bfloat16, float16 or float32 on CUDA, got {q.dtype}")
    if d % (2 * vec):
        raise ValueError(f"q's head dim must be a multiple of {2 * vec} for {q.dtype}, got {d}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(
                f"{name} must be contiguous within a token (strides (any, {d}, 1)), "
                f"got {tuple(x.stride())}"
            )
        if x.stride(0) % vec or x.data_ptr() % 16:
            raise ValueError(
                f"{name} must start 16-byte aligned with a token stride that is a multiple of "
                f"{vec} elements, got stride {x.stride(0)} at offset {x.data_ptr() % 16} bytes"
            )
    for name, x in (("cos_sin", cos_sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous; call .contiguous() on it")
        if x.data_ptr() % 16:
            raise ValueError(f"{name} must start 16-byte aligned, got offset {x.data_ptr() % 16}")
    if not positions.is_contiguous() or not slot_mapping.is_contiguous():
        raise ValueError("positions and slot_mapping must be contiguous")


def rope_and_cache(
    q: torch.Tensor,  # (T, Hq, D), rotated in place
    k: torch.Tensor,  # (T, Hkv, D), rotated in place
    v: torch.Tensor,  # (T, Hkv, D)
    positions: torch.Tensor,  # (T,) int64 position of each token in its sequence
    cos_sin: torch.Tensor,  # (max_positions, D) float32, from rope_cos_sin_cache
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; -1 = a padding token, not written
    k_scale: torch.Tensor | None = None,  # (Hkv,) float32: an FP8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> None:
    """Apply RoPE to q and k in place and write the rotated k and v into their cache slots.

    On CUDA, positions must lie in [0, max_positions) and slots below num_blocks * block_size:
    they are read on the device only, so they are not checked."""
    args = (q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    check_rope_inputs(*args)
    if q.device.type != "cuda":
        reference.rope_and_cache(*args)
        return
    _ext().rope_and_cache(*args, pdl_enabled(q.device))
