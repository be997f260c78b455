"""FlashAttention-2 forward and backward in CUDA C++, as a drop-in for SDPA on CUDA tensors.

`flash_attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
softcap=0.0, bwd_kernel="auto")` computes `softmax(scale * q @ k^T [+ causal mask]) @ v` for q (B, H, Sq, D) and
k, v (B, Hk, Sk, D) (optionally within a sliding window, with soft-capped scores: below), like
`torch.nn.functional.scaled_dot_product_attention` (with `enable_gqa=True` when Hk < H). It runs through the operators
`project01::flash_attn_fwd` / `project01::flash_attn_bwd` (ops.py), so torch.compile sees one
operator; on CUDA tensors they run our kernels in both directions:

- forward on Hopper (compute capability 9.0; csrc/attention/flash_fwd_hopper*.cu): the
  FlashAttention-3 design: a producer warpgroup loads Q, K and V tiles with TMA, two consumer
  warpgroups compute Q K^T and P V with wgmma (P from registers), with the softmax of one key
  block overlapping the P V product of the previous one;
- forward elsewhere (csrc/attention/flash_fwd_hdim*.cu, FlashAttention-2): a Q tile per CTA (32
  rows a warp), K/V streamed through shared memory with cp.async double buffering, mma.sync
  m16n8k16 tensor-core products, online softmax in float32;
  both save the row log-sum-exp (B, H, Sq) float32 for the backward;
- backward (csrc/attention/flash_bwd_*.cu): the rowsum(dO * O) pre-pass, then per 128-key block
  P recomputed from the log-sum-exp, dV and dK in registers, dQ accumulated in float32 with
  atomics;
- backward on Hopper (`flash_attention(..., bwd_kernel="hopper")` through autograd, or
  `flash_backward(..., bwd_kernel="hopper")`; "auto", the default, runs it wherever it has an
  instance, see AUTO_BWD_HOPPER, and the FlashAttention-2 backward elsewhere): the
  FlashAttention-3 design, a TMA producer warpgroup and two wgmma consumer warpgroups per
  128-key block (csrc/attention/flash_bwd_hopper*.cu), dense attention at head dims 64 and 128 only.
  No S x S tensor is ever stored.

Supported: float16 and bfloat16; head dims up to 256 (the kernels are compiled for 64, 128 and
256; a smaller head dim is zero-padded to the next of those on the way in and sliced on the way
out, which changes nothing in the result: the padded columns add 0 to every q.k and produce 0
output and gradient columns; it costs the copies and the padded arithmetic, up to 2x the
products for 129..255 padded to 256); any sequence lengths (k/v's may differ from q's). Head dim
256 has one FlashAttention-2 variant each way (16 query rows a warp forward, 64 keys a CTA
backward: `m_tiles_per_warp` and `warps` do not apply) and no Hopper forward: `kernel="auto"`
runs the FlashAttention-2 forward for it on every GPU, `kernel="hopper"` refuses it. Its shared
memory per CTA, 128 KiB forward and 144.5 KiB backward (the head-dim-128 backward's is 145 KiB),
is within the opt-in limits of the A100 (163 KiB) and the H100 (227 KiB).

Grouped-query and multi-query attention (Llama-3's 8 k/v heads for 32 or 64 query heads): k and
v may have Hk heads, Hk dividing H; query head h attends with k/v head h // (H / Hk) (each k/v
head serves H / Hk consecutive query heads, as `repeat_interleave` or SDPA's `enable_gqa` would
expand them). The kernels read the shared k/v head in place, nothing is repeated in memory; the
backward computes dk, dv per query head and sums each group (an extra (B, H, Sk, D) buffer
only when Hk < H).

Causal masks (`causal`), for query row i (0-based, of Sq) and key j (of Sk):

- `False`: no mask.
- `"top_left"`: i sees keys j <= i, the diagonal starting at the top-left corner. This is
  SDPA's `is_causal=True` (and `torch.tril`) whatever the lengths.
- `"bottom_right"`: i sees keys j <= i + (Sk - Sq), the diagonal ending at the bottom-right
  corner: the last query sees every key. This is FlashAttention's `causal=True` (>= 2.1) and what
  a decoder wants when q holds the last Sq tokens of a sequence whose keys are all in k (chunked
  prefill, decoding with a cache).
- `True`: the two agree when Sq == Sk, which `True` requires (a one-line ValueError otherwise):
  with unequal lengths SDPA and FlashAttention disagree on where the diagonal lies, so `True`
  refuses rather than guess; name the alignment you mean.

A query row that sees no key (bottom-right with Sq > Sk: rows i < Sq - Sk; top-left never has
one) outputs 0 and passes no gradient, FlashAttention's convention (SDPA gives NaN there); its
log-sum-exp is +inf.

Sliding-window (local) attention, `window_size=(left, right)` as in the flash-attn package
(Mistral's and Gemma's local layers): -1 leaves that side unbounded; otherwise query row i sees
key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right, the window aligned bottom-right like
FlashAttention's causal mask (with Sq == Sk: i - left <= j <= i + right). Combined with causal as
flash-attn does: causal means right = 0 (a given right is ignored), so causal=True or
"bottom_right" with window (left, -1) is causal attention over the last left + 1 keys. The window
is bottom-right aligned, so with causal="top_left" a bounded left side needs Sq == Sk (a
ValueError otherwise). A bound that hides no key from any row changes nothing: left >= Sk - 1 is
the same as -1. (flash-attn itself turns left or right >= Sk into -1 and then gives an unbounded
right side the value Sk; that differs from the formula above only when Sq > 2 Sk or so, and
here the formula is the definition.) Rows that see no key output 0 as above. The kernels skip
every key tile outside a query tile's window (forward) and every query tile outside a key tile's
(backward), so the cost is proportional to the window, not to Sq * Sk.

Logit soft-capping, `softcap` (Gemma 2: 50 for attention; 0 = off, the default): the scores
become softcap * tanh(scale * q.k / softcap) before the mask and the softmax; the log-sum-exp is
of those. The backward multiplies dS by 1 - tanh^2, tanh recomputed from the recomputed scores.

Windows and soft-capping run in the FlashAttention-2 kernels (separate template instances: the
kernels without them are compiled exactly as before, machine code unchanged) forward and
backward. The Hopper forward does not implement them: `kernel="auto"` runs the FlashAttention-2
forward on every GPU when a window or softcap is in effect, `kernel="hopper"` refuses them.

Layout: any strides along B, H and S that are multiples of 8 elements, stride 1 along D and a
16-byte aligned start are used in place (the q/k/v views a fused QKV projection produces, for
instance); other layouts are copied to a contiguous tensor first.

Variable length (packed sequences), `flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, *, causal=False, softmax_scale=None, window_size=(-1, -1),
softcap=0.0)`, as flash-attn's `flash_attn_varlen_func`: q (total_q, H, D), k and v (total_k, Hk,
D) token-major, cu_seqlens_q/k int32 (B + 1,) prefix sums (first 0, last the total); sequence b
is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and attends only to rows
cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k/v. Empty sequences are allowed (a query of a
sequence with no keys outputs 0). causal (False, True or "bottom_right", which mean the same)
and window_size are aligned bottom-right on each sequence's own lengths (flash-attn's
convention; "top_left" is refused). Same dtypes, head dims, GQA and softcap as above. Output
(total_q, H, D); the operator's log-sum-exp is (H, total_q). On CUDA the FlashAttention-2
kernels' VARLEN instances run it, forward and backward (the Hopper forward has no varlen
instance: varlen always runs the FlashAttention-2 forward); each CTA reads its sequence's start
and length from cu_seqlens in device memory and the grid is sized from max_seqlen_q/k, so with
max_seqlen_* given the call makes no host read (CUDA-graph capturable). Which checks read what:

- metadata only (always, eager and under torch.compile): tensors, dtypes (cu_seqlens int32,
  1-D, B + 1 entries each, same B for q and k, on q's device), shapes, max_seqlen_* ints >= 0;
- values (need the prefix sums on the host): first entry 0, non-decreasing, last entry ==
  total tokens, max_seqlen_* >= the longest sequence. They run on CPU tensors (no sync), and on
  CUDA tensors only when max_seqlen_q or max_seqlen_k is None (the maxima are then read from
  cu_seqlens, one device-to-host copy). With both given on CUDA tensors the values are trusted,
  as flash-attn trusts them: a max below a real length leaves that sequence's last rows
  unwritten, bad prefix sums read out of bounds.

CPU tensors take the same inputs (same checks) and run the operators' CPU implementation: the
float32 reference math, materialising the S x S scores. `reference_attention` is the same math in
plain differentiable PyTorch, in the inputs' dtype (the tests run it in float64). It is slow and exists so the operator
(schema, fake tensors, autograd, torch.compile) works and is tested on machines without a GPU;
the CUDA kernels are the product.
"""

