"""GPU tier: the CUDA decode and RoPE/cache kernels against the float32 PyTorch reference.

Tolerances, from the arithmetic (u = unit roundoff of the dtype: 2^-8 bf16, 2^-11 fp16):
- decode: the kernel rounds the softmax weights P to the input dtype before P.V (<= u relative per
  weight; the output is a convex combination of V rows, so <= u * max|v| in all) and rounds the
  float32 output to the dtype (<= u * |out|). Scores, sums and the accumulation are float32 over
  at most 32k terms (+1e-4 absolute covers them and exp2f's approximation).
- RoPE: float32 multiplies and adds in the reference's order, without FMA contraction, then one
  rounding to the dtype, as the reference does: bit-exact expected; one ulp allowed.
"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference.kernels import decode, reference, rope_cache

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _paged_case(lens, hq, hkv, d, bs, dtype, seed=0, spare_blocks=3):
    """q, caches and block tables for sequences of the given lengths, blocks shuffled."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per_seq = [max(1, -(-n // bs)) for n in lens]
    width = max(blocks_per_seq)
    nb = sum(blocks_per_seq) + spare_blocks
    kc = torch.randn(nb, bs, hkv, d, device="cuda", generator=g).to(dtype)
    vc = torch.randn(nb, bs, hkv, d, device="cuda", generator=g).to(dtype)
    perm = torch.randperm(nb, device="cuda", generator=g).to(torch.int32)
    tables = torch.full((len(lens), width), nb - 1, dtype=torch.int32, device="cuda")
    at = 0
    for i, nblk in enumerate(blocks_per_seq):
        tables[i, :nblk] = perm[at : at + nblk]
        at += nblk
    q = torch.randn(len(lens), hq, d, device="cuda", generator=g).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, kc, vc, tables, lens_t


