"""GPU tier (Hopper only): the wgmma/TMA backward (`flash_backward(..., bwd_kernel="hopper")`,
csrc/attention/flash_bwd_hopper.cuh) against the float32 reference and against the
FlashAttention-2 backward.

Pass rule (FlashAttention's, as test_attention_gpu.py applies it to the FlashAttention-2
backward): the max abs error of each gradient against the float32 reference is at most twice
that of the same math run by PyTorch in the half dtype, plus 1e-5 absolute. The forward is the
"auto" one (the Hopper forward on these GPUs); its out and lse feed both backwards.
"""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel.attention import HOPPER_HEAD_DIMS

from .test_attention_gpu import max_err, reference_gqa, run_with_grads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
        reason="the Hopper backward needs compute capability 9.0",
    ),
]

DTYPES = [torch.bfloat16, torch.float16]
# (heads, kv heads): GQA ratios 1 (multi-head), 2, 4 and 8 (8 query heads over one k/v head: MQA).
HEADS = [(8, 8), (8, 4), (8, 2), (8, 1)]
# (seq_q, seq_k): odd lengths (none a multiple of the 64-row query step or the 128-key block),
# equal and unequal both ways (bottom-right with Sq > Sk: rows that see no key, whole query steps
# of them; top-left with Sq < Sk: keys no row sees, whole 128-key CTAs of them), one exact
# multiple of both tiles, a single query row.
LENGTHS = [
    (113, 113),
    (1000, 1000),
    (1041, 1041),
    (113, 1000),
    (1000, 113),
    (1041, 777),
    (256, 256),
    (1, 300),
]
CAUSAL = [False, "top_left", "bottom_right"]


def make(dtype, d, h, hk, sq, sk, seed, b=2):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    k = torch.randn(b, hk, sk, d, device="cuda", generator=gen, dtype=dtype)
    v = torch.randn(b, hk, sk, d, device="cuda", generator=gen, dtype=dtype)
    do = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    return q, k, v, do


def check_hopper_bwd(dtype, d, h, hk, sq, sk, causal, *, ref_fn=reference_gqa, seed=13):
    """Failures (empty when dq, dk, dv all pass the rule) of the Hopper backward."""
    from project01_cuda_kernel.attention import causal_offset, flash_backward, flash_forward

    q, k, v, do = make(dtype, d, h, hk, sq, sk, seed)
    scale = d**-0.5
    out, lse = flash_forward(q, k, v, causal, scale)
    grads = flash_backward(do, q, k, v, out, lse, causal, scale, bwd_kernel="hopper")
    ref = run_with_grads(
        lambda q, k, v: ref_fn(q, k, v, causal, scale), *(t.float() for t in (q, k, v, do))
    )[1:]
    same = run_with_grads(lambda q, k, v: ref_fn(q, k, v, causal, scale), q, k, v, do)[1:]
    failures = []
    for name, x, y, r, like in zip(("dq", "dk", "dv"), grads, same, ref, (q, k, v)):
        assert x.shape == like.shape and x.dtype == dtype, name
        if not torch.isfinite(x).all():
            failures.append(f"{name} has NaN/inf")
            continue
        err, err_same = max_err(x, r), max_err(y, r)
        if err > 2 * err_same + 1e-5:
            failures.append(f"{name}: max error {err:.3e} vs same-dtype math's {err_same:.3e}")
    offset = causal_offset(causal, sq, sk)
    if offset is not None and offset < 0 and grads[0][:, :, :-offset].abs().max() != 0:
        failures.append("dq of rows that see no key is not 0")
    return failures


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HOPPER_HEAD_DIMS)
@pytest.mark.parametrize("h,hk", HEADS, ids=lambda x: str(x))
@pytest.mark.parametrize("causal", CAUSAL, ids=str)
@pytest.mark.parametrize("sq,sk", LENGTHS, ids=lambda x: str(x))
def test_hopper_backward_matches_reference(dtype, d, h, hk, causal, sq, sk):
    failures = check_hopper_bwd(dtype, d, h, hk, sq, sk, causal)
    assert not failures, failures


@pytest.mark.smoke  # the Hopper backward once: GQA, bottom-right, odd lengths
def test_hopper_backward_smoke():
    assert not check_hopper_bwd(torch.bfloat16, 128, 8, 2, 1041, 777, "bottom_right")


