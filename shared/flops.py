"""FLOP and byte counts, the conventions every report in this repo uses.

- matmul (M, K) @ (K, N): 2·M·N·K FLOPs.
- attention forward: 4·B·H·S_q·S_k·D (two matmuls, QKᵀ and PV), half of it when causal;
  backward 2.5× forward (five matmuls against two); the FlashAttention papers' convention.
- training: 6·N FLOPs per token for the parameters (forward 2N, backward 4N) plus attention
  12·L·d·S per token (forward and backward of QKᵀ and PV), half of it when causal.
Bytes are the fewest that must cross device memory: each input read once, each output written
once. Achieved bandwidth over that count says how close a kernel is to streaming.
"""

from __future__ import annotations

import torch

_MODES = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element of a torch dtype (or its name)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype name {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def _check_positive(**sizes: int) -> None:
    for name, v in sizes.items():
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def matmul_flops(m: int, n: int, k: int) -> int:
    _check_positive(m=m, n=n, k=k)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, in_bytes: int, out_bytes: int | None = None) -> int:
    """A (M, K) and B (K, N) read once, C (M, N) written once."""
    _check_positive(m=m, n=n, k=k)
    out_bytes = in_bytes if out_bytes is None else out_bytes
    return (m * k + k * n) * in_bytes + m * n * out_bytes


def attention_flops(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    *,
    causal: bool = False,
    mode: str = "fwd",
) -> float:
    """FLOPs of attention; mode is 'fwd', 'bwd' (2.5x fwd) or 'fwd_bwd' (3.5x fwd)."""
    _check_positive(batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")
    fwd = 4.0 * batch * heads * seq_q * seq_k * head_dim
    if causal:
        fwd /= 2
    return fwd * _MODES[mode]


def attention_bytes(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    dtype_bytes: int,
    *,
    mode: str = "fwd",
) -> int:
    """Fewest bytes for fused attention.

    fwd: read Q, K, V, write O (plus the float32 log-sum-exp, B·H·S_q·4).
    bwd: read Q, K, V, O, dO and the LSE, write dQ, dK, dV.
    """
    _check_positive(batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)
    q = batch * heads * seq_q * head_dim * dtype_bytes
    kv = batch * heads * seq_k * head_dim * dtype_bytes
    lse = batch * heads * seq_q * 4
    fwd = q + 2 * kv + q + lse
    bwd = (3 * q + 2 * kv + lse) + (q + 2 * kv)
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return bwd
    if mode == "fwd_bwd":
        return fwd + bwd
    raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}")


def transformer_train_flops_per_token(
    n_params: int, n_layers: int, d_model: int, seq_len: int, *, causal: bool = True
) -> float:
    """6·N + 12·L·d·S (attention term halved when causal), per trained token.

    n_params: the parameters that take part in matmuls; pass the count without the input
    embedding table for the strict convention, or the full count for the common one.
    """
    _check_positive(n_params=n_params, n_layers=n_layers, d_model=d_model, seq_len=seq_len)
    attn = 12.0 * n_layers * d_model * seq_len
    if causal:
        attn /= 2
    return 6.0 * n_params + attn


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOP per byte moved."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    return flops / nbytes
