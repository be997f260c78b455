"""Variable-length (packed sequences) attention: `flash_attention_varlen`.

CPU tier: the reference (each sequence through `reference_attention`, concatenated) against
per-sequence `reference_attention` calls, the operator's CPU implementation (float32) against the
float64 reference, gradients, and the argument checks (metadata-only ones and value ones). GPU
tier (`@pytest.mark.gpu`, not yet run on a GPU): the VARLEN kernel instances, forward and
backward, against the float64 reference, and bitwise against `flash_attention` run per sequence.
"""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel import attention
from project01_cuda_kernel.attention import (
    flash_attention,
    flash_attention_varlen,
    reference_attention,
    reference_attention_varlen,
)

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def cu(lengths, device="cpu"):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def packed(lq, lk, h, hk, d, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), h, d, generator=g).to(device, dtype)
    k = torch.randn(sum(lk), hk, d, generator=g).to(device, dtype)
    v = torch.randn(sum(lk), hk, d, generator=g).to(device, dtype)
    return q, k, v


# (query lengths, key lengths): ragged with length 1 and one longer than a tile, an empty
# sequence (query and key), Sq != Sk per sequence.
CASES = {
    "ragged": ([1, 7, 130, 64], [1, 7, 130, 64]),
    "empty": ([5, 0, 9, 3], [5, 0, 9, 0]),
    "unequal": ([3, 40, 1, 70], [9, 33, 150, 70]),
}
MASKS = [  # (causal, window_size, softcap)
    (False, (-1, -1), 0.0),
    (True, (-1, -1), 0.0),
    (False, (8, 3), 0.0),
    (True, (16, -1), 0.0),
    (True, (-1, -1), 5.0),
]


# ---- CPU tier ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("causal,window,softcap", MASKS, ids=str)
def test_reference_is_per_sequence_reference(case, causal, window, softcap):
    lq, lk = CASES[case]
    q, k, v = packed(lq, lk, 4, 2, 16, torch.float64)
    cq, ck = cu(lq), cu(lk)
    got = reference_attention_varlen(
        q, k, v, cq, ck, causal=causal, window_size=window, softcap=softcap
    )
    assert got.shape == q.shape
    for b in range(len(lq)):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        if q1 == q0:
            continue
        seq = [t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q1], k[k0:k1], v[k0:k1])]
        want = reference_attention(
            *seq, causal="bottom_right" if causal else False, window_size=window, softcap=softcap
        )
        torch.testing.assert_close(got[q0:q1], want.squeeze(0).transpose(0, 1))
    if case == "empty":  # queries of the sequence with no keys output 0
        assert got[14:17].abs().max() == 0


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("causal,window,softcap", MASKS, ids=str)
def test_cpu_operator_matches_float64_reference(case, causal, window, softcap):
    lq, lk = CASES[case]
    q, k, v = packed(lq, lk, 4, 2, 16, torch.bfloat16, seed=1)
    cq, ck = cu(lq), cu(lk)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_varlen(
        *leaves, cq, ck, max(lq), max(lk), causal=causal, window_size=window, softcap=softcap
    )
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = reference_attention_varlen(
        *ref_leaves, cq, ck, causal=causal, window_size=window, softcap=softcap
    )
    do = torch.randn(q.shape, dtype=torch.float64)
    out.backward(do.to(out.dtype))
    ref.backward(do)
    tol = 4 * UNIT_ROUNDOFF[torch.bfloat16]
    torch.testing.assert_close(out.double(), ref, atol=tol * 4, rtol=tol)
    for a, r in zip(leaves, ref_leaves):
        scale = r.grad.abs().max().item() + 1e-6
        assert (a.grad.double() - r.grad).abs().max().item() <= 8 * tol * scale


def test_max_seqlen_none_reads_cu_seqlens():
    lq, lk = CASES["unequal"]
    q, k, v = packed(lq, lk, 2, 2, 8, torch.float16)
    a = flash_attention_varlen(q, k, v, cu(lq), cu(lk))
    b = flash_attention_varlen(q, k, v, cu(lq), cu(lk), max(lq), max(lk))
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def _args(**over):
    lq, lk = [3, 5], [4, 6]
    q, k, v = packed(lq, lk, 4, 2, 16, torch.float16)
    args = dict(
        q=q, k=k, v=v, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), max_seqlen_q=5, max_seqlen_k=6
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over,exc,match",
    [
        (dict(cu_seqlens_q=cu([3, 5]).long()), TypeError, "cu_seqlens_q must be torch.int32"),
        (dict(cu_seqlens_k=cu([4, 6]).view(1, 3)), ValueError, "cu_seqlens_k must be 1-D"),
        (dict(cu_seqlens_k=cu([4, 3, 3])), ValueError, "same length"),
        (
            dict(cu_seqlens_q=torch.tensor([1, 4, 8], dtype=torch.int32)),
            ValueError,
            "must start at 0",
        ),
        (
            dict(cu_seqlens_q=torch.tensor([0, 4, 7], dtype=torch.int32)),
            ValueError,
            "must end at the total number of tokens 8",
        ),
        (
            dict(cu_seqlens_q=torch.tensor([0, 9, 8], dtype=torch.int32)),
            ValueError,
            "non-decreasing",
        ),
        (dict(max_seqlen_q=4), ValueError, "max_seqlen_q must be at least"),
        (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0"),
        (dict(max_seqlen_k=2.0), TypeError, "max_seqlen_k must be an int"),
        (dict(q=torch.zeros(8, 4, 4, 16, dtype=torch.float16)), ValueError, "3 dimensions"),
        (dict(k=torch.zeros(10, 3, 16, dtype=torch.float16)), ValueError, "k and v must have"),
    ],
)
def test_validation(over, exc, match):
    with pytest.raises(exc, match=match):
        flash_attention_varlen(**_args(**over))


