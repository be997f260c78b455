"""project01's kernels registered as PyTorch operators (`torch.library.custom_op`).

`attention.flash_attention` and `gemm.matmul` call these operators, so eager code, autograd and
`torch.compile` (fullgraph, no graph break) all see one operator per call:

- `project01::flash_attn_fwd(Tensor q, Tensor k, Tensor v, int causal, float softmax_scale,
  int window_left=-1, int window_right=-1, float softcap=0., str bwd_kernel="auto")
  -> (Tensor, Tensor)`: (out, lse);
  q (B, H, Sq, D), k and v (B, Hk, Sk, D) with Hk dividing H (grouped-query attention); out like
  q (contiguous), lse (B, H, Sq) float32, the natural log-sum-exp of each row of scaled (and
  soft-capped) scores (+inf for a row that sees no key). `causal` is the index of
  `flash_attention`'s causal argument in `attention.CAUSAL_VALUES`: 0 no mask, 1 True (top-left,
  equal lengths only), 2 "top_left", 3 "bottom_right" (a Python bool passes as 0 or 1 with its
  old meaning). window_left/window_right: `flash_attention`'s window_size, -1 unbounded; softcap:
  its softcap, 0 off (the defaults leave the operator what it was: existing calls with five
  arguments are unchanged). bwd_kernel: the backward kernel its autograd runs
  (`attention.BWD_KERNELS`: "auto", "fa2" or "hopper"), checked by every implementation of the
  forward (CUDA, CPU, fake) with `attention.check_bwd_kernel` before anything runs, so a bad name
  or an impossible "hopper" fails at the forward; the forward's own kernels do not depend on
  it. Differentiable in q, k and v (lse is marked non-differentiable): the backward runs
  `flash_attn_bwd` with the same bwd_kernel.
- `project01::flash_attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
  int causal, float softmax_scale, int window_left=-1, int window_right=-1, float softcap=0.,
  str bwd_kernel="auto") -> (Tensor, Tensor, Tensor)`: (dq, dk, dv), each like its input
  (contiguous): dk and dv have k's Hk heads, each the sum over the H / Hk query heads that share
  it. On CUDA `attention.flash_backward(..., bwd_kernel=bwd_kernel)`; the CPU reference checks
  bwd_kernel the same way and computes the same math for every value.
- `project01::flash_attn_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q,
  Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, int causal, float softmax_scale,
  int window_left=-1, int window_right=-1, float softcap=0.) -> (Tensor, Tensor)`: packed
  sequences (`attention.flash_attention_varlen`): q (total_q, H, D), k, v (total_k, Hk, D),
  cu_seqlens int32 (B + 1,); (out like q, lse (H, total_q) float32). causal: 0 none, 1
  bottom-right per sequence (3, "bottom_right", is accepted as 1; 2, top-left, is refused).
  Differentiable in q, k and v through `flash_attn_varlen_bwd(Tensor dout, Tensor q, Tensor k,
  Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q,
  int max_seqlen_k, int causal, float softmax_scale, int window_left=-1, int window_right=-1,
  float softcap=0.) -> (Tensor, Tensor, Tensor)` (always the FlashAttention-2 backward: the
  Hopper one has no varlen instance, and the varlen operators take no bwd_kernel). The CUDA implementations check metadata only
  (no host read); the CPU ones check cu_seqlens' values too and run each sequence through the
  reference math.
- `project01::matmul(Tensor a, Tensor b, str kernel) -> Tensor`: a @ b with the ladder kernel
  `kernel` ("auto" or a `gemm.GEMM_KERNELS` name). Differentiable: dA = dC B^T and dB = A^T dC,
  two products through this same operator and kernel (the inputs made contiguous first, as the
  kernels need row-major operands).
- `project01::matmul_out(Tensor a, Tensor b, str kernel, Tensor(a!) out) -> ()`: the same product
  written into `out` (every element); no autograd, like torch's own out= variants.
- `project01::scaled_matmul(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor`: the
  FP8 step (`fp8_gemm.scaled_matmul`): (scale_a a) (scale_b b)^T in bfloat16 for a (M, K) and
  b (N, K) float8_e4m3fn, one-element float32 scales. Not differentiable.

Each operator has two implementations and a fake (shape) function:

- CUDA (the product): the kernels, through `attention.flash_forward` / `flash_backward` on the
  kernel-ready layout (`attention._kernel_layout`) and `gemm.launch`. Autograd saves the
  operator's inputs, so a q/k/v layout the kernels cannot read in place is copied in the
  forward and again in the backward (views of a fused QKV projection are read in place).
- CPU: the float32 reference math (attention: k/v heads repeated over their query heads,
  softmax(scale q k^T [soft-capped] [+ causal / window mask]) v and its log-sum-exp, backward by
  the standard formulas (dS times 1 - tanh^2 with soft-capping) with dk/dv summed back over each
  group, S x S materialised; matmul: `torch.matmul` in
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

from . import attention, fp8_gemm, gemm

__all__ = [
    "flash_attn_bwd",
    "flash_attn_fwd",
    "flash_attn_varlen_bwd",
    "flash_attn_varlen_fwd",
    "matmul",
    "matmul_out",
    "scaled_matmul",
]


# --------------------------------------------------------------------------------------------
# FlashAttention


# window_left, window_right and softcap have defaults (no window, no soft-capping), so calls with
# the first five (eight) arguments keep their meaning; so does bwd_kernel ("auto": the backward
# the operators always ran), after them, in the dense operators only.
_WINDOW_ARGS = "int window_left=-1, int window_right=-1, float softcap=0.0"
_BWD_KERNEL_ARG = 'str bwd_kernel="auto"'
_FWD_SCHEMA = (
    f"(Tensor q, Tensor k, Tensor v, int causal, float softmax_scale, {_WINDOW_ARGS}, "
    f"{_BWD_KERNEL_ARG}) -> (Tensor, Tensor)"
)
_BWD_SCHEMA = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, int causal, "
    f"float softmax_scale, {_WINDOW_ARGS}, {_BWD_KERNEL_ARG}) -> (Tensor, Tensor, Tensor)"
)


def _causal_value(code: int) -> bool | str:
    """`flash_attention`'s causal value for the operators' int (attention.CAUSAL_VALUES)."""
    if isinstance(code, bool) or (isinstance(code, int) and 0 <= code < 4):
        return attention.CAUSAL_VALUES[int(code)]
    raise ValueError(
        "causal must be 0 (False), 1 (True), 2 ('top_left') or 3 ('bottom_right') in the "
        f"operator, got {code!r}"
    )


def _check_fwd_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: int,
    scale,
    left=-1,
    right=-1,
    softcap=0.0,
    bwd_kernel="auto",
) -> bool | str:
    """check_inputs on (q, k, v) with the causal value the operator's int stands for (and the
    window and softcap), then check_bwd_kernel; returns that value."""
    value = _causal_value(causal)
    attention.check_inputs(q, k, v, value, scale, (left, right), softcap)
    attention.check_bwd_kernel(bwd_kernel, q, k, value, (left, right), softcap)
    return value


def _check_bwd_inputs(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: int,
    scale,
    left=-1,
    right=-1,
    softcap=0.0,
    bwd_kernel="auto",
) -> bool | str:
    """_check_fwd_inputs, plus: dout and out like q, lse (B, H, Sq) float32."""
    value = _check_fwd_inputs(q, k, v, causal, scale, left, right, softcap, bwd_kernel)
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
    return value


# The schema is spelled out so that `causal` is a plain int (an annotation would make it SymInt).
@torch.library.custom_op(
    "project01::flash_attn_fwd", mutates_args=(), device_types="cuda", schema=_FWD_SCHEMA
)
def flash_attn_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: int,
    softmax_scale: float,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> tuple[Tensor, Tensor]:
    """(out, lse) of softmax(softmax_scale q k^T [soft-capped] [+ mask]) v: our forward kernels
    (a head dim they are not compiled for zero-padded to the next one, the output sliced back).
    bwd_kernel is only checked here (before any kernel), for the backward."""
    window = (window_left, window_right)
    value = _check_fwd_inputs(q, k, v, causal, softmax_scale, *window, softcap, bwd_kernel)
    d = q.shape[-1]
    dk = attention.kernel_head_dim(d)
    q, k, v = (attention._kernel_layout(attention.pad_head_dim(t, dk)) for t in (q, k, v))
    out, lse = attention.flash_forward(
        q, k, v, value, softmax_scale, window_size=(window_left, window_right), softcap=softcap
    )
    return (out if d == dk else out[..., :d].contiguous()), lse


@torch.library.custom_op(
    "project01::flash_attn_bwd", mutates_args=(), device_types="cuda", schema=_BWD_SCHEMA
)
def flash_attn_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: int,
    softmax_scale: float,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) from the forward's out and lse: our backward kernels, `bwd_kernel`'s (padded
    like the forward: the zero columns of out and dout add nothing to rowsum(dO * O))."""
    window = (window_left, window_right)
    value = _check_bwd_inputs(
        dout, q, k, v, out, lse, causal, softmax_scale, *window, softcap, bwd_kernel
    )
    d = q.shape[-1]
    hd = attention.kernel_head_dim(d)
    dout, q, k, v, out = (attention.pad_head_dim(t, hd) for t in (dout, q, k, v, out))
    q, k, v, out = (attention._kernel_layout(t) for t in (q, k, v, out))
    grads = attention.flash_backward(
        *(dout, q, k, v, out, lse.contiguous(), value, softmax_scale),
        window_size=window,
        softcap=softcap,
        bwd_kernel=bwd_kernel,
    )
    return grads if d == hd else tuple(g[..., :d].contiguous() for g in grads)


