"""project01's kernels registered as PyTorch operators (`torch.library.custom_op`).

`attention.flash_attention` and `gemm.matmul` call these operators, so eager code, autograd and
`torch.compile` (fullgraph, no graph break) all see one operator per call:

- `project01::flash_attn_fwd(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale)
  -> (Tensor, Tensor)`: (out, lse); out like q (contiguous), lse (B, H, Sq) float32, the natural
  log-sum-exp of each row of scaled scores. Differentiable in q, k and v (lse is marked
  non-differentiable): the backward runs `flash_attn_bwd`.
- `project01::flash_attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
  bool causal, float softmax_scale) -> (Tensor, Tensor, Tensor)`: (dq, dk, dv), each like its
  input (contiguous).
- `project01::matmul(Tensor a, Tensor b, str kernel) -> Tensor`: a @ b with the ladder kernel
  `kernel` ("auto" or a `gemm.GEMM_KERNELS` name). Differentiable: dA = dC B^T and dB = A^T dC,
  two products through this same operator and kernel (the inputs made contiguous first, as the
  kernels need row-major operands).
- `project01::matmul_out(Tensor a, Tensor b, str kernel, Tensor(a!) out) -> ()`: the same product
  written into `out` (every element); no autograd, like torch's own out= variants.

Each operator has two implementations and a fake (shape) function:

- CUDA (the product): the kernels, through `attention.flash_forward` / `flash_backward` on the
  kernel-ready layout (`attention._kernel_layout`) and `gemm.launch`. Autograd saves the
  operator's inputs, so a q/k/v layout the kernels cannot read in place is copied in the
  forward and again in the backward (views of a fused QKV projection are read in place).
- CPU: the float32 reference math (attention: softmax(scale q k^T [+ causal mask]) v and its
  log-sum-exp, backward by the standard formulas, S x S materialised; matmul: `torch.matmul` in
  float32), rounded once to the input dtype. It is slow and is not a product: it exists so the
  schema, the fake functions, the autograd registration and torch.compile integration run and
  are tested (`torch.library.opcheck`) on machines without a GPU.
- fake: output shapes, dtypes and strides without computing, for torch.compile and meta tensors.

All three run the same input checks (`attention.check_inputs`, `gemm._validate`), so CPU and
CUDA accept the same inputs and a bad input is one clear TypeError/ValueError at trace time too.

Importing this module registers the operators; it needs no GPU and no compiler.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import attention, gemm

__all__ = ["flash_attn_bwd", "flash_attn_fwd", "matmul", "matmul_out"]


# --------------------------------------------------------------------------------------------
# FlashAttention


def _check_bwd_inputs(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool, scale
) -> None:
    """check_inputs on (q, k, v), plus: dout and out like q, lse (B, H, Sq) float32."""
    attention.check_inputs(q, k, v, causal, scale)
    for name, t in (("dout", dout), ("out", out)):
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"{name} must have q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
                f"{q.device}, got {tuple(t.shape)} {t.dtype} on {t.device}"
            )
    if lse.shape != q.shape[:3] or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(
            f"lse must be a {tuple(q.shape[:3])} float32 tensor on {q.device}, got "
            f"{tuple(lse.shape)} {lse.dtype} on {lse.device}"
        )


@torch.library.custom_op("project01::flash_attn_fwd", mutates_args=(), device_types="cuda")
def flash_attn_fwd(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float
) -> tuple[Tensor, Tensor]:
    """(out, lse) of softmax(softmax_scale q k^T [+ causal mask]) v: our forward kernels."""
    attention.check_inputs(q, k, v, causal, softmax_scale)
    q, k, v = (attention._kernel_layout(t) for t in (q, k, v))
    return attention.flash_forward(q, k, v, causal, softmax_scale)


@torch.library.custom_op("project01::flash_attn_bwd", mutates_args=(), device_types="cuda")
def flash_attn_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: bool,
    softmax_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) from the forward's out and lse: our backward kernels."""
    _check_bwd_inputs(dout, q, k, v, out, lse, causal, softmax_scale)
    q, k, v, out = (attention._kernel_layout(t) for t in (q, k, v, out))
    return attention.flash_backward(dout, q, k, v, out, lse.contiguous(), causal, softmax_scale)


def _scores(q: Tensor, k: Tensor, causal: bool, scale: float) -> Tensor:
    """scale q k^T in float32, -inf above the diagonal when causal (top-left aligned)."""
    s = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