from __future__ import annotations

import math
import numbers

import torch

from ._build import is_hopper, load_extension

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)  # the head dims the kernels are compiled for
MAX_HEAD_DIM = max(SUPPORTED_HEAD_DIMS)  # smaller ones are padded to the next compiled one
# The values `causal` takes (see the module docstring). The operators in ops.py carry the index
# into this tuple (an int in their schema: 0 False, 1 True, 2 "top_left", 3 "bottom_right").
CAUSAL_VALUES = (False, True, "top_left", "bottom_right")
DEVICE_TYPES = ("cpu", "cuda")  # CUDA: our kernels; CPU: the operators' reference (ops.py)
NO_WINDOW = (-1, -1)  # window_size's default: both sides unbounded
# Window sides are C ints in the kernels' host code (and flash-attn's); larger is refused, and any
# side >= the sequence lengths already hides nothing.
MAX_WINDOW = 2**31 - 1
_MAX_GRID_YZ = 65_535  # CUDA grid limit on the y (heads) and z (batch) dimensions
# Forward kernel variant: 16-row MMA tiles per warp. 2 = FlashAttention-2's layout (32 query rows
# a warp, Q re-read from shared memory); 1 = 16 rows a warp with Q held in registers. Both are
# built and tested; the benchmark measures both. (Head dim 256: one variant, 16 rows a warp.)
FWD_M_TILES_PER_WARP = 2
# Forward kernel: "hopper" (wgmma + TMA, compute capability 9.0 only), "fa2" (mma.sync, any GPU
# from sm_80), or "auto": hopper where it runs, else fa2.
FWD_KERNELS = ("auto", "hopper", "fa2")
# The (kernel) head dims the Hopper forward and backward are compiled for; "auto" runs fa2 for
# the others.
HOPPER_HEAD_DIMS = (64, 128)
# Backward kernel: "hopper" (wgmma + TMA, warp-specialised, csrc/attention/flash_bwd_hopper.cuh;
# compute capability 9.0, head dims HOPPER_HEAD_DIMS, dense attention: no window, softcap or
# varlen), "fa2" (mma.sync, any GPU from sm_80, everything), or "auto" (`select_bwd_kernel`).
# `flash_attention`'s bwd_kernel carries the choice through the operators' autograd.
BWD_KERNELS = ("auto", "hopper", "fa2")
# What "auto" runs. False: the FlashAttention-2 backward everywhere. True: the Hopper backward
# wherever it has an instance (compute capability 9.0, kernel head dim in HOPPER_HEAD_DIMS, no
# window or softcap in effect, not varlen), the FlashAttention-2 one elsewhere. On since the
# GPU tier and the main attention record (attention.json, whose "ours" is "auto") were re-run
# with it (NOTES.md, "Hopper backward"); False restores the FA2 backward everywhere for A/B runs.
AUTO_BWD_HOPPER = True
# Backward kernel variant: warps per CTA, 16 keys each. 8 = 128 keys a CTA (half the dQ atomics
# of 4 = 64 keys a CTA). (Head dim 256: one variant, 8 warps in pairs, 64 keys a CTA.)
BWD_WARPS = 8

