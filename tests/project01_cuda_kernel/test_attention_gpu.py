"""GPU tier: our FlashAttention forward and backward against a float32 reference.

Pass rule (FlashAttention's): the max abs error of our output and of each gradient against the
float32 reference is at most twice the error of PyTorch's own SDPA in the same dtype (plus 1e-5
absolute, for outputs that both get exactly right). No NaN; poisoned outputs fully overwritten.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from project01_cuda_kernel.attention import HOPPER_HEAD_DIMS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DTYPES = [torch.bfloat16, torch.float16]
# The compiled head dims. 256: one FlashAttention-2 variant each way and no Hopper forward
# (test_head_dim_256_variants_and_forward_kernel). The pass rules below are relative to PyTorch's
# own half-dtype math on the same inputs, so they carry over to 256 unchanged: our kernels round
# the same quantities at every head dim (P and dS to the dtype before their products, the
# outputs once), and with the default scale 1 / sqrt(D) the scores of N(0, 1) inputs have the
# same spread at every D.
HEAD_DIMS = [64, 128, 256]
# (batch, heads, seq_q, seq_k): the contract's lengths 1, 17, 100, 1000, 4096, plus unequal ones.
EQUAL = [(2, 3, 1, 1), (2, 3, 17, 17), (3, 2, 100, 100), (2, 2, 1000, 1000), (1, 2, 4096, 4096)]
UNEQUAL = [(2, 3, 1, 100), (2, 3, 100, 1000), (1, 2, 1000, 17), (1, 1, 17, 4096)]


@pytest.fixture(autouse=True)
def _full_precision_reference():
    """float32 matmuls in the reference must not silently use TF32."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def reference(q, k, v, causal, scale):
    """softmax(scale q k^T) v in float32, explicit (materialises S x S, fine at test sizes)."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.float()


def make_inputs(b, h, sq, sk, d, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    k = torch.randn(b, h, sk, d, device="cuda", generator=gen, dtype=dtype)
    v = torch.randn(b, h, sk, d, device="cuda", generator=gen, dtype=dtype)
    do = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    return q, k, v, do


def run_with_grads(fn, q, k, v, do):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(do)
    return out.detach(), q.grad, k.grad, v.grad


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


def check_against_reference(b, h, sq, sk, d, dtype, causal, softmax_scale):
    from project01_cuda_kernel import flash_attention

    q, k, v, do = make_inputs(b, h, sq, sk, d, dtype)
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(d)
    ours = run_with_grads(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, softmax_scale=softmax_scale),
        *(q, k, v, do),
    )
    sdpa = run_with_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
        *(q, k, v, do),
    )
    ref = run_with_grads(
        lambda q, k, v: reference(q, k, v, causal, scale),
        *(t.float() for t in (q, k, v, do)),
    )
    for name, x, y, r in zip(("out", "dq", "dk", "dv"), ours, sdpa, ref):
        assert x.dtype == dtype and x.shape == y.shape, name
        assert torch.isfinite(x).all(), f"{name} has NaN/inf"
        err, err_sdpa = max_err(x, r), max_err(y, r)
        assert err <= 2 * err_sdpa + 1e-5, (
            f"{name}: max error {err:.3e} vs SDPA's {err_sdpa:.3e} (float32 reference)"
        )


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,sk", EQUAL, ids=lambda x: str(x))
def test_matches_reference_equal_lengths(b, h, sq, sk, d, dtype, causal):
    check_against_reference(b, h, sq, sk, d, dtype, causal, None)


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,h,sq,sk", UNEQUAL, ids=lambda x: str(x))
def test_matches_reference_unequal_lengths(b, h, sq, sk, d, dtype):
    check_against_reference(b, h, sq, sk, d, dtype, False, None)


@pytest.mark.smoke  # forward and backward against the float32 reference
@pytest.mark.parametrize("softmax_scale", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softmax_scale(softmax_scale, causal):
    check_against_reference(2, 2, 300, 300, 128, torch.bfloat16, causal, softmax_scale)
    check_against_reference(2, 2, 300, 300, 64, torch.float16, causal, softmax_scale)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_poisoned_outputs_are_overwritten(d, causal):
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    b, h, s = 2, 3, 333  # not a multiple of any tile size
    q, k, v, do = make_inputs(b, h, s, s, d, torch.bfloat16, seed=1)
    scale = d**-0.5
    out_clean, lse_clean = flash_forward(q, k, v, causal, scale)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, s), float("nan"), device="cuda")
    flash_forward(q, k, v, causal, scale, out=out, lse=lse)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert torch.equal(out, out_clean) and torch.equal(lse, lse_clean)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    flash_backward(do, q, k, v, out, lse, causal, scale, dq=grads[0], dk=grads[1], dv=grads[2])
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert torch.isfinite(g).all(), f"{name} not fully written"


# Head dims the kernels are not compiled for, above 128: zero-padded to 256 by the operator.
PADDED_ABOVE_128 = [160, 200, 255]


@pytest.mark.parametrize("d", PADDED_ABOVE_128)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "b,h,sq,sk,causal", [(2, 3, 300, 300, True), (2, 3, 113, 203, False)], ids=str
)
def test_head_dims_padded_to_256_match_reference(b, h, sq, sk, causal, d, dtype):
    """flash_attention with head dims 129..255 (padded to 256, output and gradients sliced
    back) passes the 2x-SDPA rule; SDPA gets the unpadded tensors."""
    check_against_reference(b, h, sq, sk, d, dtype, causal, None)


@pytest.mark.smoke  # head dim 256, forward and backward, plain and with GQA + window + softcap
def test_head_dim_256_smoke():
    check_against_reference(2, 2, 300, 300, 256, torch.bfloat16, True, None)
    failures = check_window(torch.float16, 256, 8, 2, 333, 1000, "bottom_right", (128, -1), 30.0)
    assert not failures, failures


def test_head_dim_256_variants_and_forward_kernel():
    """Head dim 256 has one FlashAttention-2 kernel each way: m_tiles_per_warp (forward) and
    warps (backward) select nothing, so the results are bitwise equal (dq excepted: its float32
    atomics add in a run-dependent order); kernel="auto" runs that forward on every GPU (on
    Hopper too: the same bits as "fa2"), and kernel="hopper" is refused."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    q, k, v, do = make_inputs(2, 3, 257, 190, 256, torch.bfloat16, seed=12)
    scale = 256**-0.5
    for causal in (False, "bottom_right"):
        outs = [
            flash_forward(q, k, v, causal, scale, kernel=kernel, m_tiles_per_warp=mt)
            for kernel, mt in (("fa2", 2), ("fa2", 1), ("auto", 2))
        ]
        for o, lse in outs[1:]:
            assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])
        out, lse = outs[0]
        g8, g4 = (
            flash_backward(do, q, k, v, out, lse, causal, scale, warps=w, bwd_kernel="fa2")
            for w in (8, 4)
        )
        assert torch.equal(g8[1], g4[1]) and torch.equal(g8[2], g4[2])
        # dq: the same float32 sums in another order (~1e-7 relative apart, under 1e-5
        # absolute at these magnitudes), then rounded to bfloat16: at most one ulp apart, 2^-7
        # of the value.
        torch.testing.assert_close(g8[0], g4[0], atol=1e-5, rtol=2.0**-7)
    with pytest.raises(ValueError, match=r"compiled for head dims \(64, 128\), not 256"):
        flash_forward(q, k, v, False, scale, kernel="hopper")