def test_top_left_refused_and_bottom_right_accepted():
    with pytest.raises(ValueError, match="bottom-right"):
        flash_attention_varlen(**_args(), causal="top_left")
    a = flash_attention_varlen(**_args(), causal="bottom_right")
    b = flash_attention_varlen(**_args(), causal=True)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_fake_shapes_and_metadata_checks_need_no_values():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = _args()
        q, k, v = a["q"], a["k"], a["v"]
        out, lse = torch.ops.project01.flash_attn_varlen_fwd(
            q, k, v, a["cu_seqlens_q"], a["cu_seqlens_k"], 5, 6, 1, 0.25
        )
        assert out.shape == q.shape and lse.shape == (4, 8) and lse.dtype == torch.float32
        dq, dk, dv = torch.ops.project01.flash_attn_varlen_bwd(
            out, q, k, v, out, lse, a["cu_seqlens_q"], a["cu_seqlens_k"], 5, 6, 1, 0.25
        )
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


def test_opcheck_cpu():
    a = _args()
    args = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], 5, 6, 1, 0.25)
    torch.library.opcheck(
        torch.ops.project01.flash_attn_varlen_fwd.default,
        args,
        test_utils=("test_schema", "test_faketensor"),
    )


# ---- GPU tier --------------------------------------------------------------------------------

GPU = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@GPU
@needs_cuda
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("causal,window,softcap", MASKS, ids=str)
@pytest.mark.parametrize("h,hk", [(4, 4), (8, 2)], ids=str)
def test_gpu_matches_float64_reference(d, dtype, case, causal, window, softcap, h, hk):
    lq, lk = CASES[case]
    q, k, v = packed(lq, lk, h, hk, d, dtype, device="cuda", seed=2)
    cq, ck = cu(lq, "cuda"), cu(lk, "cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    out = flash_attention_varlen(*leaves, cq, ck, max(lq), max(lk), **kw)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = reference_attention_varlen(*ref_leaves, cq, ck, **kw)
    do = torch.randn(q.shape, dtype=torch.float64, device="cuda")
    out.backward(do.to(dtype))
    ref.backward(do)
    # As the GPU attention tests state it: a few units of roundoff of the output scale. Head
    # dim 256 rounds the same quantities (P, dS to the dtype; q.k sums in float32, ~2^-24 each),
    # and 1 / sqrt(D) keeps the scores' spread, so the same bound applies.
    u = UNIT_ROUNDOFF[dtype]
    torch.testing.assert_close(out.double(), ref, atol=8 * u, rtol=4 * u)
    for a, r in zip(leaves, ref_leaves):
        scale = r.grad.abs().max().item() + 1e-6
        assert (a.grad.double() - r.grad).abs().max().item() <= 16 * u * scale


@GPU
@needs_cuda
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal,window,softcap", MASKS, ids=str)
def test_gpu_bitwise_equal_to_per_sequence_flash_attention(d, causal, window, softcap):
    """Forward: each sequence's rows equal flash_attention on that sequence alone (FA2 forward,
    the same kernel arithmetic: same tiles relative to the sequence start). At head dim 128
    varlen runs the 16-rows-a-warp variant (64-key blocks) whatever is asked, so the
    per-sequence call asks for it too (m_tiles_per_warp=1): the default 32-rows-a-warp variant
    takes 32-key blocks, a different summation order. Non-empty sequences only
    (flash_attention refuses empty ones)."""
    lq, lk = [1, 7, 130, 64], [1, 9, 130, 200]
    q, k, v = packed(lq, lk, 4, 2, d, torch.bfloat16, device="cuda", seed=3)
    cq, ck = cu(lq, "cuda"), cu(lk, "cuda")
    kw = dict(window_size=window, softcap=softcap)
    out, lse = attention.flash_forward_varlen(
        q, k, v, cq, ck, max(lq), max(lk), causal, 1 / d**0.5, **kw
    )
    for b in range(len(lq)):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        seq = [t.transpose(0, 1).unsqueeze(0).contiguous() for t in (q[q0:q1], k[k0:k1], v[k0:k1])]
        o, l_ = attention.flash_forward(
            *seq,
            "bottom_right" if causal else False,
            1 / d**0.5,
            kernel="fa2",
            m_tiles_per_warp=1 if d == 128 else attention.FWD_M_TILES_PER_WARP,
            **kw,
        )
        assert torch.equal(out[q0:q1], o.squeeze(0).transpose(0, 1))
        assert torch.equal(lse[:, q0:q1], l_[0])
    ref = flash_attention(*(t.transpose(0, 1).unsqueeze(0) for t in (q[:1], k[:1], v[:1])))
    assert ref.shape == (1, 4, 1, d)
