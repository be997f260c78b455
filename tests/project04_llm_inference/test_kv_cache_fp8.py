"""The FP8 KV cache on the CPU (the reference path): its number format's error bound, the cache
write, attention over it within the bound propagated from that format, the engine with it, the
pool's size, and refused settings.

The format's bound (`kernels/kv_quant.py`): a value x of KV head h is stored as
round_e4m3(x / s_h); e4m3 keeps 3 mantissa bits, so where |x / s_h| >= 2^-6 (normal) the
rounding errs by at most 2^-4 |x|, below it (subnormal step 2^-9) by at most 2^-10 s_h. The
float32 division and product add 2^-23 relative each (SLACK).
"""

from __future__ import annotations

import math

import pytest
import torch

from project04_llm_inference import kernels
from project04_llm_inference.config import EngineArgs
from project04_llm_inference.kernels import reference
from project04_llm_inference.kernels.fp8 import FP8_DTYPE, FP8_MAX
from project04_llm_inference.kernels.kv_quant import check_kv_cache, dequantize_kv, quantize_kv

REL, SUB, SLACK = 2.0**-4, 2.0**-10, 2.0**-22


def _bound(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Elementwise e4m3 bound for x (..., Hkv, D) with per-head scales s (Hkv,)."""
    sc = s[:, None].expand_as(x)
    normal = (x / sc).abs() >= 2.0**-6
    return torch.where(normal, (REL + SLACK) * x.abs(), SUB * sc + SLACK * x.abs())


def _heads_of_many_magnitudes(t=64, hkv=3, d=32, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hkv, d, generator=g)
    return x * torch.tensor([1e-3, 1.0, 50.0])[None, :, None]  # one scale per head matters


def test_round_trip_is_within_the_e4m3_bound_and_saturates():
    x = _heads_of_many_magnitudes()
    s = x.abs().amax(dim=(0, 2)) / FP8_MAX  # each head's range on e4m3's
    q = quantize_kv(x, s)
    assert q.dtype == FP8_DTYPE
    assert ((dequantize_kv(q, s) - x).abs() <= _bound(x, s)).all()
    # a scale too small for its head saturates at +-448 s, never inf or nan
    small = s / 4
    y = dequantize_kv(quantize_kv(x, small), small)
    assert torch.isfinite(y).all()
    assert torch.equal(y.abs().amax(dim=(0, 2)), FP8_MAX * small)


def test_one_scale_for_every_head_breaks_the_per_head_bound():
    """The companion: the largest head's scale for all heads pushes the small head's values into
    e4m3's subnormals, past the bound its own scale keeps."""
    x = _heads_of_many_magnitudes()
    s = x.abs().amax(dim=(0, 2)) / FP8_MAX
    one = torch.full_like(s, float(s.max()))
    assert ((dequantize_kv(quantize_kv(x, one), one) - x).abs() > _bound(x, s)).any()


def _paged(t_ctx: list[int], hkv=2, d=16, bs=16, seed=1, scale_heads=(0.02, 0.5)):
    """Random K/V contexts for len(t_ctx) sequences in a shuffled paged layout, float32 and FP8."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = sum(-(-n // bs) for n in t_ctx) + 2
    perm = torch.randperm(n_blocks, generator=g).tolist()
    mb = max(-(-n // bs) for n in t_ctx)
    tables = torch.zeros(len(t_ctx), mb, dtype=torch.int32)
    k = torch.zeros(n_blocks, bs, hkv, d)
    v = torch.zeros(n_blocks, bs, hkv, d)
    for i, n in enumerate(t_ctx):
        ids = [perm.pop() for _ in range(-(-n // bs))]
        tables[i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        mag = torch.tensor([1.0, 3.0])[None, :, None]
        k[ids] = (torch.randn(len(ids), bs, hkv, d, generator=g) * mag).view_as(k[ids])
        v[ids] = (torch.randn(len(ids), bs, hkv, d, generator=g) * mag).view_as(v[ids])
    ks = k.abs().amax(dim=(0, 1, 3)) / FP8_MAX
    vs = torch.tensor(scale_heads)  # v: unit-ish scales, values partly in the subnormals
    kq = quantize_kv(k.flatten(0, 1), ks).view(k.shape)
    vq = quantize_kv(v.flatten(0, 1), vs).view(v.shape)
    return k, v, kq, vq, ks, vs, tables


def test_the_cache_write_stores_the_rotated_k_and_v_quantized_per_head():
    g = torch.Generator().manual_seed(3)
    t, hq, hkv, d, bs = 5, 4, 2, 16, 16
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    cos_sin = reference.rope_cos_sin_cache(1.0 / (10_000 ** (torch.arange(0, d, 2) / d)), 32)
    pos = torch.tensor([0, 3, 7, 8, 20])
    slots = torch.tensor([2, 17, -1, 5, 30])
    ks, vs = torch.tensor([0.01, 0.02]), torch.tensor([0.5, 0.03])
    kc = torch.zeros(2, bs, hkv, d, dtype=FP8_DTYPE)
    vc = torch.zeros(2, bs, hkv, d, dtype=FP8_DTYPE)
    q2, k2 = q.clone(), k.clone()
    kernels.rope_and_cache(q2, k2, v, pos, cos_sin, kc, vc, slots, ks, vs)
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    ok = slots >= 0
    as_bytes = lambda x: x.view(torch.uint8)  # noqa: E731 (compare e4m3 bit patterns)
    assert torch.equal(as_bytes(flat_k[slots[ok]]), as_bytes(quantize_kv(k2[ok], ks)))
    assert torch.equal(as_bytes(flat_v[slots[ok]]), as_bytes(quantize_kv(v[ok], vs)))
    assert torch.equal(k2, reference.apply_rope(k, pos, cos_sin))  # k rotated as before
    written = torch.zeros(2 * bs, dtype=torch.bool)
    written[slots[ok]] = True
    assert (as_bytes(flat_k[~written]) == 0).all()  # slot -1 wrote nothing


def _decode_bound_violations(ks_read=None, vs_read=None) -> int:
    """Elements of decode attention over an FP8 cache (read with these scales, default the
    ones it was written with) outside the bound propagated from the e4m3 rounding.

    Scores: |q.k_hat - q.k| <= sum_d |q_d| e_k,d = delta_j (times the softmax scale c), so each
    probability moves by at most p_j (exp(2 c delta) - 1) with delta = max_j delta_j; the output
    moves by at most (exp(2 c delta) - 1) sum_j p_j |v_hat_j| + sum_j p_j e_v,j, where e_k, e_v
    are the elementwise e4m3 bounds. Float32 op order adds < 1e-5 here."""
    lens = [1, 17, 40, 33]
    k, v, kq, vq, ks, vs, tables = _paged(lens)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(len(lens), 4, 16, generator=g)
    c = 1.0 / math.sqrt(16)
    ctx = torch.tensor(lens, dtype=torch.int32)
    ref = kernels.paged_decode_attention(q, k, v, tables, ctx, c, max(lens))
    read = (ks if ks_read is None else ks_read, vs if vs_read is None else vs_read)
    out = kernels.paged_decode_attention(q, kq, vq, tables, ctx, c, max(lens), *read)
    bad = 0
    for b, n in enumerate(lens):
        kb = reference._gather_context(k, tables[b], n)  # (n, Hkv, D)
        vb = reference._gather_context(v, tables[b], n)
        vhat = reference._gather_context(vq, tables[b], n, vs)
        ek, ev = _bound(kb, ks), _bound(vb, vs)
        for h in range(4):
            kvh = h // 2
            p = torch.softmax(c * kb[:, kvh] @ q[b, h], 0)
            delta = c * float((ek[:, kvh] @ q[b, h].abs()).max())
            bound = (math.exp(2 * delta) - 1) * (p @ vhat[:, kvh].abs()) + p @ ev[:, kvh]
            bad += int(((out[b, h] - ref[b, h]).abs() > bound + 1e-5).sum())
    return bad


def test_decode_attention_over_an_fp8_cache_is_within_the_propagated_bound():
    assert _decode_bound_violations() == 0


def test_a_cache_read_without_its_scales_breaks_the_bound():
    """The companion: the same cache read with scales 1 (the write's scales dropped)."""
    assert _decode_bound_violations(torch.ones(2), torch.ones(2)) > 0


def test_prefill_attention_reads_the_fp8_cache_as_its_dequantized_values():
    lens = [9, 33]
    _, _, kq, vq, ks, vs, tables = _paged(lens, seed=4)
    kd = dequantize_kv(kq.flatten(0, 1), ks).view(kq.shape)
    vd = dequantize_kv(vq.flatten(0, 1), vs).view(vq.shape)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(12, 4, 16, generator=g)
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    a = kernels.paged_prefill_attention(q, kq, vq, tables, cu, ctx, 8, 0.25, ks, vs)
    b = kernels.paged_prefill_attention(q, kd, vd, tables, cu, ctx, 8, 0.25)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # float32 both: op-order noise only


def test_the_engine_with_an_fp8_cache_keeps_the_greedy_tokens(hf_model_dir):
    """The tiny model's median top-2 logit gap is about ten times the mean logit error an FP8
    cache (scales 1) makes, so greedy decoding agrees but at near-ties; a flip changes the rest
    of its sequence. Every first token (the prefill's) and two of three whole sequences agree;
    a cache read without its scale, or garbage, agrees with nothing."""
    from project04_llm_inference import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 3], list(range(30, 52)), list(range(100, 160, 3))]
    runs = {}
    for kv in ("auto", "fp8"):
        llm = LLM(str(hf_model_dir), device="cpu", num_gpu_blocks=32, kv_cache_dtype=kv)
        assert llm.engine.runner.kv_caches[0][0].dtype == (
            FP8_DTYPE if kv == "fp8" else torch.float32
        )
        runs[kv] = [o.token_ids for o in llm.generate(prompts, params)]
    assert [r[0] for r in runs["fp8"]] == [r[0] for r in runs["auto"]]
    assert sum(a == b for a, b in zip(runs["auto"], runs["fp8"])) >= 2


