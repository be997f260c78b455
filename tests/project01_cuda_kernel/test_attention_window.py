"""CPU tier: sliding-window attention and logit soft-capping (flash_attention's window_size and
softcap), without a GPU.

What runs here: the mask definition (`attention.visible_keys`) against the formula itself,
element by element; the pure-PyTorch reference (`attention.reference_attention`) against a
per-row loop in float64 and through gradcheck; the operators' CPU implementation (float32,
rounded once) against that float64 reference, with a tolerance derived from the arithmetic; the
argument checks (one clear TypeError/ValueError, the same through the operator and
torch.compile); the choice of forward kernel (the Hopper forward has no window/softcap); and the
FlashAttention matrix harness with windows and softcap. The CUDA kernels themselves are checked
by the GPU tier (test_attention_gpu.py, "Sliding window and soft-capping").

The window, as in the flash-attn package: window_size = (left, right), -1 unbounded; query row i
(of Sq) sees key j (of Sk) iff i + Sk - Sq - left <= j <= i + Sk - Sq + right; causal means
right = 0 (and keeps its own diagonal: j <= i + causal offset).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
import torch

from project01_cuda_kernel import attention, flash_attention, ops
from project01_cuda_kernel.attention import (
    CAUSAL_VALUES,
    MAX_WINDOW,
    reference_attention,
    visible_keys,
)
from project01_cuda_kernel.bench import fa_matrix

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
LENGTHS = [1, 2, 5, 16, 17, 33]
WINDOW_SIDES = [-1, 0, 1, 3, 16, 40]


def brute_force_visible(sq: int, sk: int, causal, window) -> list[list[bool]]:
    """The definition, one (i, j) at a time (no tensors)."""
    left, right = window
    offset = {False: None, True: 0, "top_left": 0, "bottom_right": sk - sq}[causal]
    rows = []
    for i in range(sq):
        row = []
        for j in range(sk):
            ok = offset is None or j <= i + offset
            if left >= 0:
                ok = ok and j >= i + sk - sq - left
            if offset is None and right >= 0:  # causal replaces the right side
                ok = ok and j <= i + sk - sq + right
            row.append(ok)
        rows.append(row)
    return rows


def _cases_for_mask():
    for sq, sk, left, right in itertools.product(LENGTHS, LENGTHS, WINDOW_SIDES, WINDOW_SIDES):
        for causal in CAUSAL_VALUES:
            if causal is True and sq != sk:
                continue
            if causal == "top_left" and left >= 0 and sq != sk:
                continue  # refused (test_top_left_with_a_window_needs_equal_lengths)
            yield sq, sk, causal, (left, right)


def test_visible_keys_is_the_definition():
    """Exact, every (i, j) of 6 x 6 lengths x 6 x 6 window sides x the causal values."""
    n = 0
    for sq, sk, causal, window in _cases_for_mask():
        want = torch.tensor(brute_force_visible(sq, sk, causal, window))
        got = visible_keys(sq, sk, causal, window)
        if got is None:
            assert want.all(), (sq, sk, causal, window)
        else:
            assert torch.equal(got, want), (sq, sk, causal, window)
        n += 1
    assert n > 3000


def test_window_in_effect_means_a_key_is_hidden():
    """When `window_in_effect` is False the kernels' plain/causal instances run (the binding
    tests the same): then the window must hide nothing beyond the causal mask. And a window
    that hides a key must count as in effect (else the kernels would ignore it)."""
    for sq, sk, causal, window in _cases_for_mask():
        with_window = visible_keys(sq, sk, causal, window)
        without = visible_keys(sq, sk, causal, (-1, -1))
        full = torch.ones(sq, sk, dtype=torch.bool)
        same = torch.equal(
            full if with_window is None else with_window, full if without is None else without
        )
        if not attention.window_in_effect(causal, window, sq, sk):
            assert same, (sq, sk, causal, window)
        if not same:
            assert attention.uses_local_kernels(causal, window, 0.0, sq, sk)
    assert attention.uses_local_kernels(False, (-1, -1), 0.5, 4, 4)  # softcap alone


def loop_reference(q, k, v, causal, scale, window, softcap):
    """float64, one query row at a time: softmax over the visible keys only (0 when none)."""
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    vis = brute_force_visible(sq, sk, causal, window)
    out = torch.zeros(b, h, sq, d, dtype=torch.float64)
    for bi, hi, i in itertools.product(range(b), range(h), range(sq)):
        kh = hi // (h // hk)
        js = [j for j in range(sk) if vis[i][j]]
        if not js:
            continue
        s = torch.stack([scale * q[bi, hi, i].dot(k[bi, kh, j]) for j in js])
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        p = torch.softmax(s, dim=0)
        out[bi, hi, i] = sum(pj * v[bi, kh, j] for pj, j in zip(p, js))
    return out


REF_CASES = [  # (h, hk, sq, sk, causal, window, softcap)
    (2, 1, 7, 12, False, (2, 1), 0.0),
    (2, 2, 12, 7, False, (-1, 0), 0.0),  # rows 0..4 see no key
    (2, 1, 9, 9, True, (3, -1), 0.0),
    (4, 2, 5, 11, "bottom_right", (-1, -1), 1.5),
    (2, 2, 11, 5, "bottom_right", (2, 7), 0.7),  # causal: the right side 7 is ignored
    (1, 1, 6, 6, "top_left", (1, -1), 3.0),
    (2, 1, 8, 8, False, (0, 0), 0.0),  # one key a row
]


@pytest.mark.parametrize("case", REF_CASES, ids=str)
def test_reference_attention_matches_a_per_row_loop_in_float64(case):
    """Two float64 computations of the same sums in different orders: they agree to ~1e-15
    relative (values of order 1, at most 12 terms); 1e-12 absolute leaves a wide margin and no
    room for a wrong mask (errors O(1))."""
    h, hk, sq, sk, causal, window, softcap = case
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, h, sq, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, hk, sk, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, hk, sk, 8, generator=gen, dtype=torch.float64)
    scale = 0.4
    got = reference_attention(
        q, k, v, causal=causal, softmax_scale=scale, window_size=window, softcap=softcap
    )
    want = loop_reference(q, k, v, causal, scale, window, softcap)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", REF_CASES[:6], ids=str)
def test_reference_attention_gradients_are_its_derivative(case):
    """gradcheck (float64 finite differences, its default tolerances) through the mask, the
    soft-cap and the rows that see no key (whose gradient is exactly 0)."""
    h, hk, sq, sk, causal, window, softcap = case
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, n, s, 4, generator=gen, dtype=torch.float64).requires_grad_(True)
        for n, s in ((h, sq), (hk, sk), (hk, sk))
    )

    def fn(q, k, v):
        return reference_attention(
            q, k, v, causal=causal, softmax_scale=0.5, window_size=window, softcap=softcap
        )

    assert torch.autograd.gradcheck(fn, (q, k, v))


# (batch, heads, kv heads, seq_q, seq_k, head_dim, causal, window, softcap): windows smaller
# than a tile, left only, right only, both, with and without causal, Sq != Sk both ways, rows
# and keys that nothing sees, soft-capping alone and with a window, grouped k/v heads.
OP_CASES = [
    (1, 2, 2, 24, 24, 64, False, (3, 2), 0.0),
    (1, 2, 1, 16, 40, 64, False, (5, -1), 0.0),
    (1, 2, 2, 40, 16, 128, False, (-1, 4), 0.0),
    (2, 4, 2, 30, 30, 64, True, (6, -1), 0.0),
    (1, 2, 2, 20, 33, 64, "bottom_right", (7, 5), 0.0),
    (1, 2, 2, 33, 20, 128, "bottom_right", (100, -1), 0.0),
    (1, 2, 1, 24, 24, 64, False, (-1, -1), 30.0),
    (1, 2, 2, 20, 28, 64, "top_left", (-1, -1), 5.0),
    (1, 4, 2, 28, 20, 64, "bottom_right", (4, -1), 8.0),
]
OP_IDS = ["q{3}k{4}d{5}-{6}-w{7[0]}_{7[1]}-cap{8:g}".format(*c) for c in OP_CASES]


def op_inputs(case, dtype, requires_grad=True, seed=0):
    b, h, hk, sq, sk, d, *_ = case
    gen = torch.Generator().manual_seed(seed)
    softcap = case[8]
    # With a softcap, q scaled so the scores reach the cap (upstream's tests do q * softcap).
    q = torch.randn(b, h, sq, d, generator=gen) * (softcap / 4 if softcap else 1.0)
    k, v = (torch.randn(b, hk, sk, d, generator=gen) for _ in range(2))
    return tuple(t.to(dtype).requires_grad_(requires_grad) for t in (q, k, v))


@pytest.mark.parametrize("case", OP_CASES, ids=OP_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cpu_operator_matches_the_float64_reference(case, dtype):
    """Output, lse and the three gradients of the operators' CPU implementation against
    `reference_attention` in float64 on the same 16-bit inputs (exact in float64).

    Tolerance, from the arithmetic (as test_ops.test_cpu_reference_matches_sdpa_in_float64):
    the implementation works in float32 and rounds each result once to the 16-bit dtype (at most
    u |x|, u its unit roundoff); the gradients also read the output already rounded, in
    D = rowsum(dO * O) (a relative error u in D, entering dS = P (dP - D)). The soft-cap adds
    float32 tanh (relative error ~2^-23) times the cap: a score error of at most 30 * 2^-22 ~
    7e-6 here, which moves each probability by that relative amount, below the 2^-16 additive
    term at these magnitudes. So each tensor must be within 2 u max|exact| + 2^-16. lse: float32
    throughout, 1e-5 relative (+inf exactly on rows that see no key).
    """
    b, h, hk, sq, sk, d, causal, window, softcap = case
    q, k, v = op_inputs(case, dtype)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = flash_attention(q, k, v, causal=causal, window_size=window, softcap=softcap)
    out.backward(dout)
    exact_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    exact = reference_attention(*exact_in, causal=causal, window_size=window, softcap=softcap)
    exact.backward(dout.double())
    u = UNIT_ROUNDOFF[dtype]
    for name, x, y in zip(
        ("out", "dq", "dk", "dv"),
        (out, q.grad, k.grad, v.grad),
        (exact, *(t.grad for t in exact_in)),
    ):
        assert x.dtype == dtype and x.shape == y.shape, name
        err = (x.double() - y).abs().max().item()
        bound = 2 * u * y.abs().max().item() + 2.0**-16
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"

    code, scale = CAUSAL_VALUES.index(causal), d**-0.5
    _, lse = ops.flash_attn_fwd(q.detach(), k.detach(), v.detach(), code, scale, *window, softcap)
    q64, k64 = (t.detach() for t in exact_in[:2])
    k64 = k64.repeat_interleave(h // hk, dim=1)
    scores = q64 @ k64.transpose(-2, -1) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    keep = visible_keys(sq, sk, causal, window)
    if keep is not None:
        scores = scores.masked_fill(~keep, -math.inf)
    want = torch.logsumexp(scores, -1).nan_to_num(neginf=math.inf)
    torch.testing.assert_close(lse.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", OP_CASES[::2], ids=OP_IDS[::2])
def test_opcheck_with_window_and_softcap(case):
    """Schema, fake tensors, autograd registration and AOT dispatch with the new arguments."""
    b, h, hk, sq, sk, d, causal, window, softcap = case
    code, scale = CAUSAL_VALUES.index(causal), d**-0.5
    q, k, v = op_inputs(case, torch.bfloat16)
    torch.library.opcheck(ops.flash_attn_fwd, (q, k, v, code, scale, *window, softcap))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = ops.flash_attn_fwd(q, k, v, code, scale, *window, softcap)
    args = (torch.randn_like(out), q, k, v, out, lse, code, scale, *window, softcap)
    torch.library.opcheck(ops.flash_attn_bwd, args)


def test_defaults_are_no_window_and_no_softcap():
    """window_size=(-1, -1) and softcap=0 are the plain operator, bit for bit; so is a window
    that hides nothing (left >= Sk - 1, right >= Sq - 1)."""
    q, k, v = op_inputs((1, 2, 2, 12, 20, 64, False, (-1, -1), 0.0), torch.bfloat16, False)
    plain = flash_attention(q, k, v)
    assert torch.equal(flash_attention(q, k, v, window_size=(-1, -1), softcap=0.0), plain)
    assert torch.equal(flash_attention(q, k, v, window_size=(19, 11)), plain)
    assert torch.equal(flash_attention(q, k, v, window_size=[MAX_WINDOW, MAX_WINDOW]), plain)
    assert torch.equal(
        ops.flash_attn_fwd(q, k, v, 0, 0.125, -1, -1, 0.0)[0],
        ops.flash_attn_fwd(q, k, v, 0, 0.125)[0],
    )
    causal = flash_attention(q, k, v, causal="bottom_right")
    # causal: the right side is ignored (causal means right = 0).
    assert torch.equal(flash_attention(q, k, v, causal="bottom_right", window_size=(-1, 5)), causal)
    assert not torch.equal(flash_attention(q, k, v, window_size=(3, 0)), causal)


def test_rows_and_keys_outside_every_window():
    """Rows that see no key: output 0, no gradient, lse +inf. Keys that no row sees: dk = dv = 0.
    Nothing is NaN."""
    # Sq 20 > Sk 6, window (-1, 0): row i sees keys j <= i - 14, so rows 0..13 see none.
    q, k, v = op_inputs((1, 2, 1, 20, 6, 64, False, (-1, 0), 0.0), torch.bfloat16)
    out = flash_attention(q, k, v, window_size=(-1, 0), softcap=4.0)
    out.float().square().sum().backward()
    for t in (out, q.grad, k.grad, v.grad):
        assert torch.isfinite(t).all()
    assert not out[:, :, :14].any() and not q.grad[:, :, :14].any()
    assert out[:, :, 14:].abs().amax(-1).min() > 0
    _, lse = ops.flash_attn_fwd(q.detach(), k.detach(), v.detach(), 0, 0.125, -1, 0, 4.0)
    assert torch.isposinf(lse[:, :, :14]).all() and torch.isfinite(lse[:, :, 14:]).all()
    # Sq 6 < Sk 20, window (2, 0): row i sees keys i + 12 .. i + 14, so keys 0..11 are unseen.
    q, k, v = op_inputs((1, 2, 1, 6, 20, 64, False, (2, 0), 0.0), torch.bfloat16)
    flash_attention(q, k, v, window_size=(2, 0)).float().square().sum().backward()
    assert not k.grad[:, :, :12].any() and not v.grad[:, :, :12].any()
    assert k.grad[:, :, 12:].abs().amax(-1).min() > 0


def test_compiled_with_window_and_softcap_has_no_graph_break():
    """torch.compile(fullgraph=True) through the operator with a window and softcap: the same
    numbers as eager (aot_eager runs the same CPU implementation: exact)."""

    def fn(q, k, v):
        return flash_attention(q, k, v, causal="bottom_right", window_size=(5, -1), softcap=7.0)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    q, k, v = op_inputs((1, 2, 1, 9, 13, 64, "bottom_right", (5, -1), 7.0), torch.bfloat16)
    results = []
    for f in (compiled, fn):
        for t in (q, k, v):
            t.grad = None
        o = f(q, k, v)
        o.float().square().sum().backward()
        results.append([o, q.grad, k.grad, v.grad])
    for got, want in zip(*results):
        assert torch.equal(got, want)


# --------------------------------------------------------------------------------------------
# Argument checks


def qkv(sq=8, sk=8):
    return tuple(torch.randn(1, 2, s, 64).bfloat16() for s in (sq, sk, sk))


@pytest.mark.parametrize(
    ("window", "exc", "match"),
    [
        ((3,), TypeError, r"window_size must be a \(left, right\) tuple"),
        ((1, 2, 3), TypeError, r"window_size must be a \(left, right\) tuple"),
        (4, TypeError, r"window_size must be a \(left, right\) tuple"),
        (None, TypeError, r"window_size must be a \(left, right\) tuple"),
        ((1.0, 2), TypeError, "window_size left must be an int"),
        ((1, True), TypeError, "window_size right must be an int"),
        ((1, "2"), TypeError, "window_size right must be an int"),
        ((-2, 0), ValueError, r"window_size left must be -1 \(unbounded\) or between 0 and"),
        ((0, -5), ValueError, r"window_size right must be -1 \(unbounded\) or between 0 and"),
        ((2**31, 0), ValueError, "window_size left must be -1"),
    ],
)
def test_bad_window_size(window, exc, match):
    q, k, v = qkv()
    with pytest.raises(exc, match=match):
        flash_attention(q, k, v, window_size=window)


@pytest.mark.parametrize(
    ("softcap", "exc"),
    [
        (-1.0, ValueError),
        (-1e-30, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("1.0", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_softcap(softcap, exc):
    q, k, v = qkv()
    with pytest.raises(exc, match="softcap must be"):
        flash_attention(q, k, v, softcap=softcap)


def test_good_values_are_accepted():
    q, k, v = qkv()
    for window in [(-1, -1), (0, 0), [3, -1], (-1, 2), (MAX_WINDOW, 0)]:
        assert flash_attention(q, k, v, window_size=window).shape == q.shape
    for softcap in (0, 0.0, 1, 50.0, 1e-3):
        assert flash_attention(q, k, v, softcap=softcap).shape == q.shape


def test_top_left_with_a_window_needs_equal_lengths():
    """The window is aligned bottom-right; with causal='top_left' the two alignments agree only
    when Sq == Sk. A window with only a right side is fine (causal ignores it)."""
    q, k, v = qkv(sq=8, sk=12)
    with pytest.raises(ValueError, match="window_size is aligned bottom-right"):
        flash_attention(q, k, v, causal="top_left", window_size=(3, -1))
    assert flash_attention(q, k, v, causal="top_left", window_size=(-1, 2)).shape == q.shape
    assert flash_attention(q, k, v, causal="bottom_right", window_size=(3, -1)).shape == q.shape
    q, k, v = qkv(sq=10, sk=10)
    assert torch.equal(
        flash_attention(q, k, v, causal="top_left", window_size=(3, -1)),
        flash_attention(q, k, v, causal="bottom_right", window_size=(3, -1)),
    )


def test_bad_window_and_softcap_through_the_operator_and_torch_compile():
    """The operator (eager and fake, so torch.compile refuses at trace time) checks them too."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="window_size left must be -1"):
        ops.flash_attn_fwd(q, k, v, 0, 0.125, -3, -1, 0.0)
    with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
        ops.flash_attn_fwd(q, k, v, 0, 0.125, -1, -1, -2.0)
    out, lse = ops.flash_attn_fwd(q, k, v, 0, 0.125)
    with pytest.raises(ValueError, match="window_size right must be -1"):
        ops.flash_attn_bwd(out, q, k, v, out, lse, 0, 0.125, -1, -7, 0.0)
    with pytest.raises(ValueError, match="softcap must be finite and >= 0"):
        torch.compile(lambda q, k, v: flash_attention(q, k, v, softcap=-1.0), backend="eager")(
            q, k, v
        )
    with pytest.raises(ValueError, match="window_size left must be -1"):
        torch.compile(
            lambda q, k, v: flash_attention(q, k, v, window_size=(-4, 0)), backend="eager"
        )(q, k, v)


