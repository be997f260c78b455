"""The public FlashAttention test matrix, run on `flash_attention` against a float32 reference.

The matrix is the one of `test_flash_attn_output` in the flash-attention repository (its plain
case: no dropout, no sliding window, no ALiBi, no softcap, q/k/v as separate tensors; windows and
softcap are accepted too, see below):

- head dims 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256 (upstream's list had 80 from
  August to December 2023 and is these without 80 since; this matrix keeps it);
- (seqlen_q, seqlen_k) pairs (113, 203), (128, 217), (113, 211), (108, 256), (256, 512),
  (512, 256), (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048);
- MHA, GQA and MQA: 6 query heads with 6, 2 and 1 k/v heads;
- causal and not; float16 and bfloat16.

That is 12 x 10 x 3 x 2 x 2 = 1440 cases (`MATRIX`). Each case (`run_case`) builds q, k, v
(B, H, S, D) and a random output gradient from a fixed seed, runs `flash_attention` forward and
backward, and compares the output and dq, dk, dv with two references computed by the same
explicit math (softmax(scale q k^T [+ mask]) v, autograd for the gradients):

- the float32 reference: the math in float32 (TF32 off), the closest to exact we have;
- the same-dtype reference: the same math in the input dtype (float16/bfloat16), as PyTorch
  runs it. Its error against the float32 reference measures the rounding that computing in a
  half dtype costs a correct implementation.

Verdict, FlashAttention's rule, for each of out, dq, dk, dv:

    max|ours - fp32 ref| <= RULE_FACTOR * max|same-dtype ref - fp32 ref| + RULE_ATOL

with RULE_FACTOR 2 and RULE_ATOL 1e-5. Why relative to the same-dtype reference rather than a
fixed tolerance: the error a half-dtype attention cannot avoid grows with the magnitude of the
values, the head dim, the sequence length and the dtype (bfloat16 keeps 8 significant bits,
float16 11), so any fixed atol/rtol is either loose for the easy cases or fails correct kernels
on the hard ones. A kernel that is at most twice as far from the exact answer as PyTorch's own
half-dtype math is rounding no worse than a correct implementation should (a kernel keeping its
accumulators in float32 is usually closer than the same-dtype math, which rounds the scores and
probabilities to the half dtype); a real bug (a wrong tile, a missing rescale) errs by orders of
magnitude more. RULE_ATOL only covers outputs that both get (almost) exactly right, where twice
a zero error would demand bit-exactness.

Upstream, as read at flash-attention commit 0251105a (tests/test_flash_attn.py and
hopper/test_flash_attn.py): `test_flash_attn_output` asserts the output at 2x with no absolute
floor and dq/dk/dv at 3x (relaxed from 2x in 2024); `test_flash_attn_causal` (and its varlen
twin) uses 2x + 1e-5 for the output and all three gradients; `test_flash_attn_splitkv` 2x +
1e-5 for the output and 2x + 2e-4 for the gradients; the Hopper (FlashAttention-3) tests use 2x
plus a floor of twice the float32 rounding of the reference's own values
(`2 * |ref + 0.3 - 0.3 - ref|`, of order 1e-7 at these magnitudes). We apply the project's
stricter reading: 2x for the output and all three gradients, with the 1e-5 floor of the
upstream causal tests (the one tests/project01_cuda_kernel/test_attention_gpu.py already uses).

The causal mask is upstream's: FlashAttention >= 2.1 aligns the diagonal bottom-right (query i
sees keys 0..i + seqlen_k - seqlen_q), so a causal case runs `flash_attention(...,
causal="bottom_right")` and the references mask the same way (SDPA's `is_causal` is top-left;
the two agree only for equal lengths). With seqlen_q > seqlen_k the first seqlen_q - seqlen_k
query rows see no key: upstream's reference (and `flash_attention`) output 0 there, with no
gradient, and so do ours. GQA/MQA cases pass k and v with their 2 or 1 heads; `flash_attention`
reads them in place.

Sliding windows and soft-capping (upstream's `local` and `softcap` parameters): a Case may carry
`window` (left, right), -1 unbounded, and `softcap` (0 off); `matrix_cases(windows=...,
softcaps=...)` adds them to the product (MATRIX itself stays the plain 1440 cases). The
references apply them the way upstream's `attention_ref` does: scores softcap * tanh(s /
softcap), then the window mask bottom-right aligned (query i sees keys i + Sk - Sq - left ..
i + Sk - Sq + right; causal makes right 0), rows that see no key 0. As upstream, a softcap case
multiplies q by softcap so that the scores reach the cap. `flash_attention` gets window_size and
softcap only when they are set, so an `attention_fn` without those arguments still runs the
plain cases.

Inputs `flash_attention` does not support (`attention.check_inputs`: head dims above 256,
which the matrix does not have; the head dims the kernels are not compiled for run zero-padded
to 64, 128 or 256) raise a one-line TypeError/ValueError; such a case is "refused" with that
message, and `run_matrix` groups the refusals by the message with its case-specific numbers
normalised.

On CPU tensors `flash_attention` runs its operator's float32 reference, so a CPU run checks this
harness (inputs, references, rule, grouping), not the CUDA kernels. Importing this module needs
no GPU.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

HEAD_DIMS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
SEQLEN_PAIRS = (
    (113, 203),
    (128, 217),
    (113, 211),
    (108, 256),
    (256, 512),
    (512, 256),
    (1024, 1024),
    (1023, 1024),
    (1024, 1023),
    (2048, 2048),
)
MHA_TYPES = ("mha", "gqa", "mqa")
CAUSAL = (False, True)
DTYPES = ("float16", "bfloat16")
NO_WINDOW = (-1, -1)  # window: both sides unbounded (the plain matrix)
NHEADS = 6  # query heads; k/v heads: 6 (MHA), 2 (GQA), 1 (MQA), as upstream
# Batch 2 where upstream uses 4: the float32 reference materialises the B x H x Sq x Sk scores
# (and autograd keeps several such tensors), so 2 halves its memory and time across the 1440
# cases; a second batch entry still exercises the kernels' batch offsets (a kernel reading
# batch 0 for every batch fails), and batches are independent work in the kernels, so more of
# them add no new code path. The max-error statistic is taken over half as many elements, for
# ours and the same-dtype reference alike.
BATCH = 2
SEED = 0
TENSORS = ("out", "dq", "dk", "dv")
RULE_FACTOR = 2.0
RULE_ATOL = 1e-5
RULE = (
    f"max|ours - fp32 ref| <= {RULE_FACTOR:g} * max|same-dtype ref - fp32 ref| + {RULE_ATOL:g}, "
    "for out, dq, dk and dv"
)


@dataclass(frozen=True)
class Case:
    """One point of the matrix. dtype is a torch dtype name ("float16" or "bfloat16")."""

    head_dim: int
    seqlen_q: int
    seqlen_k: int
    mha_type: str  # "mha", "gqa" or "mqa"
    causal: bool
    dtype: str
    batch: int = BATCH
    nheads: int = NHEADS
    window: tuple[int, int] = NO_WINDOW  # (left, right), -1 unbounded
    softcap: float = 0.0  # 0: off

    def __post_init__(self) -> None:
        if not (isinstance(self.window, tuple) and len(self.window) == 2):
            raise ValueError(f"window must be a (left, right) tuple, got {self.window!r}")
        if self.mha_type not in MHA_TYPES:
            raise ValueError(f"mha_type must be one of {MHA_TYPES}, got {self.mha_type!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.nheads % self.nheads_kv:
            raise ValueError(f"nheads {self.nheads} is not a multiple of {self.nheads_kv}")

    @property
    def nheads_kv(self) -> int:
        """k/v heads: all of q's (MHA), 2 (GQA) or 1 (MQA), as upstream."""
        return {"mha": self.nheads, "gqa": 2, "mqa": 1}[self.mha_type]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def id(self) -> str:
        dt = {"float16": "fp16", "bfloat16": "bf16"}[self.dtype]
        mask = "causal" if self.causal else "full"
        extra = ""
        if self.window != NO_WINDOW:
            extra += f"-w{self.window[0]}_{self.window[1]}"
        if self.softcap:
            extra += f"-cap{self.softcap:g}"
        return (
            f"d{self.head_dim}-{self.seqlen_q}x{self.seqlen_k}-{self.mha_type}-{mask}{extra}-{dt}"
        )


