"""Paged decode attention: CUDA tensors run `csrc/paged_decode.cu`, CPU tensors the reference.

Same signature and meaning as `reference.paged_decode_attention`. The CUDA path reads no tensor
value on the host, so it can be captured in a CUDA graph: the split plan (`split_plan`) comes
from host integers only (batch, kv heads, `max_context_len` or the block table's reach, SM count)
and each sequence's length is read on the device. Only metadata is validated (device, dtype,
rank, shapes, strides): a bad argument raises ValueError/TypeError naming it. An FP8 cache
(float8_e4m3fn, per-KV-head `k_scale` / `v_scale`) is read by the same kernel's FP8 variant,
which converts each K/V tile to the 16-bit dtype in shared memory and applies the scales once
per CTA (`kv_quant.py`).

Importing this module needs no GPU and no compiler; the extension is built on the first CUDA call.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from . import reference
from .kv_quant import check_kv_cache
from .pdl import pdl_enabled

CSRC = Path(__file__).resolve().parent.parent / "csrc"
EXTENSION = "p04_paged_decode"
HEAD_DIMS = (64, 128)
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
MAX_GROUP = 16  # query heads per kv head: the kernel's mma has 16 rows
TILE = 16  # tokens per warp step; a partition is a multiple of it
MIN_PARTITION = 256  # tokens: below this a split's fixed costs (q load, merge) dominate
# Aim for this many CTAs per SM (3 fit at D = 64, 2 at D = 128): short CTAs keep the last,
# partly filled wave cheap; the combine pass costs ~1e-3 of the K/V traffic at these counts.
WAVES = 16


def split_plan(batch: int, n_kv_heads: int, max_context_len: int, num_sms: int) -> tuple[int, int]:
    """(partition_size in tokens, number of splits) for one decode launch.

    CTAs = batch * n_kv_heads * splits. The context is split into as many partitions as keep
    the CTAs at most WAVES per SM (rounded down: a batch that brings WAVES CTAs per SM or more by
    itself runs one split and no combine pass), each of at least MIN_PARTITION tokens, rounded
    to the 64 tokens a CTA's 4 warps take per step. Rounding down: at batch 256 and context 1k
    (2,048 CTAs, 15.5 per SM) one split, with no combine pass, beats two (the project's NOTES.md
    and decode_attention.json).
    """
    max_context_len = max(int(max_context_len), 1)
    ctas = max(batch * n_kv_heads, 1)
    wanted = (WAVES * num_sms) // ctas
    most = math.ceil(max_context_len / MIN_PARTITION)
    splits = max(1, min(wanted, most))
    partition = 64 * math.ceil(math.ceil(max_context_len / splits) / 64)
    return partition, math.ceil(max_context_len / partition)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _ext():
    from shared.cuda_build import load_extension

    return load_extension(EXTENSION, CSRC, ("paged_decode.cu",))


def _check_tensor(name: str, x, ndim: int, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {what}, got shape {tuple(x.shape)}")


def check_decode_inputs(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    softmax_scale,
    max_context_len,
    k_scale=None,
    v_scale=None,
) -> None:
    """Validate metadata only (never values): raise ValueError/TypeError naming the argument."""
    _check_tensor("q", q, 3, "(B, Hq, D)")
    _check_tensor("k_cache", k_cache, 4, "(num_blocks, block_size, Hkv, D)")
    _check_tensor("v_cache", v_cache, 4, "(num_blocks, block_size, Hkv, D)")
    _check_tensor("block_tables", block_tables, 2, "(B, max_blocks_per_seq)")
    _check_tensor("context_lens", context_lens, 1, "(B,)")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if context_lens.device != q.device:
        raise ValueError(
            f"context_lens must be on q's device {q.device}, got {context_lens.device}"
        )
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must be a floating-point tensor, got {q.dtype}")
    for name, x in (("block_tables", block_tables), ("context_lens", context_lens)):
        if x.dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {x.dtype}")
    b, hq, d = q.shape
    _, block_size, hkv, dk = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}"
        )
    if dk != d:
        raise ValueError(f"k_cache must have q's head dim {d} in dim 3, got {dk}")
    check_kv_cache(q, k_cache, v_cache, k_scale, v_scale)
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"q's {hq} heads must be a multiple of k_cache's {hkv} kv heads")
    if block_tables.shape[0] != b or context_lens.shape[0] != b:
        raise ValueError(
            f"block_tables and context_lens must have q's batch {b} rows, got "
            f"{block_tables.shape[0]} and {context_lens.shape[0]}"
        )
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float, got {type(softmax_scale).__name__}")
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    if max_context_len is not None and (
        isinstance(max_context_len, bool)
        or not isinstance(max_context_len, int)
        or max_context_len < 0
    ):
        raise ValueError(f"max_context_len must be None or an int >= 0, got {max_context_len!r}")
    if q.device.type != "cuda":
        return
    # What the CUDA kernel needs on top of the reference's contract.
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"q must be torch.bfloat16 or torch.float16 on CUDA, got {q.dtype}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q's head dim must be one of {HEAD_DIMS} on CUDA, got {d}")
    if block_size < TILE or block_size & (block_size - 1):
        raise ValueError(f"k_cache's block size must be a power of two >= {TILE}, got {block_size}")
    if hq // hkv > MAX_GROUP:
        raise ValueError(f"q heads per kv head must be <= {MAX_GROUP} on CUDA, got {hq // hkv}")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous; call .contiguous() on it")
        if x.data_ptr() % 16:  # the kernel copies 16-byte chunks
            raise ValueError(f"{name} must start 16-byte aligned, got offset {x.data_ptr() % 16}")
    if q.stride(2) != 1 or q.stride(0) % 2 or q.stride(1) % 2 or q.data_ptr() % 4:
        raise ValueError(
            f"q must have contiguous dims and even strides, got strides {tuple(q.stride())}"
        )
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must have contiguous rows; call .contiguous() on it")
    if not context_lens.is_contiguous():
        raise ValueError("context_lens must be contiguous; call .contiguous() on it")


def paged_decode_attention(
    q: torch.Tensor,  # (B, Hq, D): one query token per sequence
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks_per_seq) int32
    context_lens: torch.Tensor,  # (B,) int32: tokens in the cache, the new one included
    softmax_scale: float,
    max_context_len: int | None = None,  # host-side upper bound (the CUDA kernel's split plan)
    k_scale: torch.Tensor | None = None,  # (Hkv,) float32: an FP8 cache's scales
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each sequence's newest token over its whole cached context: (B, Hq, D).

    A sequence with context length 0 (a padded batch slot) gets zeros. On CUDA,
    `max_context_len` (default: the block table's reach) must bound every context length: the
    split plan covers that many tokens (rounded up to whole partitions) and no more."""
    args = (q, k_cache, v_cache, block_tables, context_lens, softmax_scale, max_context_len)
    check_decode_inputs(*args, k_scale, v_scale)
    if q.device.type != "cuda":
        return reference.paged_decode_attention(*args, k_scale, v_scale)
    b, hq, d = q.shape
    reach = block_tables.shape[1] * k_cache.shape[1]  # tokens the block table can address
    upper = reach if max_context_len is None else min(max_context_len, reach)
    partition, splits = split_plan(b, k_cache.shape[2], upper, _num_sms(q.device.index or 0))
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    if splits > 1:  # per split: out / sum-exp (B, Hq, S, D), then (max, sum-exp) (B, Hq, S, 2)
        part_out = torch.empty((b, hq, splits, d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((b, hq, splits, 2), dtype=torch.float32, device=q.device)
    else:
        part_out = part_ml = torch.empty(0, dtype=torch.float32, device=q.device)
    _ext().paged_decode(
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        float(softmax_scale),
        partition,
        splits,
        part_out,
        part_ml,
        pdl_enabled(q.device),
        k_scale,
        v_scale,
    )
    return out