def _expand_kv(t: Tensor, heads: int) -> Tensor:
    """k or v (B, Hk, Sk, D) with each head repeated over its H / Hk query heads, in float32."""
    return t.float().repeat_interleave(heads // t.shape[1], dim=1)


def _scores(
    q: Tensor, k: Tensor, causal: bool | str, scale: float, window=(-1, -1), softcap=0.0
) -> tuple[Tensor, Tensor | None]:
    """(s, t): s = scale q k^T in float32 (k already expanded to q's heads), soft-capped to
    softcap * t with t = tanh(scale q k^T / softcap) when softcap > 0 (t is None otherwise),
    then -inf where the causal mask (j > i + offset: 0 top-left, Sk - Sq bottom-right) or the
    window (attention.visible_keys) hides key j from query i. t is unmasked: the backward's
    1 - t^2 stays finite where P is 0."""
    s = torch.matmul(q.float(), k.transpose(-2, -1)) * scale
    t = None
    if softcap > 0:
        t = torch.tanh(s / softcap)
        s = softcap * t
    sq, sk = s.shape[-2:]
    keep = attention.visible_keys(sq, sk, causal, window, device=s.device)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s, t


def _lse(s: Tensor) -> Tensor:
    """The row log-sum-exp, +inf (not -inf) for a row that sees no key, as the kernels write it:
    then exp(s - lse) is 0 on that row (not NaN), so its output and gradients are 0."""
    lse = torch.logsumexp(s, dim=-1)
    return lse.masked_fill(lse == float("-inf"), float("inf"))


@flash_attn_fwd.register_kernel("cpu")
def _flash_attn_fwd_cpu(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: int,
    softmax_scale: float,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> tuple[Tensor, Tensor]:
    window = (window_left, window_right)
    value = _check_fwd_inputs(q, k, v, causal, softmax_scale, *window, softcap, bwd_kernel)
    out, lse = _fwd_math(q, k, v, value, softmax_scale, window, softcap)
    return out.to(q.dtype).contiguous(), lse.contiguous()


def _fwd_math(q, k, v, value, softmax_scale, window, softcap) -> tuple[Tensor, Tensor]:
    """(out, lse) in float32 of (B, H, Sq, D) inputs: the CPU forward's math."""
    h = q.shape[1]
    s, _ = _scores(q, _expand_kv(k, h), value, softmax_scale, window, softcap)
    lse = _lse(s)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p, _expand_kv(v, h)), lse


@flash_attn_bwd.register_kernel("cpu")
def _flash_attn_bwd_cpu(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: int,
    softmax_scale: float,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    # The FlashAttention backward in float32: P from the saved lse, D = rowsum(dO * O),
    # dS = P * (dP - D) (times 1 - t^2 with soft-capping: d(softcap tanh(x / softcap)) / dx),
    # then dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO; with grouped k/v heads, dK and dV
    # per query head, summed over each group. bwd_kernel is checked as on CUDA; every value
    # computes this same math.
    window = (window_left, window_right)
    value = _check_bwd_inputs(
        dout, q, k, v, out, lse, causal, softmax_scale, *window, softcap, bwd_kernel
    )
    grads = _bwd_math(dout, q, k, v, out, lse, value, softmax_scale, window, softcap)
    return tuple(g.to(t.dtype).contiguous() for g, t in zip(grads, (q, k, v)))


def _bwd_math(dout, q, k, v, out, lse, value, softmax_scale, window, softcap):
    """(dq, dk, dv) in float32 of (B, H, S, D) inputs: the CPU backward's math."""
    b, h, _, _ = q.shape
    hk, sk, d = k.shape[1:]
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    s, t = _scores(q, ke, value, softmax_scale, window, softcap)
    p = torch.exp(s - lse.unsqueeze(-1))
    do = dout.float()
    dv = torch.matmul(p.transpose(-2, -1), do)
    dp = torch.matmul(do, ve.transpose(-2, -1))
    ds = p * (dp - (do * out.float()).sum(dim=-1, keepdim=True))
    if t is not None:
        ds = ds * (1 - t * t)
    dq = torch.matmul(ds, ke) * softmax_scale
    dk = torch.matmul(ds.transpose(-2, -1), q.float()) * softmax_scale
    dk, dv = (g.view(b, hk, h // hk, sk, d).sum(dim=2) for g in (dk, dv))
    return dq, dk, dv


@flash_attn_fwd.register_fake
def _flash_attn_fwd_fake(
    q, k, v, causal, softmax_scale, window_left=-1, window_right=-1, softcap=0.0, bwd_kernel="auto"
):
    window = (window_left, window_right)
    _check_fwd_inputs(q, k, v, causal, softmax_scale, *window, softcap, bwd_kernel)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


@flash_attn_bwd.register_fake
def _flash_attn_bwd_fake(
    dout,
    q,
    k,
    v,
    out,
    lse,
    causal,
    softmax_scale,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
    bwd_kernel="auto",
):
    window = (window_left, window_right)
    _check_bwd_inputs(dout, q, k, v, out, lse, causal, softmax_scale, *window, softcap, bwd_kernel)
    # dq like q; dk, dv like k and v (Hk heads, summed over each group of query heads).
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _flash_attn_setup_context(ctx, inputs, output) -> None:
    # torch fills in the defaults: inputs are always (q, k, v, causal, softmax_scale,
    # window_left, window_right, softcap, bwd_kernel).
    q, k, v, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = tuple(args)  # causal .. bwd_kernel: flash_attn_bwd's arguments after lse
    # The backward kernel has no lse input gradient: lse is for the backward, not for a loss.
    ctx.mark_non_differentiable(lse)


def _flash_attn_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_attn_bwd(dout, q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, *(None for _ in ctx.args)


flash_attn_fwd.register_autograd(_flash_attn_backward, setup_context=_flash_attn_setup_context)


# --------------------------------------------------------------------------------------------
# FlashAttention, variable length (packed sequences)

_VARLEN_ARGS = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k"
_VARLEN_FWD_SCHEMA = (
    f"(Tensor q, Tensor k, Tensor v, {_VARLEN_ARGS}, int causal, float softmax_scale, "
    f"{_WINDOW_ARGS}) -> (Tensor, Tensor)"
)
_VARLEN_BWD_SCHEMA = (
    f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_VARLEN_ARGS}, "
    f"int causal, float softmax_scale, {_WINDOW_ARGS}) -> (Tensor, Tensor, Tensor)"
)


def _varlen_causal(code: int) -> bool:
    """The varlen operators' causal int (attention.CAUSAL_VALUES' index) as a bool; 2
    (top-left) is refused."""
    return attention.varlen_causal(_causal_value(code))


def _check_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, left, right, softcap):
    masked = _varlen_causal(causal)
    attention.check_varlen_inputs(
        q, k, v, cu_q, cu_k, max_q, max_k, masked, scale, (left, right), softcap
    )
    return masked


def _check_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, *rest):
    masked = _check_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, *rest)
    for name, t in (("dout", dout), ("out", out)):
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"{name} must have q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
                f"{q.device}, got {tuple(t.shape)} {t.dtype} on {t.device}"
            )
    shape = (q.shape[1], q.shape[0])
    if lse.shape != shape or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(
            f"lse must be a {shape} float32 tensor on {q.device}, got {tuple(lse.shape)} "
            f"{lse.dtype} on {lse.device}"
        )
    return masked