def matrix_cases(
    head_dims: Iterable[int] = HEAD_DIMS,
    seqlen_pairs: Iterable[tuple[int, int]] = SEQLEN_PAIRS,
    mha_types: Iterable[str] = MHA_TYPES,
    causal: Iterable[bool] = CAUSAL,
    dtypes: Iterable[str] = DTYPES,
    windows: Iterable[tuple[int, int]] = (NO_WINDOW,),
    softcaps: Iterable[float] = (0.0,),
) -> list[Case]:
    """The cases of the product of the given lists (defaults: the full matrix; windows and
    softcaps vary fastest)."""
    return [
        Case(d, sq, sk, mha, c, dt, window=tuple(w), softcap=cap)
        for dt, mha, c, d, (sq, sk), w, cap in itertools.product(
            *(tuple(dtypes), tuple(mha_types), tuple(causal), tuple(head_dims)),
            *(tuple(seqlen_pairs), tuple(windows), tuple(softcaps)),
        )
    ]


MATRIX: tuple[Case, ...] = tuple(matrix_cases())


def make_inputs(
    case: Case, device: torch.device | str, seed: int = SEED
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, Sq, D), k and v (B, H_kv, Sk, D), dout (B, H, Sq, D): standard normal in the
    case's dtype, from a generator seeded with `seed` on `device`; with a softcap, q times the
    softcap (rounded to the dtype), as upstream does so that the scores reach the cap."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    b, h, hk, d = case.batch, case.nheads, case.nheads_kv, case.head_dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=case.torch_dtype)

    q = randn(b, h, case.seqlen_q, d)
    if case.softcap > 0:
        q = q * case.softcap
    k = randn(b, hk, case.seqlen_k, d)
    v = randn(b, hk, case.seqlen_k, d)
    dout = randn(b, h, case.seqlen_q, d)
    return q, k, v, dout


