"""The engine's CUDA ops (CUDA tensors) with their PyTorch references (CPU tensors).

Each op takes the same arguments on both paths; `reference.py` states the contract. Importing
needs no GPU and no compiler: extensions are built on first use (`shared.cuda_build`).
"""

from __future__ import annotations

from importlib import import_module

_LAZY = {
    "rope_and_cache": ".rope_cache",
    "paged_decode_attention": ".decode",
    "paged_prefill_attention": ".prefill",
    "rms_norm": ".norm_act",
    "fused_add_rms_norm": ".norm_act",
    "silu_and_mul": ".norm_act",
    "linear": ".gemv",
    "norm_linear": ".gemv",
    "RopeWrite": ".gemv",
    "qkv_views": ".gemv",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        op = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = op  # later lookups skip this function (it runs per layer and op)
        return op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