_SOURCES = (
    "attention/flash_binding.cpp",
    "attention/flash_fwd_hdim64.cu",
    "attention/flash_fwd_hdim128.cu",
    "attention/flash_fwd_hdim256.cu",
    "attention/flash_fwd_hopper_hdim64.cu",
    "attention/flash_fwd_hopper_hdim128.cu",
    "attention/flash_bwd_hdim64.cu",
    "attention/flash_bwd_hdim128.cu",
    "attention/flash_bwd_hdim256.cu",
    "attention/flash_bwd_hopper_hdim64.cu",
    "attention/flash_bwd_hopper_hdim128.cu",
)


def _extension():
    return load_extension("p01_attention", _SOURCES)


def build() -> None:
    """Compile (or load from the build cache) the attention extension now."""
    _extension()


def resolve_softmax_scale(softmax_scale, head_dim: int) -> float:
    """softmax_scale as a float: 1 / sqrt(head_dim) when None; must be finite and positive."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(
            f"softmax_scale must be a real number or None, got {type(softmax_scale).__name__}"
        )
    scale = float(softmax_scale)
    # Comparisons, not math.isfinite, so torch.compile can trace a symbolic float (NaN fails too).
    if not 0.0 < scale < math.inf:
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale}")
    return scale


def check_causal(causal) -> None:
    """Raise TypeError/ValueError unless `causal` is one of CAUSAL_VALUES."""
    if not isinstance(causal, (bool, str)):
        raise TypeError(
            f"causal must be a bool or one of 'top_left', 'bottom_right', got "
            f"{type(causal).__name__}"
        )
    if isinstance(causal, str) and causal not in CAUSAL_VALUES:
        raise ValueError(
            f"causal must be False, True, 'top_left' or 'bottom_right', got {causal!r}"
        )


def causal_code(causal) -> int:
    """The operators' int for a checked `causal` value: its index in CAUSAL_VALUES."""
    check_causal(causal)
    return CAUSAL_VALUES.index(causal)


def causal_mask_args(causal) -> tuple[bool, bool]:
    """(masked, bottom_right) for the kernels: the mask is on unless causal is False, and aligned
    bottom-right only for "bottom_right" (True and "top_left" are both top-left)."""
    return causal is not False, causal == "bottom_right"


def causal_offset(causal, seqlen_q: int, seqlen_k: int) -> int | None:
    """Query row i sees keys j <= i + offset: 0 for True and "top_left", Sk - Sq for
    "bottom_right"; None when causal is False (no mask)."""
    masked, bottom_right = causal_mask_args(causal)
    if not masked:
        return None
    return seqlen_k - seqlen_q if bottom_right else 0


def resolve_window(window_size) -> tuple[int, int]:
    """window_size as a (left, right) tuple of ints, each -1 (unbounded) or 0..MAX_WINDOW.

    Accepts a tuple or list of two ints (not bools). TypeError for another type, ValueError for
    a side below -1 or above MAX_WINDOW."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(
            f"window_size must be a (left, right) tuple of two ints, -1 for unbounded, got "
            f"{window_size!r}"
        )
    for side, x in zip(("left", "right"), window_size):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(
                f"window_size {side} must be an int (-1: unbounded), got {type(x).__name__}"
            )
        if not -1 <= x <= MAX_WINDOW:
            raise ValueError(
                f"window_size {side} must be -1 (unbounded) or between 0 and {MAX_WINDOW}, got {x}"
            )
    return int(window_size[0]), int(window_size[1])


def resolve_softcap(softcap) -> float:
    """softcap as a float: 0 (off) or a finite positive cap."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number (0: off), got {type(softcap).__name__}")
    cap = float(softcap)
    # Comparisons, not math.isfinite, so torch.compile can trace a symbolic float (NaN fails too).
    if not 0.0 <= cap < math.inf:
        raise ValueError(f"softcap must be finite and >= 0 (0: off), got {softcap}")
    return cap