def test_hopper_forward_is_not_used_for_windows_or_softcap(monkeypatch):
    """The Hopper forward has neither: "auto" picks the FlashAttention-2 forward whenever one is
    in effect (even on a Hopper GPU), an explicit "hopper" is refused."""
    monkeypatch.setattr(attention, "is_hopper", lambda: True)
    assert attention.select_fwd_kernel("auto", local=False) == "hopper"
    assert attention.select_fwd_kernel("auto", local=True) == "fa2"
    assert attention.select_fwd_kernel("fa2", local=True) == "fa2"
    with pytest.raises(ValueError, match="kernel='hopper' does not implement window_size"):
        attention.select_fwd_kernel("hopper", local=True)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="kernel='hopper' does not implement window_size"):
        attention.flash_forward(q, k, v, False, 0.125, kernel="hopper", softcap=2.0)


# --------------------------------------------------------------------------------------------
# The FlashAttention matrix harness with windows and softcap


def test_matrix_mask_is_the_same_definition():
    """fa_matrix.attention_math writes its own mask (upstream's construction); in float64 it
    gives reference_attention's answer (two float64 computations: 1e-12)."""
    rng = random.Random(0)
    for _ in range(40):
        sq, sk = rng.choice(LENGTHS), rng.choice(LENGTHS)
        window = (rng.choice(WINDOW_SIDES), rng.choice(WINDOW_SIDES))
        causal = rng.choice([False, True])
        softcap = rng.choice([0.0, 2.0])
        gen = torch.Generator().manual_seed(rng.randrange(1000))
        q, k, v = (
            torch.randn(1, 2, s, 8, generator=gen, dtype=torch.float64) for s in (sq, sk, sk)
        )
        got = fa_matrix.attention_math(q, k, v, causal, 0.3, window, softcap)
        want = reference_attention(
            q,
            k,
            v,
            causal="bottom_right" if causal else False,
            softmax_scale=0.3,
            window_size=window,
            softcap=softcap,
        )
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_matrix_accepts_windows_and_softcap():
    """The plain matrix is unchanged (ids, count); cases with a window or softcap get their own
    ids, run on CPU through the operator's reference and meet the rule."""
    assert len(fa_matrix.MATRIX) == 1440
    assert all(c.window == (-1, -1) and c.softcap == 0.0 for c in fa_matrix.MATRIX)
    assert fa_matrix.MATRIX[0].id == "d32-113x203-mha-full-fp16"
    cases = fa_matrix.matrix_cases(
        head_dims=(64,),
        seqlen_pairs=((113, 203), (203, 113)),
        mha_types=("gqa",),
        causal=(False, True),
        dtypes=("bfloat16",),
        windows=((-1, -1), (17, 5)),
        softcaps=(0.0, 50.0),
    )
    assert len(cases) == 16 and len({c.id for c in cases}) == 16
    capped = next(c for c in cases if c.window == (17, 5) and c.softcap == 50.0 and c.causal)
    assert capped.id == "d64-113x203-gqa-causal-w17_5-cap50-bf16"
    windowed = next(c for c in cases if c.window == (17, 5) and not c.softcap)
    for case in (capped, windowed):
        result = fa_matrix.run_case(replace(case, batch=1), "cpu")
        assert result["status"] == "ok", result
        for e in result["errors"].values():
            assert e["ok"] and e["same_dtype"] > 0  # the same-dtype math really rounds


