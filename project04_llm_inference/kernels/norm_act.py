"""RMSNorm (optionally fused with the residual add) and SwiGLU's silu-and-mul.

CUDA tensors go to `csrc/norm_act.cu` (one pass a row); CPU tensors to the PyTorch reference.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from . import reference
from .pdl import pdl_enabled

CSRC = Path(__file__).resolve().parent.parent / "csrc"


@functools.cache
def _ext():
    from shared.cuda_build import load_extension

    return load_extension("p04_norm_act", CSRC, ("norm_act.cu", "norm_act_binding.cpp"))


def _check_rows(name: str, x: torch.Tensor, width: int | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"{name} must be bfloat16, float16 or float32, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if width is not None and x.shape[-1] != width:
        raise ValueError(f"{name} must have last dim {width}, got shape {tuple(x.shape)}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., H) -> (..., H): x / rms(x) * weight, in float32 inside, x's dtype out."""
    _check_rows("x", x)
    _check_rows("weight", weight, x.shape[-1])
    if x.device.type != "cuda":
        return reference.rms_norm(x, weight, eps)
    out = torch.empty_like(x)
    _ext().rms_norm(out, x, weight, float(eps), pdl_enabled(x.device))
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual += x, then x = rms_norm(residual) * weight. Returns (x, residual)."""
    _check_rows("x", x)
    _check_rows("residual", residual, x.shape[-1])
    _check_rows("weight", weight, x.shape[-1])
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs "
            f"{tuple(x.shape)} {x.dtype}"
        )
    if x.device.type != "cuda":
        return reference.fused_add_rms_norm(x, residual, weight, eps)
    _ext().fused_add_rms_norm(x, residual, weight, float(eps), pdl_enabled(x.device))
    return x, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2F) -> (T, F): silu(gate) * up."""
    _check_rows("gate_up", gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be even, got {gate_up.shape[-1]}")
    if gate_up.device.type != "cuda":
        return reference.silu_and_mul(gate_up)
    out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    _ext().silu_and_mul(out, gate_up, pdl_enabled(gate_up.device))
    return out