def attention_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    window: tuple[int, int] = NO_WINDOW,
    softcap: float = 0.0,
) -> torch.Tensor:
    """softmax(scale q k^T [soft-capped] [+ causal / window mask, bottom-right]) v, explicitly,
    in the inputs' dtype (no casts: call it on float32 tensors for the float32 reference, on half
    tensors for the same-dtype one).

    GQA/MQA: each k/v head serves nheads / nheads_kv consecutive query heads; they are expanded
    here, in the references only (autograd sums each expanded head's gradient back onto it).
    """
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap > 0:  # upstream's attention_ref: scores / softcap, tanh, * softcap
        s = torch.tanh(s / softcap) * softcap
    left, right = window
    if not causal and left < 0 and right < 0:
        return torch.matmul(torch.softmax(s, dim=-1), v)
    # Bottom-right aligned, as FlashAttention >= 2.1: query i sees keys 0..i + seqlen_k -
    # seqlen_q; a window keeps keys i + Sk - Sq - left .. i + Sk - Sq + right (causal: right 0).
    # A row that sees no key (seqlen_q > seqlen_k, or a window past the keys) is 0 with no
    # gradient, upstream's convention: its scores stay unmasked and its probabilities are
    # multiplied by 0, so that autograd gives 0 there rather than the NaN of a softmax over
    # nothing.
    sq, sk = s.shape[-2:]
    row = torch.arange(sq, device=s.device).unsqueeze(1)
    col = torch.arange(sk, device=s.device).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=s.device)
    if causal:
        right = 0
    if right >= 0:
        keep &= col <= row + sk - sq + right
    if left >= 0:
        keep &= col >= row + sk - sq - left
    live = keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~(keep | ~live), float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1) * live, v)


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def _out_and_grads(out: torch.Tensor, inputs: Sequence[torch.Tensor], dout: torch.Tensor):
    grads = torch.autograd.grad(out, inputs, dout)
    return (out.detach(), *grads)


@contextmanager
def _ieee_float32_matmul():
    """float32 matmuls in full precision: a TF32 reference would be no reference."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def max_abs_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| in float32; infinite when the shapes differ or x has NaN/inf."""
    if x.shape != ref.shape:
        return math.inf
    err = (x.float() - ref.float()).abs().max().item()
    return err if math.isfinite(err) else math.inf


def rule_holds(ours: float, same_dtype: float) -> bool:
    """FlashAttention's rule: ours within twice the same-dtype reference's error (+ RULE_ATOL);
    never for a non-finite error of ours."""
    return math.isfinite(ours) and ours <= RULE_FACTOR * same_dtype + RULE_ATOL


AttentionFn = Callable[..., torch.Tensor]