def window_in_effect(causal, window_size, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether window_size hides a key from some row (beyond what causal hides): a left side
    below Sk (the kernels' host code tests the same), or, without causal, a right side below
    Sq. (Each test is a superset of "hides a key"; left = Sk - 1 or right = Sq - 1 hide none.)"""
    left, right = window_size
    return 0 <= left < seqlen_k or (causal is False and 0 <= right < seqlen_q)


def uses_local_kernels(causal, window_size, softcap: float, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether the kernels' window/softcap instances run (the Hopper forward has none)."""
    return softcap > 0 or window_in_effect(causal, window_size, seqlen_q, seqlen_k)


def visible_keys(
    seqlen_q: int, seqlen_k: int, causal, window_size=NO_WINDOW, device=None
) -> torch.Tensor | None:
    """(Sq, Sk) bool: key j visible from query row i under `causal` and `window_size` (see the
    module docstring); None when every key is visible (no mask)."""
    left, right = window_size
    offset = causal_offset(causal, seqlen_q, seqlen_k)
    bounded_right = offset is None and right >= 0
    if offset is None and left < 0 and not bounded_right:
        return None
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if offset is not None:
        keep &= j <= i + offset
    if left >= 0:
        keep &= j >= i + (seqlen_k - seqlen_q - left)
    if bounded_right:
        keep &= j <= i + (seqlen_k - seqlen_q + right)
    return keep


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool | str = False,
    softmax_scale: float | None = None,
    window_size=NO_WINDOW,
    softcap: float = 0.0,
) -> torch.Tensor:
    """`flash_attention`'s math in plain PyTorch, differentiable, in the inputs' own dtype (no
    casts: float64 inputs give the float64 reference the tests use; half inputs the same-dtype
    math). k/v heads repeated over their query heads; scores scale q k^T, soft-capped when
    softcap > 0, masked by `visible_keys`; a row that sees no key outputs 0 with zero gradient
    (its scores are left unmasked and its probabilities multiplied by 0, so autograd gives 0
    there, not the NaN of a softmax over nothing). No input checks: call it on valid inputs."""
    scale = resolve_softmax_scale(softmax_scale, q.shape[-1])
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    keep = visible_keys(q.shape[2], k.shape[2], causal, window_size, device=q.device)
    if keep is None:
        return torch.matmul(torch.softmax(s, dim=-1), v)
    live = keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~(keep | ~live), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1) * live, v)