@torch.library.custom_op(
    "project01::flash_attn_varlen_fwd",
    mutates_args=(),
    device_types="cuda",
    schema=_VARLEN_FWD_SCHEMA,
)
def flash_attn_varlen_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: int,
    softmax_scale: float,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """(out, lse) over packed sequences: the kernels' VARLEN instances (metadata checks only:
    no host read, so the call can be captured in a CUDA graph)."""
    cu = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    masked = _check_varlen_fwd(
        q, k, v, *cu, causal, softmax_scale, window_left, window_right, softcap
    )
    d = q.shape[-1]
    hd = attention.kernel_head_dim(d)
    q, k, v = (attention._varlen_layout(attention.pad_head_dim(t, hd)) for t in (q, k, v))
    out, lse = attention.flash_forward_varlen(
        *(q, k, v, *cu, masked, softmax_scale),
        window_size=(window_left, window_right),
        softcap=softcap,
    )
    return (out if d == hd else out[..., :d].contiguous()), lse


@torch.library.custom_op(
    "project01::flash_attn_varlen_bwd",
    mutates_args=(),
    device_types="cuda",
    schema=_VARLEN_BWD_SCHEMA,
)
def flash_attn_varlen_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: int,
    softmax_scale: float,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) over packed sequences: the backward kernels' VARLEN instances."""
    cu = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    rest = (causal, softmax_scale, window_left, window_right, softcap)
    masked = _check_varlen_bwd(dout, q, k, v, out, lse, *cu, *rest)
    d = q.shape[-1]
    hd = attention.kernel_head_dim(d)
    dout, q, k, v, out = (attention.pad_head_dim(t, hd) for t in (dout, q, k, v, out))
    q, k, v, out = (attention._varlen_layout(t) for t in (q, k, v, out))
    if k.shape[0] == 0:  # no keys: no gradient anywhere (every row saw nothing)
        return tuple(
            torch.zeros_like(t[..., :d], memory_format=torch.contiguous_format) for t in (q, k, v)
        )
    grads = attention.flash_backward_varlen(
        *(dout, q, k, v, out, lse.contiguous(), *cu, masked, softmax_scale),
        window_size=(window_left, window_right),
        softcap=softcap,
    )
    return grads if d == hd else tuple(g[..., :d].contiguous() for g in grads)