def test_hopper_backward_check_catches_planted_errors():
    """The comparison is not vacuous: the other grouping of k/v heads (torch.repeat's tiling)
    and the other causal alignment fail it."""

    def tiled_heads(q, k, v, causal, scale):
        group = q.shape[1] // k.shape[1]
        return reference_gqa(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), causal, scale)

    def top_left(q, k, v, causal, scale):
        return reference_gqa(q, k, v, "top_left", scale)

    assert check_hopper_bwd(torch.bfloat16, 64, 8, 2, 300, 500, False, ref_fn=tiled_heads)
    assert check_hopper_bwd(torch.bfloat16, 64, 8, 2, 300, 500, "bottom_right", ref_fn=top_left)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HOPPER_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, "bottom_right"], ids=str)
@pytest.mark.parametrize("sq,sk,h,hk", [(1041, 777, 8, 2), (4096, 4096, 4, 4)], ids=str)
def test_dq_by_tma_reduce_equals_dq_by_atomics(monkeypatch, dtype, d, causal, sq, sk, h, hk):
    """The two dQ forms of the kernel (TMA reduce-adds of a shared-memory tile, the default, and
    float2 atomics from registers, P01_HOPPER_BWD_DQ=atomic) add the same float32 partials (one
    per 128-key block, computed identically) to dq_accum in other orders. dk and dv do not depend
    on the form: bitwise equal. dq: the float32 sums differ by reordering only (each add rounds
    by at most 2^-24 of the running sum, a few hundred adds), so after the one rounding to the
    half dtype they differ by at most one of its ulps at the largest |dq| (finfo.eps x max|dq|).
    Odd lengths and 2 x 8 heads put partial query blocks next to other heads' rows: the TMA must
    skip the rows past Sq, not add them to the next head."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    q, k, v, do = make(dtype, d, h, hk, sq, sk, seed=23)
    scale = d**-0.5
    out, lse = flash_forward(q, k, v, causal, scale)
    monkeypatch.delenv("P01_HOPPER_BWD_DQ", raising=False)
    tma = flash_backward(do, q, k, v, out, lse, causal, scale, bwd_kernel="hopper")
    monkeypatch.setenv("P01_HOPPER_BWD_DQ", "atomic")
    atomic = flash_backward(do, q, k, v, out, lse, causal, scale, bwd_kernel="hopper")
    assert torch.equal(tma[1], atomic[1]) and torch.equal(tma[2], atomic[2])
    dq_tma, dq_atomic = tma[0].float(), atomic[0].float()
    assert torch.isfinite(dq_tma).all()
    bound = torch.finfo(dtype).eps * dq_atomic.abs().max().item()
    assert (dq_tma - dq_atomic).abs().max().item() <= bound


# Longer sequences too (the target shapes are seq >= 4k): B = 1, 4 heads.
AGREE_SHAPES = [(1041, 1041, 8, 2), (4096, 4096, 4, 4), (4096, 4096, 8, 1), (2000, 4096, 4, 2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HOPPER_HEAD_DIMS)
@pytest.mark.parametrize("causal", CAUSAL, ids=str)
@pytest.mark.parametrize("sq,sk,h,hk", AGREE_SHAPES, ids=lambda x: str(x))
def test_hopper_and_fa2_backward_agree(dtype, d, causal, sq, sk, h, hk):
    """The Hopper and FlashAttention-2 backwards on the same forward output differ by at most
    twice the same-dtype math's error against the float32 reference (+1e-5), gradient by
    gradient, and each passes that rule against the reference itself."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    q, k, v, do = make(dtype, d, h, hk, sq, sk, seed=17, b=1)
    scale = d**-0.5
    out, lse = flash_forward(q, k, v, causal, scale)
    hop = flash_backward(do, q, k, v, out, lse, causal, scale, bwd_kernel="hopper")
    fa2 = flash_backward(do, q, k, v, out, lse, causal, scale, bwd_kernel="fa2")
    ref = run_with_grads(
        lambda q, k, v: reference_gqa(q, k, v, causal, scale),
        *(t.float() for t in (q, k, v, do)),
    )[1:]
    same = run_with_grads(lambda q, k, v: reference_gqa(q, k, v, causal, scale), q, k, v, do)[1:]
    for name, x, y, r, s in zip(("dq", "dk", "dv"), hop, fa2, ref, same):
        assert torch.isfinite(x).all(), f"{name} has NaN/inf"
        bound = 2 * max_err(s, r) + 1e-5
        assert max_err(x, y) <= bound, f"{name}: hopper - fa2 {max_err(x, y):.3e} > {bound:.3e}"
        assert max_err(x, r) <= bound, f"{name}: hopper error {max_err(x, r):.3e} > {bound:.3e}"