def _assert_decode_close(out, q, kc, vc, tables, lens, scale):
    ref = reference.paged_decode_attention(q.float(), kc.float(), vc.float(), tables, lens, scale)
    u = UNIT_ROUNDOFF[q.dtype]
    bound = u * ref.abs() + u * vc.float().abs().max() + 1e-4
    err = (out.float() - ref).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"
    empty = lens == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("bs", [16, 32, 64, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_decode_matches_reference(dtype, d, bs, group):
    hkv = 2
    lens = [1, 17, 0, 300, 1029, 4099]  # ragged, one empty slot, partial last blocks
    q, kc, vc, tables, lens_t = _paged_case(lens, group * hkv, hkv, d, bs, dtype)
    out = decode.paged_decode_attention(q, kc, vc, tables, lens_t, d**-0.5)
    _assert_decode_close(out, q, kc, vc, tables, lens_t, d**-0.5)


@pytest.mark.parametrize(("d", "dtype"), [(64, torch.bfloat16), (128, torch.float16)])
def test_decode_long_contexts_and_batch_one(d, dtype):
    """32 query heads over 8 kv heads (Llama-3.2-1B), up to 32k tokens, many splits at batch 1."""
    for lens in ([32768], [32768, 1, 8191, 16000]):
        q, kc, vc, tables, lens_t = _paged_case(lens, 32, 8, d, 16, dtype, seed=len(lens))
        out = decode.paged_decode_attention(q, kc, vc, tables, lens_t, d**-0.5)
        _assert_decode_close(out, q, kc, vc, tables, lens_t, d**-0.5)


def test_decode_sixteen_heads_per_kv_head_and_a_strided_q():
    """G = 16 uses all 16 mma rows; q is a view into a wider (B, Hq + extra, D) buffer."""
    lens = [5, 700, 2048]
    q, kc, vc, tables, lens_t = _paged_case(lens, 32, 2, 64, 32, torch.bfloat16)
    wide = torch.zeros(3, 40, 64, dtype=q.dtype, device="cuda")
    wide[:, 4:36] = q
    out = decode.paged_decode_attention(wide[:, 4:36], kc, vc, tables, lens_t, 0.125)
    _assert_decode_close(out, q, kc, vc, tables, lens_t, 0.125)


def test_decode_all_empty_and_max_context_len_plans():
    q, kc, vc, tables, lens_t = _paged_case([0, 0], 8, 2, 64, 16, torch.bfloat16)
    out = decode.paged_decode_attention(q, kc, vc, tables, lens_t, 0.125)
    assert torch.equal(out, torch.zeros_like(out))
    q, kc, vc, tables, lens_t = _paged_case([3000, 12], 8, 2, 64, 16, torch.bfloat16)
    for bound in (3000, 4096, None):  # a tight bound, a loose one, the table's reach
        out = decode.paged_decode_attention(q, kc, vc, tables, lens_t, 0.125, bound)
        _assert_decode_close(out, q, kc, vc, tables, lens_t, 0.125)


def _rope_case(t, hq, hkv, d, dtype, nb=64, bs=16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda", generator=g).to(dtype)
    inv_freq = 1.0 / (500000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    cos_sin = reference.rope_cos_sin_cache(inv_freq, 4096)
    positions = torch.randint(0, 4096, (t,), device="cuda", generator=g)
    slots = torch.randperm(nb * bs, device="cuda", generator=g)[:t]
    slots[::3] = -1  # padding tokens: rotated, never written
    kc = torch.randn(nb, bs, hkv, d, device="cuda", generator=g).to(dtype)
    vc = torch.randn(nb, bs, hkv, d, device="cuda", generator=g).to(dtype)
    return qkv, positions, cos_sin, kc, vc, slots


def _split(qkv, hq, hkv, d):
    t = qkv.shape[0]
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(("hq", "hkv"), [(8, 8), (32, 8), (16, 2)])
def test_rope_and_cache_matches_reference_on_fused_qkv_views(dtype, d, hq, hkv):
    qkv, pos, cos_sin, kc, vc, slots = _rope_case(37, hq, hkv, d, dtype)
    ref_qkv, ref_kc, ref_vc = qkv.clone(), kc.clone(), vc.clone()
    rope_cache.rope_and_cache(*_split(qkv, hq, hkv, d), pos, cos_sin, kc, vc, slots)
    rq, rk, rv = _split(ref_qkv, hq, hkv, d)
    reference.rope_and_cache(rq, rk, rv, pos, cos_sin, ref_kc, ref_vc, slots)
    eps = torch.finfo(dtype).eps  # one ulp at 1.0
    for name, got, want in (
        ("qkv", qkv, ref_qkv),
        ("k_cache", kc, ref_kc),
        ("v_cache", vc, ref_vc),
    ):
        torch.testing.assert_close(got, want, rtol=eps, atol=eps, msg=name)


@pytest.mark.smoke  # RoPE + cache write + decode, odd lengths
def test_decode_step_replays_in_a_cuda_graph_with_new_lengths():
    """RoPE + cache write + decode captured once, replayed with new positions and lengths."""
    hq, hkv, d, bs, b = 32, 8, 64, 16, 4
    q0, kc, vc, tables, lens = _paged_case([4000, 4000, 4000, 4000], hq, hkv, d, bs, torch.bfloat16)
    max_len = tables.shape[1] * bs
    qkv = torch.zeros(b, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    inv_freq = 1.0 / (500000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    cos_sin = reference.rope_cos_sin_cache(inv_freq, max_len)
    positions = torch.zeros(b, dtype=torch.int64, device="cuda")
    slots = torch.zeros(b, dtype=torch.int64, device="cuda")

    def step():
        q, k, v = _split(qkv, hq, hkv, d)
        rope_cache.rope_and_cache(q, k, v, positions, cos_sin, kc, vc, slots)
        return decode.paged_decode_attention(q, kc, vc, tables, lens, d**-0.5, max_len)

    def set_inputs(new_lens, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        qkv.copy_(torch.randn(qkv.shape, device="cuda", generator=g).to(qkv.dtype))
        new = torch.tensor(new_lens, device="cuda")
        lens.copy_(new.to(torch.int32))
        positions.copy_((new - 1).clamp(min=0))
        pos_block = tables.gather(1, (positions // bs).view(-1, 1)).view(-1).long()
        slots.copy_(torch.where(new > 0, pos_block * bs + positions % bs, -1))

    set_inputs([10, 10, 10, 10], seed=1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: builds the extensions before capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed, new_lens in enumerate(([1, 300, 0, 4000], [4000, 2, 17, 999]), start=2):
        set_inputs(new_lens, seed)
        ref_qkv, ref_kc, ref_vc = qkv.clone(), kc.clone(), vc.clone()
        graph.replay()
        rq, rk, rv = _split(ref_qkv, hq, hkv, d)
        reference.rope_and_cache(rq, rk, rv, positions, cos_sin, ref_kc, ref_vc, slots)
        eps = torch.finfo(torch.bfloat16).eps
        torch.testing.assert_close(kc, ref_kc, rtol=eps, atol=eps)
        torch.testing.assert_close(vc, ref_vc, rtol=0, atol=0)  # v is copied, not computed
        _assert_decode_close(out, rq, kc, vc, tables, lens, d**-0.5)