def _seq(t: Tensor, a: int, b: int) -> Tensor:
    """Rows a..b-1 of a packed (total, H, D) tensor as (1, H, b - a, D)."""
    return t[a:b].transpose(0, 1).unsqueeze(0)


def _unseq(t: Tensor) -> Tensor:
    """(1, H, S, D) back to (S, H, D)."""
    return t.squeeze(0).transpose(0, 1)


@flash_attn_varlen_fwd.register_kernel("cpu")
def _flash_attn_varlen_fwd_cpu(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    softmax_scale,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
):
    cu = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    window = (window_left, window_right)
    masked = _check_varlen_fwd(q, k, v, *cu, causal, softmax_scale, *window, softcap)
    attention.check_cu_seqlens_values(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    value = "bottom_right" if masked else False
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"))
    for q0, q1, k0, k1 in attention.varlen_segments(cu_seqlens_q, cu_seqlens_k):
        if q1 == q0:
            continue
        o, l_ = _fwd_math(
            *(_seq(t, a, b) for t, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))),
            value,
            softmax_scale,
            window,
            softcap,
        )
        out[q0:q1] = _unseq(o)
        lse[:, q0:q1] = l_[0]
    return out.to(q.dtype), lse


@flash_attn_varlen_bwd.register_kernel("cpu")
def _flash_attn_varlen_bwd_cpu(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    softmax_scale,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
):
    cu = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    window = (window_left, window_right)
    masked = _check_varlen_bwd(
        dout, q, k, v, out, lse, *cu, causal, softmax_scale, *window, softcap
    )
    attention.check_cu_seqlens_values(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    value = "bottom_right" if masked else False
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32) for t in (q, k, v))
    for q0, q1, k0, k1 in attention.varlen_segments(cu_seqlens_q, cu_seqlens_k):
        if q1 == q0 or k1 == k0:
            continue
        g = _bwd_math(
            *(_seq(t, q0, q1) for t in (dout, q)),
            *(_seq(t, k0, k1) for t in (k, v)),
            _seq(out, q0, q1),
            lse[:, q0:q1].unsqueeze(0),
            value,
            softmax_scale,
            window,
            softcap,
        )
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (_unseq(x) for x in g)
    return tuple(g.to(t.dtype) for g, t in ((dq, q), (dk, k), (dv, v)))