# --------------------------------------------------------------------------------------------
# The kernels' window arithmetic, transcribed


def _c_div(a: int, b: int) -> int:
    """C's integer division (truncates toward zero), as the kernels divide."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _window_offsets(causal, sq: int, sk: int, window) -> tuple[bool, int, int]:
    """flash_binding.cpp's set_window: (local, window_lo, window_hi)."""
    left, right = window
    pad = 256  # flash_api.h's kWindowPad
    left_bounded = 0 <= left < sk
    right_bounded = causal is False and 0 <= right < sq
    offset = attention.causal_offset(causal, sq, sk)
    hi = offset if offset is not None else (sk - sq + right if right_bounded else sk)
    lo = sk - sq - left if left_bounded else -sq - pad
    return left_bounded or right_bounded, max(lo, -sq - pad), min(hi, sk)


def _forward_tiles(sq, sk, bm, bn, lo, hi):
    """flash_fwd_kernel.cuh (LOCAL): each CTA's key-block range, need_mask and element mask;
    returns how often each (row, key) was computed unmasked."""
    seen = torch.zeros(sq, sk, dtype=torch.int32)
    for m0 in range(0, sq, bm):
        n_blocks = min(_c_div(sk + bn - 1, bn), max(0, _c_div(m0 + bm + hi + bn - 1, bn)))
        n_begin = _c_div(max(0, m0 + lo), bn)
        if n_begin >= n_blocks:
            n_begin = n_blocks = 0
        for n0 in range(n_begin * bn, n_blocks * bn, bn):
            need = n0 + bn > sk or n0 + bn - 1 - m0 > hi or n0 - (m0 + bm - 1) < lo
            row = torch.arange(m0, m0 + bm).unsqueeze(1)
            col = torch.arange(n0, n0 + bn).unsqueeze(0)
            masked = (col >= sk) | (col - row > hi) | (col - row < lo)
            assert need or not masked.any(), "a block that needs a mask skipped it"
            keep = ~masked & (row < sq)
            r, c = keep.nonzero(as_tuple=True)
            seen[r + m0, c + n0] += 1
    return seen