@pytest.mark.parametrize("d", HOPPER_HEAD_DIMS)
def test_poisoned_gradients_are_overwritten(d):
    """NaN-filled dq, dk, dv are fully written: rows that see no key (bottom-right, Sq > Sk: dq =
    0), keys that no row sees (top-left, Sq < Sk: whole CTAs with no query block, dk = dv = 0),
    and the ragged ends of both."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    for sq, sk, causal, hk in ((700, 150, "bottom_right", 3), (150, 700, "top_left", 1)):
        q, k, v, do = make(torch.bfloat16, d, 3, hk, sq, sk, seed=19)
        out, lse = flash_forward(q, k, v, causal, 0.1)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        flash_backward(
            *(do, q, k, v, out, lse, causal, 0.1),
            dq=grads[0],
            dk=grads[1],
            dv=grads[2],
            bwd_kernel="hopper",
        )
        for name, g in zip(("dq", "dk", "dv"), grads):
            assert torch.isfinite(g).all(), f"{name} not fully written ({sq}, {sk}, {causal})"
        if causal == "top_left":  # keys sq.. are seen by no row
            assert grads[1][:, :, sq:].abs().max() == 0 and grads[2][:, :, sq:].abs().max() == 0


def test_strided_inputs_and_dout():
    """q/k/v views of a fused projection and a non-contiguous dout (copied by flash_backward)
    give what contiguous copies give: dk, dv bit for bit (no atomics), dq to float32 atomics'
    reordering."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    b, s, h, hk, d = 2, 333, 8, 2, 128
    gen = torch.Generator(device="cuda").manual_seed(23)
    fused = torch.randn(b, s, h + 2 * hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = fused.transpose(1, 2).split([h, hk, hk], dim=1)
    do = torch.randn(b, h, d, s, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(2, 3)
    for causal in (False, "bottom_right"):
        out, lse = flash_forward(q, k, v, causal, d**-0.5)
        got = flash_backward(do, q, k, v, out, lse, causal, d**-0.5, bwd_kernel="hopper")
        want = flash_backward(
            *(t.contiguous() for t in (do, q, k, v, out)),
            *(lse, causal, d**-0.5),
            bwd_kernel="hopper",
        )
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        torch.testing.assert_close(got[0], want[0], atol=2e-2, rtol=1e-2)


def test_refusals_on_hopper():
    """On the GPU it runs on, the Hopper backward still refuses what it does not implement,
    naming bwd_kernel: a window, softcap, head dim 256."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    q, k, v, do = make(torch.bfloat16, 64, 2, 2, 200, 200, seed=29)
    out, lse = flash_forward(q, k, v, False, 0.125, window_size=(16, 0))
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        flash_backward(
            do, q, k, v, out, lse, False, 0.125, window_size=(16, 0), bwd_kernel="hopper"
        )
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        flash_backward(do, q, k, v, out, lse, False, 0.125, softcap=20.0, bwd_kernel="hopper")
    q, k, v, do = make(torch.bfloat16, 256, 2, 2, 64, 64, seed=29)
    out, lse = flash_forward(q, k, v, False, 0.0625)
    with pytest.raises(ValueError, match="bwd_kernel='hopper' is compiled for head dims"):
        flash_backward(do, q, k, v, out, lse, False, 0.0625, bwd_kernel="hopper")


def test_scores_far_below_zero_do_not_overflow():
    """Every score -128 (q = -1, k = 1, scale 1, head dim 128): lse is about -123, so for the
    zero-filled keys past Sk (201 is not a multiple of the 128-key block) exp(0 - lse) would be
    inf in float32; the key mask of the last block keeps it out of dS and dQ. The gradients are
    finite and agree with the FlashAttention-2 backward's."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    _, _, v, do = make(torch.bfloat16, 128, 2, 2, 300, 201, seed=31)
    q = -torch.ones(2, 2, 300, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.ones(2, 2, 201, 128, device="cuda", dtype=torch.bfloat16)
    for causal in (False, "bottom_right"):
        out, lse = flash_forward(q, k, v, causal, 1.0)
        hop = flash_backward(do, q, k, v, out, lse, causal, 1.0, bwd_kernel="hopper")
        fa2 = flash_backward(do, q, k, v, out, lse, causal, 1.0, bwd_kernel="fa2")
        for name, x, y in zip(("dq", "dk", "dv"), hop, fa2):
            assert torch.isfinite(x).all(), f"{name} has NaN/inf ({causal})"
            torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2, msg=f"{name} ({causal})")
