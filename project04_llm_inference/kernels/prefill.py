"""Chunked-prefill attention over the paged KV cache.

CUDA tensors go to `csrc/paged_prefill.cu` (FlashAttention-2 style, K/V gathered through the
block table, the GQA group's query heads packed into one tile's rows); CPU tensors go to the
PyTorch reference. Both follow `reference.paged_prefill_attention`'s contract. An FP8 cache
(float8_e4m3fn, per-KV-head `k_scale` / `v_scale`) is gathered as e4m3 and converted to the
16-bit dtype in shared memory, the scales applied once per CTA (`kv_quant.py`).

Only metadata is checked here (types, dtypes, ranks, shapes, devices, layout): reading device
values (lengths, block ids) would synchronise the host and break CUDA-graph capture. The kernel's
grid is sized from host ints alone (T, N and the head counts).
"""

from __future__ import annotations

import functools
import math
import numbers
from pathlib import Path

import torch

from . import reference
from .kv_quant import check_kv_cache

CSRC = Path(__file__).resolve().parent.parent / "csrc"
CUDA_DTYPES = (torch.float16, torch.bfloat16)
CUDA_HEAD_DIMS = (64, 128)
_INDEX_ARGS = ("block_tables", "cu_seqlens_q", "context_lens")


@functools.cache
def _ext():
    from shared.cuda_build import load_extension

    return load_extension(
        "p04_paged_prefill", CSRC, ("paged_prefill.cu", "paged_prefill_binding.cpp")
    )


def build() -> None:
    """Compile (or load from the build cache) the prefill extension now."""
    _ext()


def check_inputs(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    max_seqlen_q,
    softmax_scale,
    k_scale=None,
    v_scale=None,
) -> float:
    """Validate the metadata of `paged_prefill_attention`'s arguments; return the scale.

    Raises TypeError or ValueError naming the argument and what was expected."""
    tensors = {
        "q": q,
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": block_tables,
        "cu_seqlens_q": cu_seqlens_q,
        "context_lens": context_lens,
    }
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    on_cuda = q.device.type == "cuda"
    allowed = CUDA_DTYPES if on_cuda else (*CUDA_DTYPES, torch.float32)
    if q.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"q must have dtype in ({names}) on {q.device.type}, got {q.dtype}")
    for name in _INDEX_ARGS:
        if tensors[name].dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {tensors[name].dtype}")
    for name, t in tensors.items():
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")

    if q.dim() != 3:
        raise ValueError(f"q must be (T, Hq, head_dim), got shape {tuple(q.shape)}")
    for name in ("k_cache", "v_cache"):
        if tensors[name].dim() != 4:
            raise ValueError(
                f"{name} must be (num_blocks, block_size, n_kv_heads, head_dim), "
                f"got shape {tuple(tensors[name].shape)}"
            )
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}"
        )
    _, hq, d = q.shape
    _, bs, hkv, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"k_cache's head_dim must equal q's ({d}), got {dk}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"q's heads ({hq}) must be a multiple of the cache's n_kv_heads ({hkv})")
    check_kv_cache(q, k_cache, v_cache, k_scale, v_scale)
    if block_tables.dim() != 2:
        raise ValueError(
            f"block_tables must be (N, max_blocks_per_seq), got shape {tuple(block_tables.shape)}"
        )
    n = block_tables.shape[0]
    if cu_seqlens_q.shape != (n + 1,):
        raise ValueError(
            f"cu_seqlens_q must be (N + 1,) = ({n + 1},) for N = {n} block-table rows, "
            f"got shape {tuple(cu_seqlens_q.shape)}"
        )
    if context_lens.shape != (n,):
        raise ValueError(f"context_lens must be (N,) = ({n},), got {tuple(context_lens.shape)}")
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, numbers.Integral):
        raise TypeError(f"max_seqlen_q must be a host int, got {type(max_seqlen_q).__name__}")
    if max_seqlen_q < 0:
        raise ValueError(f"max_seqlen_q must be >= 0, got {max_seqlen_q}")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"softmax_scale must be a real number, got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")

    if on_cuda:
        if d not in CUDA_HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {CUDA_HEAD_DIMS} on CUDA, got {d}")
        if bs < 1 or bs & (bs - 1):
            raise ValueError(f"the cache's block_size must be a power of two, got {bs}")
        for name in ("k_cache", "v_cache"):
            if not tensors[name].is_contiguous():
                # Copying a cache per call would cost more than the attention itself.
                raise ValueError(f"{name} must be contiguous")
    return scale


def _kernel_layout(q: torch.Tensor) -> torch.Tensor:
    """q as the kernel reads it: unit stride along head_dim, strides multiples of 8, 16-byte
    aligned (views of a fused QKV projection qualify); anything else is copied."""
    ok = (
        q.stride(2) == 1
        and q.stride(0) % 8 == 0
        and q.stride(1) % 8 == 0
        and q.data_ptr() % 16 == 0
    )
    return q if ok else q.contiguous()


def paged_prefill_attention(
    q: torch.Tensor,  # (T, Hq, D): the query tokens of all sequences, packed
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D), this chunk's k/v already written
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (N, max_blocks_per_seq) int32
    cu_seqlens_q: torch.Tensor,  # (N + 1,) int32: sequence i's queries are q[cu[i]:cu[i+1]]
    context_lens: torch.Tensor,  # (N,) int32: cached tokens of sequence i, its queries included
    max_seqlen_q: int,  # host-side: the longest query chunk
    softmax_scale: float,
    k_scale: torch.Tensor | None = None,  # (Hkv,) float32: an FP8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunked-prefill attention, causal aligned bottom-right: (T, Hq, D) in q's dtype.

    Sequence i's query tokens are the last q_len_i positions of its context of context_lens[i]
    tokens; query j sits at position context_len - q_len + j and sees keys 0..that position.
    Rows of q past cu_seqlens_q[N] are left unwritten, as in the reference."""
    args = (q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, max_seqlen_q)
    scale = check_inputs(*args, softmax_scale, k_scale, v_scale)
    if q.device.type != "cuda":
        return reference.paged_prefill_attention(*args, scale, k_scale, v_scale)
    # The grid is bounded by T and N (host ints), so max_seqlen_q is not needed by the kernel.
    return _ext().paged_prefill_fwd(
        _kernel_layout(q),
        k_cache,
        v_cache,
        block_tables if block_tables.stride(1) == 1 else block_tables.contiguous(),
        cu_seqlens_q.contiguous(),
        context_lens.contiguous(),
        scale,
        k_scale,
        v_scale,
    )