def _backward_tiles(sq, sk, bm, bn, lo, hi):
    """flash_bwd_kernel.cuh (LOCAL): each CTA's query-block range (m_begin, the break), need_mask
    and element mask, both spellings (sm_90's unsigned comparison and the others' two)."""
    seen = torch.zeros(sq, sk, dtype=torch.int32)
    m_blocks = _c_div(sq + bm - 1, bm)
    for n0 in range(0, sk, bn):
        for mb in range(_c_div(max(0, n0 - hi), bm), m_blocks):
            if mb * bm > n0 + bn - 1 - lo:
                break
            m0 = mb * bm
            need = n0 + bn > sk or m0 + bm > sq or n0 + bn - 1 - m0 > hi or n0 - (m0 + bm - 1) < lo
            key = torch.arange(n0, n0 + bn).unsqueeze(1)
            row = torch.arange(m0, m0 + bm).unsqueeze(0)
            two = (key - row > hi) | (key - row < lo)
            one = ((key - row - lo) & 0xFFFFFFFF) > ((hi - lo) & 0xFFFFFFFF)
            assert torch.equal(one, two)
            masked = (key >= sk) | (row >= sq) | two
            assert need or not masked.any(), "a block that needs a mask skipped it"
            k, r = (~masked).nonzero(as_tuple=True)
            seen[r + m0, k + n0] += 1
    return seen