def _check_qkv_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k and v in one supported dtype (a TypeError naming the tensor otherwise)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{name} must be torch.float16 or torch.bfloat16, got {t.dtype} "
                "(cast with .half() or .bfloat16())"
            )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool | str,
    softmax_scale,
    window_size=NO_WINDOW,
    softcap=0.0,
) -> float:
    """Validate the arguments of `flash_attention`; return the softmax scale to use.

    Raises TypeError or ValueError naming the argument and what was expected. Every check runs
    on tensor metadata alone and is the same for CPU and CUDA tensors, so both devices accept
    the same inputs; the operators in ops.py run it too (eager and fake), so calling them
    directly is checked the same way.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_causal(causal)
    _check_qkv_dtypes(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, heads, seq, head_dim), "
                f"got shape {tuple(t.shape)}"
            )
    B, H, Sq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if k.shape[0] != B or k.shape[1] < 1 or H % k.shape[1] != 0:
        raise ValueError(
            f"k and v must have q's batch {B} and a number of heads dividing q's {H} "
            f"(grouped-query attention), got (batch, heads) {tuple(k.shape[:2])}"
        )
    if k.shape[3] != D:
        raise ValueError(f"k and v must have q's head_dim {D}, got {k.shape[3]}")
    if D > MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim (q.shape[-1]) must be at most {MAX_HEAD_DIM} (kernels for "
            f"{SUPPORTED_HEAD_DIMS}; a smaller one is zero-padded to the next), got {D}"
        )
    Sk = k.shape[2]
    if min(B, H, Sq, Sk) < 1:
        raise ValueError(
            f"q and k must be non-empty, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if B > _MAX_GRID_YZ or H > _MAX_GRID_YZ:
        raise ValueError(f"batch and heads must each be at most {_MAX_GRID_YZ}, got {B}, {H}")
    if causal is True and Sq != Sk:
        raise ValueError(
            f"causal=True needs q and k of equal sequence length, got {Sq} and {Sk} "
            "(with unequal lengths the top-left and bottom-right causal masks differ: pass "
            "causal='top_left' (SDPA's is_causal) or 'bottom_right' (FlashAttention's))"
        )
    scale = resolve_softmax_scale(softmax_scale, D)
    left, _ = resolve_window(window_size)
    resolve_softcap(softcap)
    if causal == "top_left" and 0 <= left < Sk and Sq != Sk:
        raise ValueError(
            f"window_size is aligned bottom-right (FlashAttention's), so causal='top_left' with "
            f"a window needs q and k of equal sequence length, got {Sq} and {Sk}: pass "
            "causal='bottom_right'"
        )
    devices = {t.device for t in (q, k, v)}
    if len(devices) != 1:
        raise ValueError(f"q, k and v must be on one device, got {sorted(map(str, devices))}")
    if q.device.type not in DEVICE_TYPES:
        raise ValueError(f"q, k and v must be CPU or CUDA tensors, got device {q.device}")
    return scale


# ---- variable length (packed sequences) ----------------------------------------------------
# The causal values varlen takes (bottom-right per sequence, flash-attn's); True means
# "bottom_right" here, since each sequence has its own lengths.
VARLEN_CAUSAL_VALUES = (False, True, "bottom_right")


def varlen_causal(causal) -> bool:
    """Whether a varlen `causal` value masks (bottom-right); TypeError/ValueError otherwise."""
    check_causal(causal)
    if causal == "top_left":
        raise ValueError(
            "flash_attention_varlen aligns causal bottom-right on each sequence (flash-attn's "
            "convention): pass causal=True or 'bottom_right', not 'top_left'"
        )
    return causal is not False


def _check_max_seqlen(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not 0 <= value < 2**31 - 1:
        raise ValueError(f"{name} must be >= 0, got {value}")


def check_varlen_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    softmax_scale,
    window_size=NO_WINDOW,
    softcap=0.0,
) -> float:
    """Validate `flash_attention_varlen`'s arguments from metadata alone (no host read, no
    sync; the same on CPU and CUDA, eager and fake); return the softmax scale. The values of
    cu_seqlens are checked by `check_cu_seqlens_values`. TypeError/ValueError naming the
    argument."""
    for name, t in (
        ("q", q),
        ("k", k),
        ("v", v),
        ("cu_seqlens_q", cu_seqlens_q),
        ("cu_seqlens_k", cu_seqlens_k),
    ):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    varlen_causal(causal)
    _check_qkv_dtypes(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(
                f"{name} must have 3 dimensions (total_tokens, heads, head_dim) for varlen, "
                f"got shape {tuple(t.shape)}"
            )
    _, H, D = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    if k.shape[1] < 1 or H % k.shape[1] != 0:
        raise ValueError(
            f"k and v must have a number of heads dividing q's {H} (grouped-query attention), "
            f"got {k.shape[1]}"
        )
    if k.shape[2] != D:
        raise ValueError(f"k and v must have q's head_dim {D}, got {k.shape[2]}")
    if D > MAX_HEAD_DIM or D < 1:
        raise ValueError(
            f"head_dim (q.shape[-1]) must be 1..{MAX_HEAD_DIM} (kernels for "
            f"{SUPPORTED_HEAD_DIMS}; a smaller one is zero-padded to the next), got {D}"
        )
    if H > _MAX_GRID_YZ:
        raise ValueError(f"heads must be at most {_MAX_GRID_YZ}, got {H}")
    if q.shape[0] + k.shape[0] >= 2**31 - 1024:
        raise ValueError("total_q + total_k must be below 2^31 - 1024")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(
                f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {tuple(cu.shape)}"
            )
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {cu.device}")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
            f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    if cu_seqlens_q.shape[0] - 1 > _MAX_GRID_YZ:
        raise ValueError(f"batch must be at most {_MAX_GRID_YZ}, got {cu_seqlens_q.shape[0] - 1}")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    scale = resolve_softmax_scale(softmax_scale, D)
    resolve_window(window_size)
    resolve_softcap(softcap)
    devices = {t.device for t in (q, k, v)}
    if len(devices) != 1:
        raise ValueError(f"q, k and v must be on one device, got {sorted(map(str, devices))}")
    if q.device.type not in DEVICE_TYPES:
        raise ValueError(f"q, k and v must be CPU or CUDA tensors, got device {q.device}")
    return scale


def check_cu_seqlens_values(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    total_q: int,
    total_k: int,
    max_seqlen_q=None,
    max_seqlen_k=None,
) -> tuple[int, int]:
    """The value checks (a host read of cu_seqlens: a device sync on CUDA tensors): first 0,
    non-decreasing, last == total tokens, a given max_seqlen_* at least the longest sequence.
    Returns (max_seqlen_q, max_seqlen_k): the given ones, or the longest lengths. ValueError."""
    out = []
    for name, cu, total, given in (
        ("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q),
        ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k),
    ):
        vals = cu.tolist()
        if vals[0] != 0:
            raise ValueError(f"{name} must start at 0, got {vals[0]}")
        lengths = [b - a for a, b in zip(vals[:-1], vals[1:])]
        if min(lengths) < 0:
            raise ValueError(f"{name} must be non-decreasing (prefix sums of lengths), got {vals}")
        if vals[-1] != total:
            raise ValueError(
                f"{name} must end at the total number of tokens {total} (the packed tensor's "
                f"first dimension), got {vals[-1]}"
            )
        longest = max(lengths)
        if given is not None and given < longest:
            raise ValueError(
                f"max_seqlen_{name[-1]} must be at least the longest sequence {longest}, got "
                f"{given}"
            )
        out.append(longest if given is None else int(given))
    return out[0], out[1]


def varlen_segments(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor):
    """[(q_start, q_end, k_start, k_end)] per sequence (a host read of cu_seqlens)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(cq) - 1)]