def run_case(
    case: Case,
    device: torch.device | str,
    *,
    attention_fn: AttentionFn | None = None,
    seed: int = SEED,
) -> dict:
    """Run one case on `device`: {"status": "refused", "reason", "error_type"} when
    `flash_attention` refuses the inputs (TypeError/ValueError from its forward), else
    {"status": "ok" | "failed", "errors": {name: {"ours", "same_dtype", "bound", "ok"}}} for
    name in out, dq, dk, dv (max abs errors against the float32 reference).

    `attention_fn` replaces `flash_attention` (same signature); the tests plant errors with it.
    Anything else that goes wrong (a kernel that cannot be built, an error in the backward)
    propagates: it is not a refusal.
    """
    if attention_fn is None:
        from project01_cuda_kernel.attention import flash_attention as attention_fn
    q, k, v, dout = make_inputs(case, device, seed)
    scale = 1.0 / math.sqrt(case.head_dim)  # flash_attention's default softmax_scale

    extra = {}  # only when set: an attention_fn without them still runs the plain cases
    if case.window != NO_WINDOW:
        extra["window_size"] = case.window
    if case.softcap:
        extra["softcap"] = case.softcap
    math_args = (case.causal, scale, case.window, case.softcap)

    leaves = _leaves(q, k, v)
    try:
        out = attention_fn(*leaves, causal="bottom_right" if case.causal else False, **extra)
    except (TypeError, ValueError) as e:
        return {"status": "refused", "reason": str(e), "error_type": type(e).__name__}
    ours = _out_and_grads(out, leaves, dout)
    del out, leaves

    with _ieee_float32_matmul():
        ref_leaves = _leaves(q.float(), k.float(), v.float())
        ref = _out_and_grads(attention_math(*ref_leaves, *math_args), ref_leaves, dout.float())
    same_leaves = _leaves(q, k, v)
    same = _out_and_grads(attention_math(*same_leaves, *math_args), same_leaves, dout)

    errors = {}
    for name, x, s, r in zip(TENSORS, ours, same, ref):
        err, err_same = max_abs_error(x, r), max_abs_error(s, r)
        errors[name] = {
            "ours": err,
            "same_dtype": err_same,
            "bound": RULE_FACTOR * err_same + RULE_ATOL,
            "ok": rule_holds(err, err_same),
        }
    status = "ok" if all(e["ok"] for e in errors.values()) else "failed"
    return {"status": status, "errors": errors}


# Integers that vary from case to case (shapes, lengths, head dims); not digits inside a name
# (torch.float16, sm_80) or an index (q.shape[-1]).
_NUMBER = re.compile(r"(?<![\w.\[\-])\d+(?![\w\]])")


def normalise_reason(reason: str) -> str:
    """The refusal message with its standalone numbers replaced by N, so refusals with the same
    cause and different shapes group together."""
    return _NUMBER.sub("N", reason)


def group_refusals(rows: Iterable[dict]) -> list[dict]:
    """[{"reason": normalised message, "count", "example": one raw message}], largest first."""
    groups: dict[str, dict] = {}
    for row in rows:
        if row["status"] != "refused":
            continue
        key = normalise_reason(row["reason"])
        group = groups.setdefault(key, {"reason": key, "count": 0, "example": row["reason"]})
        group["count"] += 1
    return sorted(groups.values(), key=lambda g: (-g["count"], g["reason"]))


def run_matrix(
    device: torch.device | str,
    cases: Iterable[Case] | None = None,
    *,
    on_case: Callable[[Case, dict], None] | None = None,
) -> dict:
    """Run `cases` (default: the whole MATRIX) on `device`; return the summary record:
    counts (cases, accepted = passed + failed, passed, failed, refused), the refusals grouped by
    normalised reason, the rule, and one row per case (its fields, id and `run_case` result).
    `on_case(case, result)` is called after each case (progress)."""
    cases = MATRIX if cases is None else tuple(cases)
    rows = []
    for case in cases:
        result = run_case(case, device)
        if on_case is not None:
            on_case(case, result)
        rows.append({"case": case.id, **asdict(case), **result})
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "refused")}
    return {
        "device": str(torch.device(device)),
        "rule": RULE,
        "cases": len(rows),
        "accepted": counts["ok"] + counts["failed"],
        "passed": counts["ok"],
        "failed": counts["failed"],
        "refused": counts["refused"],
        "refusals": group_refusals(rows),
        "rows": rows,
    }


def format_summary(summary: dict) -> str:
    """The counts, the refusal groups and every failed case with its errors, as text."""
    lines = [
        f"FlashAttention matrix on {summary['device']}: {summary['cases']} cases, "
        f"{summary['accepted']} accepted ({summary['passed']} passed, {summary['failed']} "
        f"failed), {summary['refused']} refused",
        f"rule: {summary['rule']}",
    ]
    if summary["refusals"]:
        lines.append("refused:")
        lines += [f"  {g['count']:5d}  {g['reason']}" for g in summary["refusals"]]
    for row in summary["rows"]:
        if row["status"] == "failed":
            bad = ", ".join(
                f"{name} {e['ours']:.3g} > {e['bound']:.3g}"
                for name, e in row["errors"].items()
                if not e["ok"]
            )
            lines.append(f"FAILED {row['case']}: {bad}")
    return "\n".join(lines)