def test_kernel_window_arithmetic_visits_every_visible_pair_once():
    """A transcription of the kernels' index arithmetic (keep it in step with
    flash_fwd_kernel.cuh, flash_bwd_kernel.cuh and set_window in flash_binding.cpp): with the
    host's offsets, the forward's key-block ranges and the backward's query-block ranges, every
    (row, key) the definition makes visible is computed unmasked exactly once and nothing else
    is; no block that needs a mask skips it; a window the host calls "not local" hides nothing
    beyond the causal mask. Random lengths, windows and causal values; the kernels' tile sizes
    (forward BM x BN: 128 x 32, 128 x 64, 64 x 64, 64 x 128; backward 64 x 64 and 64 x 128)."""
    rng = random.Random(1)
    sides = [-1, 0, 1, 3, 16, 31, 33, 64, 100, 129, 300]
    for _ in range(120):
        sq, sk = rng.choice([1, 2, 17, 64, 65, 127, 130, 200]), rng.choice([1, 3, 33, 64, 129, 200])
        window = (rng.choice(sides), rng.choice(sides))
        causal = rng.choice([False, "bottom_right"] + ([True, "top_left"] if sq == sk else []))
        local, lo, hi = _window_offsets(causal, sq, sk, window)
        assert lo <= hi
        want = torch.tensor(brute_force_visible(sq, sk, causal, window), dtype=torch.int32)
        if not local:
            assert attention.window_in_effect(causal, window, sq, sk) is False
            plain = visible_keys(sq, sk, causal, (-1, -1))
            assert torch.equal(
                want.bool(), torch.ones_like(want.bool()) if plain is None else plain
            )
        bm, bn = rng.choice([(128, 32), (128, 64), (64, 64), (64, 128)])
        assert torch.equal(_forward_tiles(sq, sk, bm, bn, lo, hi), want), (sq, sk, causal, window)
        bn = rng.choice([64, 128])
        assert torch.equal(_backward_tiles(sq, sk, 64, bn, lo, hi), want), (sq, sk, causal, window)
