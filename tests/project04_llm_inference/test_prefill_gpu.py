"""GPU tier: the CUDA paged prefill kernel against the float32 reference.

Tolerance, from the kernel's arithmetic. Scores, the softmax (exp2f) and the P V accumulation
are float32; two roundings to the 16-bit type u (unit roundoff: 2^-8 bf16, 2^-11 fp16) remain:
  1. P = exp(s - m) in (0, 1] is rounded before the P V product: each p_j moves by at most
     u p_j, so the row's output moves by at most u * sum_j p_j |v_j| / l = u * attn(|V|)
     (the same attention with |V| as values). fp16 has no normal numbers below 2^-14: a tiny
     p_j is rounded with an absolute error up to 2^-25 instead, at most n_keys * 2^-25 * max|v|
     over the row (l >= 1 because the row maximum contributes exp(0) = 1).
  2. The output is rounded once: at most u |o|.
So elementwise |out - ref| <= u (|ref| + attn(|V|)) [+ n_keys 2^-25 max|v| for fp16], with a 10%
margin and 1e-5 for float32 summation order and exp2f's approximation (relative ~2^-22).
This is tighter than FlashAttention's rule (twice SDPA's error in the same dtype) and, unlike a
single max-norm bound, it stays tight where long contexts average the output towards zero.
"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference.kernels import prefill, reference

from .test_prefill_inputs import make_batch

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}

# (q_len, context_len): full prompts (no prefix) of ragged lengths, chunks after a cached prefix,
# single-token queries, a tiny prompt and an empty query chunk.
MIXED = [
    (1, 1),
    (17, 17),
    (64, 64),
    (127, 127),
    (300, 300),
    (50, 200),
    (128, 1000),
    (1, 77),
    (1, 513),
    (3, 3),
    (0, 10),
    (200, 333),
]


def as_f32(args):
    return [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]


def check(args, dtype):
    out = prefill.paged_prefill_attention(*args)
    assert out.dtype == dtype and out.shape == args[0].shape
    f32 = as_f32(args)
    ref = reference.paged_prefill_attention(*f32)
    ref_abs_v = reference.paged_prefill_attention(*f32[:2], f32[2].abs(), *f32[3:])
    u = UNIT_ROUNDOFF[dtype]
    tol = 1.1 * u * (ref.abs() + ref_abs_v) + 1e-5
    if dtype == torch.float16:
        tol += int(args[5].max()) * 2.0**-25 * float(args[2].abs().max())
    rows = int(args[4][-1])  # rows past the last sequence are not written
    err = (out[:rows].float() - ref[:rows]).abs()
    assert torch.isfinite(out[:rows]).all()
    worst = (err / tol[:rows]).max().item()
    assert worst <= 1.0, f"max error / bound = {worst:.3f}, max error {err.max().item():.3e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [16, 64])
def test_mixed_batch_matches_reference(dtype, d, group, block_size):
    hkv = 2
    args, _ = make_batch(
        MIXED, hq=hkv * group, hkv=hkv, d=d, block_size=block_size, dtype=dtype, device="cuda"
    )
    check(args, dtype)


@pytest.mark.parametrize("block_size", [32, 128])
def test_other_block_sizes(block_size):
    args, _ = make_batch(
        MIXED, hq=8, hkv=2, d=64, block_size=block_size, dtype=torch.bfloat16, device="cuda"
    )
    check(args, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 128])
def test_long_sequences(d):
    """Lengths up to 8k: a full 8k prompt, a 1k chunk after a 6k prefix, one token after 8k."""
    specs = [(8192, 8192), (1000, 7000), (1, 8100), (2048, 2048)]
    args, _ = make_batch(
        specs, hq=8, hkv=2, d=d, block_size=16, dtype=torch.bfloat16, device="cuda", seed=3
    )
    check(args, torch.bfloat16)


def test_peaked_scores():
    """Large scores (scale 1): the online softmax rescales often and rows are near one-hot."""
    args, _ = make_batch(
        [(500, 900), (64, 64)], hq=8, hkv=2, d=64, dtype=torch.float16, device="cuda", seed=4
    )
    args[7] = 1.0
    check(args, torch.float16)


def test_many_sequences_single_tokens():
    """More than 32 sequences (the tile scan crosses warp-sized chunks), mostly one query each."""
    specs = [(1, 5 + 13 * i) for i in range(70)] + [(40, 40), (7, 90)]
    args, _ = make_batch(specs, hq=32, hkv=8, d=64, dtype=torch.bfloat16, device="cuda", seed=5)
    check(args, torch.bfloat16)


@pytest.mark.smoke
def test_q_view_of_fused_qkv():
    """q as a strided view (the q part of a fused QKV projection) is read in place."""
    args, _ = make_batch(
        [(33, 70), (5, 5)], hq=8, hkv=2, d=128, dtype=torch.bfloat16, device="cuda"
    )
    q = args[0]
    qkv = torch.randn(q.shape[0], 12, 128, device="cuda", dtype=q.dtype)
    qkv[:, :8] = q
    args[0] = qkv[:, :8]
    assert not args[0].is_contiguous()
    check(args, torch.bfloat16)


def test_cuda_graph_replay_with_new_metadata():
    """Capture once, then change lengths and block tables in place (same shapes): the replay
    follows the new values, so nothing on the host depended on them."""
    # Three sequences with 100 cached slots each; T = 31 query rows in both runs.
    args, _ = make_batch(
        [(20, 100), (10, 100), (1, 100)], hq=8, hkv=2, d=64, dtype=torch.bfloat16, device="cuda"
    )
    tables = args[3].clone()
    args[4].copy_(torch.tensor([0, 20, 30, 31]))
    args[5].copy_(torch.tensor([20, 100, 30]))
    prefill.paged_prefill_attention(*args)  # build and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = prefill.paged_prefill_attention(*args)
    args[0].copy_(torch.randn_like(args[0]))
    args[3].copy_(tables[[2, 0, 1]])
    args[4].copy_(torch.tensor([0, 5, 30, 31]))
    args[5].copy_(torch.tensor([60, 25, 31]))
    graph.replay()
    torch.cuda.synchronize()
    expect = prefill.paged_prefill_attention(*args)
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
    check(args, torch.bfloat16)