def test_lse_matches_logsumexp():
    from project01_cuda_kernel.attention import flash_forward

    q, k, v, _ = make_inputs(2, 2, 257, 190, 64, torch.float16, seed=2)
    _, lse = flash_forward(q, k, v, False, 0.125)
    ref = torch.logsumexp((q.float() @ k.float().transpose(-2, -1)) * 0.125, dim=-1)
    torch.testing.assert_close(lse, ref, atol=1e-3, rtol=1e-4)


def test_strided_and_noncontiguous_inputs():
    """Views of a fused QKV projection are read in place; other layouts are copied first."""
    from project01_cuda_kernel import flash_attention

    b, s, h, d = 2, 200, 4, 64
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, S, D) views, stride(2) = 3*H*D
    assert not q.is_contiguous()
    out = flash_attention(q, k, v, causal=True)
    expect = flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, expect)
    # Head dim not innermost: must be copied, same answer.
    qt = q.contiguous().transpose(2, 3).contiguous().transpose(2, 3)
    assert qt.stride(3) != 1
    assert torch.equal(flash_attention(qt, k, v, causal=True), expect)


def test_gradients_only_where_requested():
    from project01_cuda_kernel import flash_attention

    q, k, v, do = make_inputs(1, 2, 130, 130, 128, torch.bfloat16, seed=3)
    q.requires_grad_(True)
    flash_attention(q, k, v).backward(do)
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert k.grad is None and v.grad is None