def reference_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal=False,
    softmax_scale: float | None = None,
    window_size=NO_WINDOW,
    softcap: float = 0.0,
) -> torch.Tensor:
    """`flash_attention_varlen`'s math: each sequence through `reference_attention` (causal
    bottom-right), the outputs concatenated; differentiable, in the inputs' dtype. No checks."""
    mask = "bottom_right" if varlen_causal(causal) else False
    outs = []
    for q0, q1, k0, k1 in varlen_segments(cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        o = reference_attention(
            qs,
            ks,
            vs,
            causal=mask,
            softmax_scale=softmax_scale,
            window_size=window_size,
            softcap=softcap,
        )
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def _varlen_layout(t: torch.Tensor) -> torch.Tensor:
    """t (total, H, D) itself when the kernels can read it in place, else a contiguous copy."""
    ok = t.stride(2) == 1 and all(s % 8 == 0 for s in t.stride()[:2]) and t.data_ptr() % 16 == 0
    return t if ok else t.contiguous()


def flash_forward_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    softmax_scale: float,
    *,
    m_tiles_per_warp: int = FWD_M_TILES_PER_WARP,
    window_size=NO_WINDOW,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen forward kernel (FlashAttention-2's VARLEN instances) on checked, kernel-ready
    inputs: (o (total_q, H, D), lse (H, total_q) float32). No host read."""
    left, right = resolve_window(window_size)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if k.shape[0] == 0:  # no keys at all: every row sees none (O = 0, lse = +inf)
        return out.zero_(), lse.fill_(math.inf)
    _extension().fwd_varlen(
        *(q, k, v, out, lse, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()),
        *(int(max_seqlen_q), int(max_seqlen_k), bool(causal), softmax_scale),
        *(m_tiles_per_warp, left, right, resolve_softcap(softcap)),
    )
    return out, lse


def flash_backward_varlen(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    softmax_scale: float,
    *,
    warps: int = BWD_WARPS,
    window_size=NO_WINDOW,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Varlen backward kernels on kernel-ready inputs: (dq, dk, dv) like q, k, v. No host read.
    `bwd_kernel`: "auto" or "fa2" (the Hopper backward has no varlen instance: "hopper" is a
    ValueError)."""
    select_bwd_kernel(bwd_kernel, False, None, varlen=True)
    left, right = resolve_window(window_size)
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    _extension().bwd_varlen(
        *(_varlen_layout(dout), q, k, v, out, lse, dq, dk, dv),
        *(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()),
        *(int(max_seqlen_q), int(max_seqlen_k), bool(causal), softmax_scale, warps),
        *(left, right, resolve_softcap(softcap)),
    )
    return dq, dk, dv


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    causal: bool | str = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = NO_WINDOW,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Fused attention over packed sequences (flash-attn's `flash_attn_varlen_func`):
    (total_q, H, D) x (total_k, Hk, D) x (total_k, Hk, D) -> (total_q, H, D), sequence b being
    rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and cu_seqlens_k[b]:cu_seqlens_k[b + 1] of
    k/v (int32 prefix sums, B + 1 entries each). causal (True or "bottom_right") and
    window_size are aligned bottom-right per sequence; the rest as `flash_attention`. Runs the
    operator `project01::flash_attn_varlen_fwd`, differentiable in q, k, v. max_seqlen_q/k:
    the longest sequence lengths; None reads them from cu_seqlens (a host sync) and then also
    checks cu_seqlens' values; given on CUDA tensors, nothing is read back (see the module
    docstring for which checks need values).
    """
    scale = check_varlen_inputs(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal,
        softmax_scale,
        window_size,
        softcap,
    )
    if max_seqlen_q is None or max_seqlen_k is None or q.device.type == "cpu":
        max_seqlen_q, max_seqlen_k = check_cu_seqlens_values(
            cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
        )
    from .ops import flash_attn_varlen_fwd

    left, right = resolve_window(window_size)
    code = int(varlen_causal(causal))
    return flash_attn_varlen_fwd(
        *(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, code, scale),
        *(left, right, resolve_softcap(softcap)),
    )[0]


def kernel_head_dim(head_dim: int) -> int:
    """The compiled head dim a head dim runs as: itself, or the next larger one (padded)."""
    return next(d for d in SUPPORTED_HEAD_DIMS if d >= head_dim)


def pad_head_dim(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """t (..., D) with zeros appended to head_dim columns (t itself when D == head_dim)."""
    d = t.shape[-1]
    return t if d == head_dim else torch.nn.functional.pad(t, (0, head_dim - d))


def _kernel_layout(t: torch.Tensor) -> torch.Tensor:
    """t itself when the kernels can read it in place, else a contiguous copy."""
    ok = t.stride(3) == 1 and all(s % 8 == 0 for s in t.stride()[:3]) and t.data_ptr() % 16 == 0
    return t if ok else t.contiguous()


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool | str,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    m_tiles_per_warp: int = FWD_M_TILES_PER_WARP,
    kernel: str = "auto",
    window_size=NO_WINDOW,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel on checked, kernel-ready inputs: (o (B, H, Sq, D), lse (B, H, Sq) float32).

    `causal` is one of CAUSAL_VALUES; k and v may have fewer heads than q (grouped-query).
    `window_size` and `softcap` as `flash_attention`'s (checked here too).

    `out` and `lse` may be given to write into (the poisoned-output tests do); `kernel` is one of
    FWD_KERNELS; `m_tiles_per_warp` picks the FlashAttention-2 variant (1 or 2, see
    FWD_M_TILES_PER_WARP; head dim 256 has one variant and ignores it). With a window or softcap
    in effect, or head dim 256, "auto" runs the FlashAttention-2 forward (the Hopper kernel has
    none of them) and "hopper" is a ValueError.
    """
    if m_tiles_per_warp not in (1, 2):
        raise ValueError(f"m_tiles_per_warp must be 1 or 2, got {m_tiles_per_warp!r}")
    left, right = resolve_window(window_size)
    softcap = resolve_softcap(softcap)
    B, H, Sq, _ = q.shape
    local = uses_local_kernels(causal, (left, right), softcap, Sq, k.shape[2])
    kernel = select_fwd_kernel(kernel, local, q.shape[-1])
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    masked, bottom_right = causal_mask_args(causal)
    if kernel == "hopper":
        _extension().fwd_hopper(q, k, v, out, lse, masked, bottom_right, softmax_scale)
    else:
        _extension().fwd(
            *(q, k, v, out, lse, masked, bottom_right, softmax_scale, m_tiles_per_warp),
            *(left, right, softcap),
        )
    return out, lse


def select_fwd_kernel(kernel: str, local: bool, head_dim: int | None = None) -> str:
    """resolve_fwd_kernel, knowing whether a window or softcap is in effect (`local`) and the
    kernel head dim (None: not known, taken as one the Hopper forward has): with a window or
    softcap, or a head dim outside HOPPER_HEAD_DIMS (256), "auto" is "fa2" on every GPU and
    "hopper" a ValueError (the Hopper forward has neither)."""
    if local and kernel == "hopper":
        raise ValueError(
            "kernel='hopper' does not implement window_size or softcap; use 'auto' or 'fa2'"
        )
    no_hopper = head_dim is not None and head_dim not in HOPPER_HEAD_DIMS
    if no_hopper and kernel == "hopper":
        raise ValueError(
            f"kernel='hopper' is compiled for head dims {HOPPER_HEAD_DIMS}, not {head_dim}; use "
            "'auto' or 'fa2'"
        )
    return resolve_fwd_kernel("fa2" if (local or no_hopper) and kernel == "auto" else kernel)


def resolve_fwd_kernel(kernel: str) -> str:
    """The kernel to run for a FWD_KERNELS name: "hopper" or "fa2" ("auto": hopper on CC 9.0)."""
    if kernel not in FWD_KERNELS:
        raise ValueError(f"kernel must be one of {FWD_KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return "hopper" if is_hopper() else "fa2"
    if kernel == "hopper" and not is_hopper():
        raise ValueError(
            "kernel='hopper' needs a GPU of compute capability 9.0 (H100/H200); use 'fa2' or 'auto'"
        )
    return kernel


@torch.compiler.assume_constant_result
def _on_hopper() -> bool:
    """is_hopper(), which torch.compile takes as a constant at trace time: dynamo cannot trace
    its GPU query (torch.cuda.get_device_capability), and `flash_attention` checks bwd_kernel
    in traced code. (The GPU does not change within a process.)"""
    return is_hopper()


def select_bwd_kernel(
    bwd_kernel: str, local: bool, head_dim: int | None = None, varlen: bool = False
) -> str:
    """The backward kernel to run for a BWD_KERNELS name: "hopper" or "fa2".

    "fa2" is "fa2". "auto" is "fa2" while AUTO_BWD_HOPPER is off; with it on, "hopper" where the
    Hopper backward has an instance (not `local`: no window or softcap in effect; kernel head
    dim in HOPPER_HEAD_DIMS, so None, unknown, gives "fa2"; not varlen; compute capability 9.0)
    and "fa2" elsewhere. "hopper" is a ValueError naming bwd_kernel with a window or softcap in
    effect (`local`), a kernel head dim outside HOPPER_HEAD_DIMS, varlen, or a GPU other than
    compute capability 9.0 (checked last, so the other refusals need no GPU)."""
    if bwd_kernel not in BWD_KERNELS:
        raise ValueError(f"bwd_kernel must be one of {BWD_KERNELS}, got {bwd_kernel!r}")
    if bwd_kernel == "fa2" or (bwd_kernel == "auto" and not AUTO_BWD_HOPPER):
        return "fa2"
    if bwd_kernel == "auto":
        fits = not local and head_dim in HOPPER_HEAD_DIMS and not varlen
        return "hopper" if fits and _on_hopper() else "fa2"
    if local:
        raise ValueError(
            "bwd_kernel='hopper' does not implement window_size or softcap; use 'auto' or 'fa2'"
        )
    if head_dim is not None and head_dim not in HOPPER_HEAD_DIMS:
        raise ValueError(
            f"bwd_kernel='hopper' is compiled for head dims {HOPPER_HEAD_DIMS}, not {head_dim}; "
            "use 'auto' or 'fa2'"
        )
    if varlen:
        raise ValueError(
            "bwd_kernel='hopper' has no variable-length (varlen) instance; use 'auto' or 'fa2'"
        )
    if not _on_hopper():
        raise ValueError(
            "bwd_kernel='hopper' needs a GPU of compute capability 9.0 (H100/H200); use 'fa2' "
            "or 'auto'"
        )
    return "hopper"


def check_bwd_kernel(bwd_kernel, q, k, causal, window_size=NO_WINDOW, softcap=0.0) -> str:
    """`select_bwd_kernel` for `flash_attention`'s checked arguments, as `flash_backward` will
    see them (the kernel head dim: a smaller one is padded to the next compiled one; a window
    or softcap counted only when in effect); returns the kernel the backward will run. Runs on
    metadata alone, before any kernel, so a bad `bwd_kernel` or an impossible "hopper" is a
    ValueError naming bwd_kernel at the forward call, not inside the backward. "fa2", and "auto"
    while AUTO_BWD_HOPPER is off, read no shape (no guard under torch.compile)."""
    if bwd_kernel not in ("auto", "hopper") or (bwd_kernel == "auto" and not AUTO_BWD_HOPPER):
        return select_bwd_kernel(bwd_kernel, False)  # "fa2", or the ValueError naming it
    window = resolve_window(window_size)
    local = uses_local_kernels(causal, window, resolve_softcap(softcap), q.shape[2], k.shape[2])
    return select_bwd_kernel(bwd_kernel, local, kernel_head_dim(q.shape[-1]))


def flash_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool | str,
    softmax_scale: float,
    *,
    dq: torch.Tensor | None = None,
    dk: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    warps: int = BWD_WARPS,
    window_size=NO_WINDOW,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernels on kernel-ready inputs: (dq, dk, dv), each shaped like its input (dk, dv
    summed over each group of query heads when k/v have fewer heads); `warps` picks the variant
    (8 or 4, see BWD_WARPS; head dim 256 has one variant and ignores it). `window_size` and
    `softcap`: the forward's. `bwd_kernel`: one of BWD_KERNELS (`select_bwd_kernel`: "fa2" the
    FlashAttention-2 backward, the one `warps` applies to; "hopper" the wgmma/TMA one, which
    ignores `warps`; "auto" one of them, see AUTO_BWD_HOPPER)."""
    if warps not in (4, 8):
        raise ValueError(f"warps must be 4 or 8, got {warps!r}")
    left, right = resolve_window(window_size)
    softcap = resolve_softcap(softcap)
    local = uses_local_kernels(causal, (left, right), softcap, q.shape[2], k.shape[2])
    bwd_kernel = select_bwd_kernel(bwd_kernel, local, q.shape[-1])
    dq = torch.empty_like(q, memory_format=torch.contiguous_format) if dq is None else dq
    dk = torch.empty_like(k, memory_format=torch.contiguous_format) if dk is None else dk
    dv = torch.empty_like(v, memory_format=torch.contiguous_format) if dv is None else dv
    masked, bottom_right = causal_mask_args(causal)
    if bwd_kernel == "hopper":
        _extension().bwd_hopper(
            _kernel_layout(dout),
            *(q, k, v, out, lse, dq, dk, dv),
            *(masked, bottom_right, softmax_scale),
        )
        return dq, dk, dv
    _extension().bwd(
        _kernel_layout(dout),
        *(q, k, v, out, lse, dq, dk, dv),
        *(masked, bottom_right, softmax_scale, warps, left, right, softcap),
    )
    return dq, dk, dv


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool | str = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = NO_WINDOW,
    softcap: float = 0.0,
    bwd_kernel: str = "auto",
) -> torch.Tensor:
    """Fused attention, (B, H, Sq, D) x (B, Hk, Sk, D) x (B, Hk, Sk, D) -> (B, H, Sq, D).

    Hk divides H (grouped-query attention; Hk == H is multi-head). causal: False, "top_left"
    (SDPA's is_causal: query i sees keys 0..i), "bottom_right" (FlashAttention's: query i sees
    keys 0..i + Sk - Sq; rows that see no key output 0), or True (either: needs Sq == Sk). See
    the module docstring. softmax_scale defaults to 1 / sqrt(D). window_size (left, right): the
    sliding window, -1 unbounded (query i sees keys i + Sk - Sq - left .. i + Sk - Sq + right;
    causal sets right = 0); softcap: scores softcap * tanh(scale q.k / softcap), 0 = off; both
    as in the flash-attn package. Runs the operator `project01::flash_attn_fwd`,
    differentiable through `project01::flash_attn_bwd`: our kernels on CUDA tensors, the float32
    reference on CPU tensors (slow; see the module docstring). bwd_kernel: the backward kernel
    autograd runs (BWD_KERNELS; `select_bwd_kernel`): "auto" (the Hopper backward where it
    has an instance, the FlashAttention-2 one elsewhere; AUTO_BWD_HOPPER), "fa2", or "hopper"
    (the wgmma/TMA backward: compute capability 9.0, kernel head dims 64 and 128, no window or
    softcap in effect); checked here, before the forward runs
    (`check_bwd_kernel`; under torch.compile at trace time), so a refusal is a ValueError
    naming bwd_kernel at this call. The CPU reference computes the same gradients whichever is
    named. Raises TypeError/ValueError naming a bad argument
    (`check_inputs`); on CUDA tensors, CudaUnavailableError when the kernels cannot be built
    here.
    """
    scale = check_inputs(q, k, v, causal, softmax_scale, window_size, softcap)
    check_bwd_kernel(bwd_kernel, q, k, causal, window_size, softcap)
    from .ops import flash_attn_fwd

    left, right = resolve_window(window_size)
    code = causal_code(causal)
    softcap = resolve_softcap(softcap)
    if (left, right) == NO_WINDOW and softcap == 0.0 and bwd_kernel == "auto":
        return flash_attn_fwd(q, k, v, code, scale)[0]  # the operator's defaults
    return flash_attn_fwd(q, k, v, code, scale, left, right, softcap, bwd_kernel)[0]