@flash_attn_fwd.register_kernel("cpu")
def _flash_attn_fwd_cpu(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, softmax_scale: float
) -> tuple[Tensor, Tensor]:
    attention.check_inputs(q, k, v, causal, softmax_scale)
    s = _scores(q, k, causal, softmax_scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = torch.matmul(p, v.float()).to(q.dtype)
    return out.contiguous(), lse.contiguous()


@flash_attn_bwd.register_kernel("cpu")
def _flash_attn_bwd_cpu(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: bool,
    softmax_scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    # The FlashAttention backward in float32: P from the saved lse, D = rowsum(dO * O),
    # dS = P * (dP - D), then dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
    _check_bwd_inputs(dout, q, k, v, out, lse, causal, softmax_scale)
    p = torch.exp(_scores(q, k, causal, softmax_scale) - lse.unsqueeze(-1))
    do = dout.float()
    dv = torch.matmul(p.transpose(-2, -1), do)
    dp = torch.matmul(do, v.float().transpose(-2, -1))
    ds = p * (dp - (do * out.float()).sum(dim=-1, keepdim=True))
    dq = torch.matmul(ds, k.float()) * softmax_scale
    dk = torch.matmul(ds.transpose(-2, -1), q.float()) * softmax_scale
    return tuple(g.to(t.dtype).contiguous() for g, t in ((dq, q), (dk, k), (dv, v)))


@flash_attn_fwd.register_fake
def _flash_attn_fwd_fake(q, k, v, causal, softmax_scale):
    attention.check_inputs(q, k, v, causal, softmax_scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


@flash_attn_bwd.register_fake
def _flash_attn_bwd_fake(dout, q, k, v, out, lse, causal, softmax_scale):
    _check_bwd_inputs(dout, q, k, v, out, lse, causal, softmax_scale)
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _flash_attn_setup_context(ctx, inputs, output) -> None:
    q, k, v, causal, softmax_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
    # The backward kernel has no lse input gradient: lse is for the backward, not for a loss.
    ctx.mark_non_differentiable(lse)


def _flash_attn_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attn_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.softmax_scale)
    return dq, dk, dv, None, None


flash_attn_fwd.register_autograd(_flash_attn_backward, setup_context=_flash_attn_setup_context)


# --------------------------------------------------------------------------------------------
# GEMM


def _new_product(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty((a.shape[0], b.shape[1]))


def _reference_product(a: Tensor, b: Tensor) -> Tensor:
    """a @ b accumulated in float32 (the kernels' accumulation), in a's dtype."""
    return torch.matmul(a.float(), b.float()).to(a.dtype)


@torch.library.custom_op("project01::matmul", mutates_args=(), device_types="cuda")
def matmul(a: Tensor, b: Tensor, kernel: str) -> Tensor:
    """a @ b with one ladder kernel ("auto": the top step that runs on this GPU)."""
    gemm._validate(a, b, kernel, None)
    return gemm.launch(a, b, kernel, _new_product(a, b))


@torch.library.custom_op("project01::matmul_out", mutates_args=("out",), device_types="cuda")
def matmul_out(a: Tensor, b: Tensor, kernel: str, out: Tensor) -> None:
    """a @ b written into out with one ladder kernel."""
    gemm._validate(a, b, kernel, out)
    gemm.launch(a, b, kernel, out)


@matmul.register_kernel("cpu")
def _matmul_cpu(a: Tensor, b: Tensor, kernel: str) -> Tensor:
    gemm._validate(a, b, kernel, None)
    return _reference_product(a, b).contiguous()


@matmul_out.register_kernel("cpu")
def _matmul_out_cpu(a: Tensor, b: Tensor, kernel: str, out: Tensor) -> None:
    gemm._validate(a, b, kernel, out)
    out.copy_(_reference_product(a, b))


@matmul.register_fake
def _matmul_fake(a, b, kernel):
    gemm._validate(a, b, kernel, None)
    return _new_product(a, b)


@matmul_out.register_fake
def _matmul_out_fake(a, b, kernel, out):
    gemm._validate(a, b, kernel, out)


def _matmul_setup_context(ctx, inputs, output) -> None:
    a, b, kernel = inputs
    ctx.save_for_backward(a, b)
    ctx.kernel = kernel


def _matmul_backward(ctx, dc):
    a, b = ctx.saved_tensors
    dc = dc.contiguous()
    da = matmul(dc, b.t().contiguous(), ctx.kernel) if ctx.needs_input_grad[0] else None
    db = matmul(a.t().contiguous(), dc, ctx.kernel) if ctx.needs_input_grad[1] else None
    return da, db, None


matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup_context)
