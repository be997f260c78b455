"""FP8 (e4m3) weights with one scale per output channel, and the projection that reads them.

A weight W (N, K) is stored as q = round_e4m3(W / s) with s[n] = max_k |W[n, k]| / 448 (448 is
e4m3's largest finite value), so every row uses the format's whole range and W ~= q * s[:, None].
e4m3 keeps 3 mantissa bits: rounding a normal value to it errs by at most half a unit in the
last place, a relative error <= 2^-4; values below e4m3's smallest normal (2^-6, times s) keep
an absolute error <= 2^-10 * s (half the subnormal step 2^-9).

`fp8_linear(x, w)` is x @ W^T in x's dtype. On the CPU (and wherever `torch._scaled_mm` cannot
run) it dequantizes W and multiplies: the reference, weights-only. On a CUDA GPU of compute
capability >= 8.9 it runs W8A8 through `torch._scaled_mm`: x is quantized to e4m3 per token
(row) with a dynamic scale, the product accumulates in float32 and both scales are applied in
the epilogue, reading half the weight bytes of bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
# the smallest scale used for an all-zero row (or token): keeps 0 / s finite
MIN_SCALE = 1e-12
# torch._scaled_mm takes K and N in multiples of 16
SCALED_MM_ALIGN = 16
MIN_FP8_CAPABILITY = (8, 9)  # Ada (sm_89) and Hopper (sm_90) have e4m3 tensor cores


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float -> (q (N, K) e4m3, scale (N,) float32) with w ~= q * scale[:, None]."""
    if w.dim() != 2:
        raise ValueError(f"w must be (N, K), got shape {tuple(w.shape)}")
    if not w.is_floating_point() or w.dtype == FP8_DTYPE:
        raise TypeError(f"w must be a bfloat16/float16/float32 tensor, got {w.dtype}")
    w32 = w.float()
    if not torch.isfinite(w32).all():
        raise ValueError("w holds inf or nan: it has no FP8 scale")
    scale = (w32.abs().amax(dim=1) / FP8_MAX).clamp_min(MIN_SCALE)
    q = (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q (N, K) e4m3, scale (N,) -> (N, K) in dtype (float32 products, then rounded)."""
    return (q.float() * scale.float()[:, None]).to(dtype)


class Fp8Weight(nn.Module):
    """A projection's weight in FP8: `qweight` (N, K) e4m3 and `scale` (N,) float32 buffers."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        if qweight.dtype != FP8_DTYPE or qweight.dim() != 2:
            raise TypeError(f"qweight must be (N, K) {FP8_DTYPE}, got {qweight.dtype}")
        if scale.shape != (qweight.shape[0],):
            raise ValueError(f"scale must be ({qweight.shape[0]},), got {tuple(scale.shape)}")
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.float().contiguous())

    @classmethod
    def from_float(cls, w: torch.Tensor) -> Fp8Weight:
        return cls(*quantize_rows(w))

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    def dim(self) -> int:
        return 2

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return dequantize_rows(self.qweight, self.scale, dtype)


def scaled_mm_applies(x: torch.Tensor, w: Fp8Weight) -> bool:
    """Whether `fp8_linear` takes `torch._scaled_mm` (else the dequantizing reference)."""
    if x.device.type != "cuda" or x.shape[0] == 0:
        return False
    n, k = w.shape
    if n % SCALED_MM_ALIGN or k % SCALED_MM_ALIGN:
        return False
    return torch.cuda.get_device_capability(x.device) >= MIN_FP8_CAPABILITY


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, K) -> (e4m3 (T, K), scale (T, 1) float32): one dynamic scale per token."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(MIN_SCALE)
    return (x32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear_reference(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """x @ dequant(W)^T, weights-only: the product in x's dtype (float32 on the CPU engine)."""
    return F.linear(x, w.dequantize(x.dtype))


def fp8_linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """(T, K) @ (N, K)^T -> (T, N) in x's dtype; `torch._scaled_mm` (W8A8) where it applies."""
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x must be (T, {w.shape[1]}), got {tuple(x.shape)}")
    if not scaled_mm_applies(x, w):
        return fp8_linear_reference(x, w)
    xq, xs = quantize_tokens(x)
    # b must be column-major: qweight (N, K) row-major viewed as (K, N); row-wise scales need a
    # bfloat16 output
    out = torch._scaled_mm(
        xq,
        w.qweight.t(),
        scale_a=xs,
        scale_b=w.scale.view(1, -1),
        out_dtype=torch.bfloat16,
    )
    return out if x.dtype == torch.bfloat16 else out.to(x.dtype)
