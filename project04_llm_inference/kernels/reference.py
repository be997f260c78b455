"""PyTorch reference implementations of project04's attention and cache ops.

These are the contracts the CUDA kernels in `csrc/` implement, and the CPU path of the engine:
the same function, the same argument layout, computed with plain PyTorch in float32.

Cache layout (one tensor per layer and per K/V, vLLM's "flash" layout):
    k_cache, v_cache: (num_blocks, block_size, n_kv_heads, head_dim)
A token's slot is `block_id * block_size + offset`; a sequence's block table lists its block ids
in order, so its token at position p lives in slot `block_table[p // bs] * bs + p % bs`.
The caches hold the model's dtype, or float8_e4m3fn with per-KV-head scales `k_scale`,
`v_scale` (Hkv,) float32 (`kv_quant.py`): written as x / scale rounded to e4m3, read as
e4m3 * scale, attention in float32 either way.
"""

from __future__ import annotations

import torch

from .kv_quant import dequantize_kv, is_fp8, quantize_kv


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """(max_positions, head_dim) float32: cos in the first half of each row, sin in the second."""
    t = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(t, inv_freq.float())  # (P, D/2)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (T, H, D) by positions (T,): pairs (x[..., i], x[..., i + D/2]) (rotate-half)."""
    half = x.shape[-1] // 2
    cs = cos_sin[positions.long()]  # (T, D)
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


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
    """Apply RoPE to q and k in place and write the rotated k and v into their cache slots
    (an FP8 cache: k / k_scale and v / v_scale per head, rounded to e4m3)."""
    q.copy_(apply_rope(q, positions, cos_sin))
    k.copy_(apply_rope(k, positions, cos_sin))
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    bs = k_cache.shape[1]
    blocks, offsets = slots // bs, slots % bs
    if is_fp8(k_cache):
        k_cache[blocks, offsets] = quantize_kv(k[valid], k_scale)
        v_cache[blocks, offsets] = quantize_kv(v[valid], v_scale)
        return
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


def _gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, n: int, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """The first n tokens of one sequence from the paged cache: (n, Hkv, D), float32 (an FP8
    cache dequantized with its per-head scale)."""
    bs = cache.shape[1]
    n_blocks = (n + bs - 1) // bs
    return dequantize_kv(cache[block_table[:n_blocks].long()].flatten(0, 1)[:n], scale)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q (Sq, Hq, D) bottom-right causal over k/v (Sk, Hkv, D), GQA by head groups; float32."""
    sq, hq, _ = q.shape
    sk, hkv, _ = k.shape
    group = hq // hkv
    qf = q.float().transpose(0, 1)  # (Hq, Sq, D)
    kf = k.float().transpose(0, 1).repeat_interleave(group, 0)  # (Hq, Sk, D)
    vf = v.float().transpose(0, 1).repeat_interleave(group, 0)
    s = (qf @ kf.transpose(1, 2)) * scale  # (Hq, Sq, Sk)
    # query row i sits at key position sk - sq + i and sees keys 0..that position
    qpos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    mask = torch.arange(sk, device=q.device)[None, :] > qpos
    s = s.masked_fill(mask, float("-inf"))
    return (s.softmax(-1) @ vf).transpose(0, 1)  # (Sq, Hq, D)


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

    A sequence with context length 0 (a padded batch slot) gets zeros."""
    out = torch.zeros_like(q)
    lens = context_lens.tolist()
    for b, n in enumerate(lens):
        if n <= 0:
            continue
        k = _gather_context(k_cache, block_tables[b], n, k_scale)
        v = _gather_context(v_cache, block_tables[b], n, v_scale)
        out[b] = _attend(q[b : b + 1], k, v, softmax_scale)[0].to(q.dtype)
    return out


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
    """Chunked-prefill attention, causal aligned bottom-right: (T, Hq, D).

    Sequence i's query tokens are the last q_len_i positions of its context of context_lens[i]
    tokens; query j sits at position context_len - q_len + j and sees keys 0..that position."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for i, n in enumerate(lens):
        lo, hi = cu[i], cu[i + 1]
        if hi == lo:
            continue
        k = _gather_context(k_cache, block_tables[i], n, k_scale)
        v = _gather_context(v_cache, block_tables[i], n, v_scale)
        out[lo:hi] = _attend(q[lo:hi], k, v, softmax_scale).to(q.dtype)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32, returned in x's dtype (Llama's order)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x; x = rms_norm(residual): both in place (one pass on the GPU), returned."""
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps))
    return x, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2F) -> (T, F): silu(gate) * up, the SwiGLU activation, computed in float32."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gate_up.dtype)