def test_the_pool_holds_twice_the_bf16_blocks_in_the_same_bytes():
    from project04_llm_inference.config import DUMMY_SHAPES
    from project04_llm_inference.engine.model_runner import ModelRunner
    from project04_llm_inference.model.loader import build_model

    model = build_model(
        DUMMY_SHAPES["tiny"],
        model_dir=None,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        max_positions=64,
    )
    per_block = {
        kv: ModelRunner(
            model, EngineArgs(load_format="dummy", kv_cache_dtype=kv), max_model_len=64
        ).bytes_per_block()
        for kv in ("auto", "fp8")
    }
    assert 2 * per_block["fp8"] == per_block["auto"]
    runner = ModelRunner(
        model,
        EngineArgs(load_format="dummy", kv_cache_dtype="fp8", cpu_kv_cache_gib=0.001),
        max_model_len=64,
    )
    n = runner.profile_num_blocks()  # the CPU budget over the 1-byte block
    assert n == int(0.001 * 2**30) // per_block["fp8"]
    runner.allocate_kv_cache(n)
    assert runner.kv_caches[0][0].dtype == FP8_DTYPE and runner.kv_caches[0][0].shape[0] == n


def test_bad_kv_cache_settings_are_refused():
    with pytest.raises(ValueError, match=r"EngineArgs\.kv_cache_dtype: expected one of"):
        EngineArgs(load_format="dummy", kv_cache_dtype="fp8_e5m2")
    q = torch.zeros(2, 4, 16)
    fp8 = torch.zeros(3, 16, 2, 16, dtype=FP8_DTYPE)
    s = torch.ones(2)
    with pytest.raises(ValueError, match="k_scale is required with an FP8 cache"):
        check_kv_cache(q, fp8, fp8, None, s)
    with pytest.raises(TypeError, match="v_scale must be torch.float32"):
        check_kv_cache(q, fp8, fp8, s, s.half())
    with pytest.raises(ValueError, match=r"k_scale must be \(Hkv,\) = \(2,\)"):
        check_kv_cache(q, fp8, fp8, torch.ones(3), s)
    e5m2 = torch.zeros(3, 16, 2, 16, dtype=torch.float8_e5m2)
    with pytest.raises(TypeError, match="k_cache must have q's dtype"):
        check_kv_cache(q, e5m2, e5m2, s, s)
    with pytest.raises(TypeError, match="v_cache must have k_cache's dtype"):
        check_kv_cache(q, fp8, torch.zeros(3, 16, 2, 16), s, s)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="k_scale is required"):  # through the op's own check
        kernels.paged_decode_attention(q, fp8, fp8, tables, lens, 0.25, 1)