@flash_attn_varlen_fwd.register_fake
def _flash_attn_varlen_fwd_fake(
    q,
    k,
    v,
    cu_q,
    cu_k,
    max_q,
    max_k,
    causal,
    softmax_scale,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
):
    _check_varlen_fwd(
        q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, window_left, window_right, softcap
    )
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@flash_attn_varlen_bwd.register_fake
def _flash_attn_varlen_bwd_fake(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_q,
    cu_k,
    max_q,
    max_k,
    causal,
    softmax_scale,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
):
    _check_varlen_bwd(
        dout,
        q,
        k,
        v,
        out,
        lse,
        cu_q,
        cu_k,
        max_q,
        max_k,
        causal,
        softmax_scale,
        window_left,
        window_right,
        softcap,
    )
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _flash_attn_varlen_setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, *rest = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, softmax_scale, *rest)
    ctx.mark_non_differentiable(lse)


def _flash_attn_varlen_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = flash_attn_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, *(None for _ in range(2 + len(ctx.args)))


flash_attn_varlen_fwd.register_autograd(
    _flash_attn_varlen_backward, setup_context=_flash_attn_varlen_setup_context
)


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


# --------------------------------------------------------------------------------------------
# FP8 GEMM (step 10)


@torch.library.custom_op("project01::scaled_matmul", mutates_args=(), device_types="cuda")
def scaled_matmul(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor) -> Tensor:
    """(scale_a a) (scale_b b)^T in bfloat16 with the FP8 kernel (compute capability 9.0)."""
    fp8_gemm.check_inputs(a, b, scale_a, scale_b)
    return fp8_gemm.launch(a, b, scale_a, scale_b, fp8_gemm.new_output(a, b))


@scaled_matmul.register_kernel("cpu")
def _scaled_matmul_cpu(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor) -> Tensor:
    fp8_gemm.check_inputs(a, b, scale_a, scale_b)
    return fp8_gemm.reference(a, b, scale_a, scale_b).contiguous()


@scaled_matmul.register_fake
def _scaled_matmul_fake(a, b, scale_a, scale_b):
    fp8_gemm.check_inputs(a, b, scale_a, scale_b)
    return fp8_gemm.new_output(a, b)
