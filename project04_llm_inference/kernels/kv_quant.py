"""The FP8 KV cache's number format: what the cache write stores and what the attention reads.

A cache may hold the model's dtype, or float8_e4m3fn with one float32 scale per KV head (per
layer: each layer has its own `k_scale`, `v_scale` of shape (Hkv,)). The write stores
round_e4m3(clamp(x / scale, -448, 448)) computed in float32 (x: the rotated k, or v, already
rounded to the model dtype); the read uses q_e4m3 * scale in float32. Rounding to e4m3 errs by
at most 2^-4 of |x / scale| where that is in e4m3's normal range (>= 2^-6), and by at most
2^-10 (half the subnormal step) below it, so the stored value is within
max(2^-4 |x|, 2^-10 scale) of x; beyond 448 * scale it saturates to +-448 * scale.

The CUDA kernels fold the scales out of their inner loops (one KV head per CTA): the scores are
scaled once by k_scale (q . (s k) = s (q . k)), the output once by v_scale, and the e4m3 values
converted to the 16-bit dtype exactly (every e4m3 value is a bfloat16 and a float16 value).
"""

from __future__ import annotations

import torch

from .fp8 import FP8_DTYPE, FP8_MAX


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(..., Hkv, D) -> the same shape in e4m3: x / scale[h], saturated to +-448, rounded."""
    return (x.float() / scale.float()[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_kv(c: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A cache slice (..., Hkv, D) as float32: e4m3 values times their head's scale; a cache in
    the model dtype as it is."""
    if not is_fp8(c):
        return c.float()
    return c.float() * scale.float()[:, None]


def check_kv_cache(q, k_cache, v_cache, k_scale, v_scale) -> bool:
    """Validate the caches' dtype against q's and, for an FP8 cache, its scales (metadata only,
    never values). Returns whether the cache is FP8. Raises TypeError/ValueError naming the
    argument. Scales given with a cache in the model dtype are ignored."""
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dtype not in (q.dtype, FP8_DTYPE):
            raise TypeError(
                f"{name} must have q's dtype {q.dtype} (or {FP8_DTYPE}, an FP8 cache), "
                f"got {c.dtype}"
            )
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"v_cache must have k_cache's dtype {k_cache.dtype}, got {v_cache.dtype}")
    if not is_fp8(k_cache):
        return False
    hkv = k_cache.shape[2]
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is None:
            raise ValueError(f"{name} is required with an FP8 cache ({FP8_DTYPE}): one per KV head")
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"{name} must be torch.float32, got {s.dtype}")
        if tuple(s.shape) != (hkv,):
            raise ValueError(f"{name} must be (Hkv,) = ({hkv},), got {tuple(s.shape)}")
        if s.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {s.device}")
        if not s.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    return True