def test_deterministic_forward():
    from project01_cuda_kernel import flash_attention

    q, k, v, _ = make_inputs(2, 4, 1000, 1000, 128, torch.bfloat16, seed=4)
    a = flash_attention(q, k, v, causal=True)
    b = flash_attention(q, k, v, causal=True)
    assert torch.equal(a, b)


@pytest.mark.slow
def test_tiny_transformer_training_tracks_sdpa():
    """The shared tiny model (head dim 64) trained 300 steps with our attention and with SDPA,
    from the same initialisation on the same batches: the loss curves agree."""
    from project01_cuda_kernel import flash_attention
    from shared.data import SyntheticTokens
    from shared.model import ModelArgs, Transformer

    args = ModelArgs.from_preset("tiny", dim=128, n_heads=2, ffn_hidden=384, max_seq_len=128)
    assert args.head_dim == 64

    def ours(q, k, v, causal=True):
        return flash_attention(q, k, v, causal=causal)

    def sdpa(q, k, v, causal=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def train(attn_fn, steps=300):
        torch.manual_seed(0)
        model = Transformer(args, attn_fn=attn_fn).cuda()
        model.init_weights(seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        data = SyntheticTokens(args.vocab_size, seq_len=128, global_batch=16, seed=0)
        losses = []
        for _ in range(steps):
            x, y = (t.cuda() for t in data.next_batch())
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses), data

    ours_losses, data = train(ours)
    sdpa_losses, _ = train(sdpa)
    assert torch.isfinite(ours_losses).all()
    # Both learn: from ~ln(256) = 5.5 to well below it.
    assert ours_losses[-20:].mean() < data.uniform_loss - 2.0
    # And track each other: bf16 runs drift apart slowly, so compare smoothed curves.
    diff = (ours_losses[-50:].mean() - sdpa_losses[-50:].mean()).abs().item()
    assert diff < 0.05 * sdpa_losses[-50:].mean().item(), (
        f"final losses differ: ours {ours_losses[-50:].mean():.4f}, "
        f"SDPA {sdpa_losses[-50:].mean():.4f}"
    )
    smooth = torch.nn.AvgPool1d(10, stride=1)  # 10-step moving average
    gap = (smooth(ours_losses[None]) - smooth(sdpa_losses[None])).abs().max().item()
    assert gap < 0.2, f"smoothed loss curves diverge by up to {gap:.3f}"


VARIANT_SHAPES = [  # (seq_q, seq_k, causal)
    (1, 1, False),
    (100, 100, False),
    (777, 777, False),
    (33, 500, False),
    (2048, 2048, False),
    (300, 129, False),
    (129, 1000, False),
    (1, 1, True),
    (100, 100, True),
    (777, 777, True),
    (2048, 2048, True),
    (129, 129, True),
]


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _skip_hopper_without_instance(kernel: str, d: int) -> None:
    if kernel == "hopper" and d not in HOPPER_HEAD_DIMS:
        pytest.skip(f"the Hopper forward has no head-dim-{d} instance (refused: see below)")


FWD_VARIANTS = [  # (kernel, m_tiles_per_warp)
    ("fa2", 1),
    ("fa2", 2),
    pytest.param(
        "hopper",
        2,
        marks=pytest.mark.skipif(not _on_hopper(), reason="the Hopper kernel needs CC 9.0"),
    ),
]


@pytest.mark.parametrize("kernel,m_tiles_per_warp", FWD_VARIANTS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("sq,sk,causal", VARIANT_SHAPES, ids=str)
def test_forward_variants_match_reference(kernel, m_tiles_per_warp, dtype, d, sq, sk, causal):
    """Every forward kernel (FlashAttention-2 with 16 or 32 query rows a warp, Hopper) passes
    the 2x-SDPA rule, with its log-sum-exp too. (Head dim 256: one FlashAttention-2 variant,
    run for both m_tiles_per_warp values; no Hopper instance.)"""
    from project01_cuda_kernel.attention import flash_forward

    _skip_hopper_without_instance(kernel, d)
    q, k, v, _ = make_inputs(2, 2, sq, sk, d, dtype, seed=5)
    scale = d**-0.5
    out, lse = flash_forward(
        q, k, v, causal, scale, m_tiles_per_warp=m_tiles_per_warp, kernel=kernel
    )
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(), -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1), atol=2e-3, rtol=1e-4)
    ref = reference(q, k, v, causal, scale)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    err, err_sdpa = max_err(out, ref), max_err(sdpa, ref)
    assert torch.isfinite(out).all()
    assert err <= 2 * err_sdpa + 1e-5, f"max error {err:.3e} vs SDPA's {err_sdpa:.3e}"


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("sq,sk,causal", VARIANT_SHAPES, ids=str)
def test_backward_variants_match_reference(warps, d, sq, sk, causal):
    """Both FlashAttention-2 backward variants (64 and 128 keys a CTA) pass the 2x-SDPA rule
    (named: "auto" may be the Hopper backward, which has no variants)."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    q, k, v, do = make_inputs(2, 2, sq, sk, d, torch.float16, seed=6)
    scale = d**-0.5
    out, lse = flash_forward(q, k, v, causal, scale)
    grads = flash_backward(do, q, k, v, out, lse, causal, scale, warps=warps, bwd_kernel="fa2")
    sdpa = run_with_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
        *(q, k, v, do),
    )[1:]
    ref = run_with_grads(
        lambda q, k, v: reference(q, k, v, causal, scale),
        *(t.float() for t in (q, k, v, do)),
    )[1:]
    for name, x, y, r in zip(("dq", "dk", "dv"), grads, sdpa, ref):
        assert torch.isfinite(x).all(), f"{name} has NaN/inf"
        err, err_sdpa = max_err(x, r), max_err(y, r)
        assert err <= 2 * err_sdpa + 1e-5, f"{name}: {err:.3e} vs SDPA's {err_sdpa:.3e}"


# --------------------------------------------------------------------------------------------
# Grouped-query / multi-query k/v heads and the two causal alignments

# (heads, kv heads): MHA (the unchanged path, as a control), GQA ratios 2, 4 and 8, MQA.
GQA_HEADS = [(8, 8), (8, 4), (8, 2), (16, 2), (8, 1)]
# (seq_q, seq_k): Sq < Sk and Sq > Sk (bottom-right then hides every key from rows i < Sq - Sk,
# whole query tiles of both forward kernels among them), equal, a single query row, and three
# keys. (Not a single key without a mask: P = 1 exactly, so the exact dK is 0 and the half-dtype
# math gets exactly 0, while the kernel's D = rowsum(dO * O) reads O rounded to the dtype: a
# rounding-sized dK, ~1e-5 summed over a group, that the rule's floor would fail.)
GQA_LENGTHS = [(100, 333), (333, 100), (257, 257), (1, 200), (200, 3)]
CAUSAL_MODES = [False, "top_left", "bottom_right"]


def reference_gqa(q, k, v, causal, scale):
    """softmax(scale q k^T [+ mask]) v explicitly in the inputs' dtype (float32 for the reference,
    the half dtype for PyTorch's own same-dtype math): k/v heads repeated over their query heads
    (repeat_interleave: query head h uses k/v head h // (H / Hk)); mask j <= i + offset. A row
    that sees no key is 0 with no gradient (FlashAttention's convention): its scores are left
    unmasked and its probabilities multiplied by 0, so autograd gives 0 there, not NaN."""
    from project01_cuda_kernel.attention import causal_offset

    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    s = (q @ k.transpose(-2, -1)) * scale
    sq, sk = s.shape[-2:]
    offset = causal_offset(causal, sq, sk)
    if offset is None:
        return torch.softmax(s, dim=-1) @ v
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(offset)
    live = keep.any(dim=-1, keepdim=True)
    s = s.masked_fill(~(keep | ~live), -math.inf)
    return (torch.softmax(s, dim=-1) * live).to(v.dtype) @ v


def check_gqa(kernel, dtype, d, h, hk, sq, sk, causal, *, ref_fn=reference_gqa, seed=7):
    """Forward with the given kernel (out, lse) and the backward from its out and lse, against
    the float32 reference, by FlashAttention's rule: max error at most twice that of the same
    math run by PyTorch in the half dtype, plus 1e-5 absolute (the existing tests' rule). Why it
    fits: the half-dtype math rounds q k^T, P and P V to the dtype (relative u each, u = 2^-8
    bf16, 2^-11 fp16), so its error is the unavoidable rounding of this very case; our kernels
    round only their inputs and outputs (float32 accumulators), so a correct kernel is at most
    as far off, and a wrong k/v head, mask or group sum errs by O(1). dk and dv also carry the
    group sum: one more rounding of the summed value (u), which the same-dtype reference (its
    autograd sums the repeated heads' gradients in the half dtype) pays too.
    Returns the list of failures (empty when every tensor passes)."""
    from project01_cuda_kernel.attention import causal_offset, flash_backward, flash_forward

    gen = torch.Generator(device="cuda").manual_seed(seed)
    b = 2
    q = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    k = torch.randn(b, hk, sk, d, device="cuda", generator=gen, dtype=dtype)
    v = torch.randn(b, hk, sk, d, device="cuda", generator=gen, dtype=dtype)
    do = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    scale = d**-0.5
    out, lse = flash_forward(q, k, v, causal, scale, kernel=kernel)
    dq, dk, dv = flash_backward(do, q, k, v, out, lse, causal, scale)
    ref = run_with_grads(
        lambda q, k, v: ref_fn(q, k, v, causal, scale), *(t.float() for t in (q, k, v, do))
    )
    same = run_with_grads(lambda q, k, v: ref_fn(q, k, v, causal, scale), q, k, v, do)
    failures = []
    for name, x, y, r in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), same, ref):
        assert x.shape == r.shape and x.dtype == dtype, name
        if not torch.isfinite(x).all():
            failures.append(f"{name} has NaN/inf")
            continue
        err, err_same = max_err(x, r), max_err(y, r)
        if err > 2 * err_same + 1e-5:
            failures.append(f"{name}: max error {err:.3e} vs same-dtype math's {err_same:.3e}")
    # lse: float32 log-sum-exp of the float32 scores of the half inputs; +inf on rows that see
    # no key. Tolerance as test_forward_variants_match_reference's.
    s = (q.float() @ k.float().repeat_interleave(h // hk, dim=1).transpose(-2, -1)) * scale
    offset = causal_offset(causal, sq, sk)
    if offset is not None:
        s = s.masked_fill(
            ~torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(offset), -math.inf
        )
    want = torch.logsumexp(s, dim=-1).nan_to_num(neginf=math.inf)
    if not torch.allclose(lse, want, atol=2e-3, rtol=1e-4, equal_nan=False):
        failures.append(f"lse: max error {(lse - want).nan_to_num().abs().max().item():.3e}")
    if offset is not None and offset < 0:
        dead = -offset  # rows 0 .. dead - 1 see no key: exactly 0, no gradient, lse +inf
        if out[:, :, :dead].abs().max() != 0 or dq[:, :, :dead].abs().max() != 0:
            failures.append("rows that see no key are not 0")
        if not torch.isposinf(lse[:, :, :dead]).all():
            failures.append("rows that see no key: lse is not +inf")
    return failures


GQA_FWD_KERNELS = [
    "fa2",
    pytest.param(
        "hopper",
        marks=pytest.mark.skipif(not _on_hopper(), reason="the Hopper kernel needs CC 9.0"),
    ),
]


@pytest.mark.parametrize("kernel", GQA_FWD_KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("h,hk", GQA_HEADS, ids=lambda x: str(x))
@pytest.mark.parametrize("causal", CAUSAL_MODES, ids=str)
@pytest.mark.parametrize("sq,sk", GQA_LENGTHS, ids=lambda x: str(x))
def test_gqa_and_causal_alignment_match_reference(kernel, dtype, d, h, hk, causal, sq, sk):
    _skip_hopper_without_instance(kernel, d)
    failures = check_gqa(kernel, dtype, d, h, hk, sq, sk, causal)
    assert not failures, failures


@pytest.mark.smoke  # grouped k/v heads and the bottom-right mask, forward and backward, once
def test_gqa_bottom_right_smoke():
    kernel = "hopper" if _on_hopper() else "fa2"
    assert not check_gqa(kernel, torch.bfloat16, 128, 8, 2, 333, 100, "bottom_right")


@pytest.mark.parametrize("kernel", GQA_FWD_KERNELS)
def test_gqa_check_catches_planted_errors(kernel):
    """The comparison above is not vacuous: a reference that groups the heads the other way
    (k/v head h % Hk, torch.repeat's tiling) or aligns the mask top-left where the kernel was
    asked for bottom-right fails it."""

    def tiled_heads(q, k, v, causal, scale):
        group = q.shape[1] // k.shape[1]
        k, v = (t.repeat(1, group, 1, 1) for t in (k, v))
        return reference_gqa(q, k, v, causal, scale)

    assert check_gqa(kernel, torch.bfloat16, 64, 8, 2, 100, 333, False, ref_fn=tiled_heads)

    def top_left(q, k, v, causal, scale):
        return reference_gqa(q, k, v, "top_left", scale)

    assert check_gqa(kernel, torch.bfloat16, 64, 8, 2, 100, 333, "bottom_right", ref_fn=top_left)


def test_gqa_reads_strided_kv_views_in_place():
    """k/v views with fewer heads (a fused projection's q | k | v split) give the same answer as
    contiguous copies: the k/v head strides are the views' own."""
    from project01_cuda_kernel import flash_attention

    b, s, h, hk, d = 2, 200, 8, 2, 128
    fused = torch.randn(b, s, h + 2 * hk, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = fused.transpose(1, 2).split([h, hk, hk], dim=1)  # (B, heads, S, D) views
    assert not k.is_contiguous()
    for causal in (False, "bottom_right"):
        out = flash_attention(q, k, v, causal=causal)
        expect = flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal)
        assert torch.equal(out, expect)


# --------------------------------------------------------------------------------------------
# Sliding window (window_size) and logit soft-capping (softcap): the FlashAttention-2 kernels'
# local instances, forward and backward. The Hopper forward has neither: kernel="auto" runs the
# FlashAttention-2 forward whenever one is in effect (test_auto_forward_with_a_window_is_fa2).

# (seq_q, seq_k): equal, Sq < Sk and Sq > Sk (bottom-right alignment: with Sq > Sk whole query
# tiles see no key under causal or a right side), a single query row, long enough for many tiles.
# None a multiple of a tile.
WINDOW_LENGTHS = [(257, 257), (100, 333), (333, 100), (1, 200), (1000, 1000)]
# (left, right), -1 unbounded: left only, right only, both, smaller than every tile (5 + 3 + 1
# keys), a zero left side (each row sees itself and the next 16), larger than every sequence here
# (hides nothing: the plain kernels run).
WINDOWS = [(64, -1), (-1, 64), (33, 7), (5, 3), (0, 16), (5000, 5000)]
WINDOW_CAUSAL = [False, "bottom_right"]


def check_window(
    dtype,
    d,
    h,
    hk,
    sq,
    sk,
    causal,
    window,
    softcap,
    *,
    kernel="auto",
    m_tiles_per_warp=2,
    warps=8,
    bwd_kernel="auto",
    seed=8,
):
    """Forward (out, lse) and backward (from that out and lse) with a window and/or softcap,
    against `reference_attention` in float64 on the same half inputs, by the rule of the tests
    above (max error at most twice that of the same math run by PyTorch in the half dtype, plus
    1e-5; see check_gqa for why it fits). lse: against the float64 log-sum-exp of the capped,
    masked scores (+inf on rows that see no key), at test_forward_variants_match_reference's
    tolerance. Rows that see no key must be exactly 0 (out, dq) with lse +inf; keys that no row
    sees exactly 0 (dk, dv). With a softcap, q is scaled by softcap / 4 (FlashAttention-3's
    tests) so that the scores reach the cap. Returns the list of failures."""
    from project01_cuda_kernel.attention import (
        flash_backward,
        flash_forward,
        reference_attention,
        visible_keys,
    )

    gen = torch.Generator(device="cuda").manual_seed(seed)
    b = 2
    q = torch.randn(b, h, sq, d, device="cuda", generator=gen) * (softcap / 4 if softcap else 1)
    q = q.to(dtype)
    k, v = (torch.randn(b, hk, sk, d, device="cuda", generator=gen, dtype=dtype) for _ in "kv")
    do = torch.randn(b, h, sq, d, device="cuda", generator=gen, dtype=dtype)
    scale = d**-0.5
    window_args = {"window_size": window, "softcap": softcap}
    out, lse = flash_forward(
        q, k, v, causal, scale, kernel=kernel, m_tiles_per_warp=m_tiles_per_warp, **window_args
    )
    dq, dk, dv = flash_backward(
        do, q, k, v, out, lse, causal, scale, warps=warps, bwd_kernel=bwd_kernel, **window_args
    )

    def ref_fn(q, k, v):
        return reference_attention(q, k, v, causal=causal, softmax_scale=scale, **window_args)

    ref = run_with_grads(ref_fn, *(t.double() for t in (q, k, v, do)))
    same = run_with_grads(ref_fn, q, k, v, do)
    failures = []
    for name, x, y, r in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), same, ref):
        assert x.shape == r.shape and x.dtype == dtype, name
        if not torch.isfinite(x).all():
            failures.append(f"{name} has NaN/inf")
            continue
        err, err_same = max_err(x, r), max_err(y, r)
        if err > 2 * err_same + 1e-5:
            failures.append(f"{name}: max error {err:.3e} vs same-dtype math's {err_same:.3e}")
    s = q.double() @ k.double().repeat_interleave(h // hk, dim=1).transpose(-2, -1) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    keep = visible_keys(sq, sk, causal, window, device="cuda")
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    want = torch.logsumexp(s, dim=-1).nan_to_num(neginf=math.inf)
    if not torch.allclose(lse.double(), want, atol=2e-3, rtol=1e-4):
        failures.append(f"lse: max error {(lse - want).nan_to_num().abs().max().item():.3e}")
    if keep is not None:
        dead_rows, dead_keys = ~keep.any(dim=1), ~keep.any(dim=0)
        if out[:, :, dead_rows].any() or dq[:, :, dead_rows].any():
            failures.append("rows that see no key are not 0")
        if not torch.isposinf(lse[:, :, dead_rows]).all():
            failures.append("rows that see no key: lse is not +inf")
        if dk[:, :, dead_keys].any() or dv[:, :, dead_keys].any():
            failures.append("keys that no row sees have a gradient")
    return failures


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", WINDOW_CAUSAL, ids=str)
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("sq,sk", WINDOW_LENGTHS, ids=lambda x: str(x))
def test_window_matches_reference(dtype, d, causal, window, sq, sk):
    if causal and window[0] == 0:
        # causal with left 0: every row sees exactly one key, so P = 1 and the exact dq, dk are
        # 0, which the half-dtype math also gets exactly; the kernels' dS = dP - D then holds
        # the float32 rounding of D (~1e-6 |D|), a rule floor of 1e-5 away from failing.
        pytest.skip("one key a row: exact-zero gradients (see the comment)")
    failures = check_window(dtype, d, 4, 2, sq, sk, causal, window, 0.0)
    assert not failures, failures


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("softcap", [5.0, 50.0])
@pytest.mark.parametrize("causal", WINDOW_CAUSAL, ids=str)
@pytest.mark.parametrize("window", [(-1, -1), (33, 7), (5000, 5000)], ids=str)
@pytest.mark.parametrize("sq,sk", WINDOW_LENGTHS[:3], ids=lambda x: str(x))
def test_softcap_matches_reference(dtype, d, softcap, causal, window, sq, sk):
    """Soft-capping alone (the local kernels with unbounded offsets, or the causal diagonal),
    with a window, and with a window larger than the sequences."""
    failures = check_window(dtype, d, 4, 2, sq, sk, causal, window, softcap)
    assert not failures, failures


@pytest.mark.parametrize("m_tiles_per_warp,warps", [(1, 4), (1, 8), (2, 4), (2, 8)])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize(
    "sq,sk,causal,window,softcap",
    [
        (777, 777, True, (100, -1), 0.0),
        (777, 777, False, (17, 200), 30.0),
        (129, 1000, "bottom_right", (300, -1), 10.0),
        (1000, 129, False, (2, 40), 0.0),
    ],
    ids=str,
)
def test_window_kernel_variants(m_tiles_per_warp, warps, d, sq, sk, causal, window, softcap):
    """Both FlashAttention-2 forward variants (16 or 32 query rows a warp: different tile
    heights, so different tile skipping) and both backward variants (64 or 128 keys a CTA)."""
    failures = check_window(
        torch.float16,
        d,
        2,
        2,
        *(sq, sk, causal, window, softcap),
        kernel="fa2",
        m_tiles_per_warp=m_tiles_per_warp,
        warps=warps,
        bwd_kernel="fa2",
    )
    assert not failures, failures


@pytest.mark.parametrize("h,hk", [(8, 8), (8, 1), (16, 2)], ids=str)
def test_window_with_grouped_kv_heads(h, hk):
    failures = check_window(torch.bfloat16, 128, h, hk, 300, 500, "bottom_right", (64, -1), 20.0)
    assert not failures, failures


@pytest.mark.smoke  # a window and soft-capping, forward and backward, once
def test_window_softcap_smoke():
    failures = check_window(torch.bfloat16, 128, 8, 2, 333, 1000, "bottom_right", (128, -1), 30.0)
    assert not failures, failures


def test_window_catches_planted_errors(monkeypatch):
    """The comparison is not vacuous: a reference whose window is one key wider on the left, or
    that forgets the soft-cap, fails it."""
    from project01_cuda_kernel import attention

    real = attention.reference_attention

    def wider(q, k, v, window_size, **kw):
        return real(q, k, v, window_size=(window_size[0] + 1, window_size[1]), **kw)

    def uncapped(q, k, v, softcap, **kw):
        return real(q, k, v, softcap=0.0, **kw)

    for planted in (wider, uncapped):
        monkeypatch.setattr(attention, "reference_attention", planted)
        assert check_window(torch.bfloat16, 64, 2, 2, 257, 257, False, (16, 4), 30.0)


def test_poisoned_outputs_are_overwritten_with_a_window():
    """NaN-filled out, lse, dq, dk, dv are fully written, including the rows that see no key
    (whole query tiles with Sq > Sk) and the keys that no row sees (whole key tiles)."""
    from project01_cuda_kernel.attention import flash_backward, flash_forward

    for sq, sk, window in ((700, 150, (-1, 0)), (150, 700, (20, 0))):
        gen = torch.Generator(device="cuda").manual_seed(9)
        q, do = (torch.randn(2, 3, sq, 64, device="cuda", generator=gen) for _ in "qo")
        k, v = (torch.randn(2, 3, sk, 64, device="cuda", generator=gen) for _ in "kv")
        q, k, v, do = (t.bfloat16() for t in (q, k, v, do))
        args = {"window_size": window, "softcap": 10.0}
        out_clean, lse_clean = flash_forward(q, k, v, False, 0.125, **args)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((2, 3, sq), float("nan"), device="cuda")
        flash_forward(q, k, v, False, 0.125, out=out, lse=lse, **args)
        assert torch.equal(out, out_clean) and torch.equal(lse, lse_clean)
        assert not torch.isnan(lse).any() and torch.isfinite(out).all()
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        flash_backward(
            do, q, k, v, out, lse, False, 0.125, dq=grads[0], dk=grads[1], dv=grads[2], **args
        )
        for name, g in zip(("dq", "dk", "dv"), grads):
            assert torch.isfinite(g).all(), f"{name} not fully written"


def test_auto_forward_with_a_window_is_fa2():
    """kernel="auto" with a window or softcap runs the FlashAttention-2 forward on every GPU
    (on Hopper too): the same bits as kernel="fa2"."""
    from project01_cuda_kernel.attention import flash_forward

    q, k, v, _ = make_inputs(2, 2, 300, 300, 128, torch.bfloat16, seed=10)
    for args in ({"window_size": (50, 0)}, {"softcap": 30.0}):
        auto = flash_forward(q, k, v, False, 0.1, kernel="auto", **args)
        fa2 = flash_forward(q, k, v, False, 0.1, kernel="fa2", **args)
        assert torch.equal(auto[0], fa2[0]) and torch.equal(auto[1], fa2[1])
    if _on_hopper():
        with pytest.raises(ValueError, match="kernel='hopper' does not implement window_size"):
            flash_forward(q, k, v, False, 0.1, kernel="hopper", window_size=(50, 0))


def test_defaults_are_the_plain_kernels():
    """window_size=(-1, -1), softcap=0 and a window that hides nothing (left >= Sk; with causal
    any right side) run the plain kernels: the same bits as a call without them, forward and
    backward."""
    from project01_cuda_kernel import flash_attention

    q, k, v, do = make_inputs(2, 2, 300, 300, 64, torch.float16, seed=11)
    plain = run_with_grads(lambda q, k, v: flash_attention(q, k, v, causal=True), q, k, v, do)
    for args in ({"window_size": (-1, -1), "softcap": 0.0}, {"window_size": (300, 5)}):
        got = run_with_grads(
            lambda q, k, v, a=args: flash_attention(q, k, v, causal=True, **a), q, k, v, do
        )
        for x, y in zip(got, plain):
            assert torch.equal(x, y)
