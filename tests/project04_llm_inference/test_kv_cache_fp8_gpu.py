"""GPU tier: the CUDA kernels with an FP8 KV cache (float8_e4m3fn, per-KV-head scales) against
the PyTorch reference on the same cache, eagerly and replayed from CUDA graphs, and the engine.

Tolerances, from the arithmetic. The cache write divides in float32 with IEEE rounding and
rounds to e4m3 to nearest even with saturation, as the reference does: bit-exact bytes. The
attention kernels convert each e4m3 value to the 16-bit dtype exactly (every e4m3 value is a
bfloat16 and a float16 value), run the 16-bit kernels' arithmetic on them, and apply k_scale to
the float32 scores and v_scale to the float32 output (one float32 rounding each, < 2^-23
relative). Against the float32 reference over the dequantized values (e4m3 x scale) the 16-bit
kernels' bounds therefore hold with V = the dequantized V (test_kernels_gpu.py and
test_prefill_gpu.py state them): decode u (|ref| + max|v|) + 1e-4, prefill
1.1 u (|ref| + attn(|V|)) + 1e-5 (+ fp16's subnormal term), u = 2^-8 bf16, 2^-11 fp16.
"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference import kernels
from project04_llm_inference.kernels import decode, prefill, reference, rope_cache
from project04_llm_inference.kernels.fp8 import FP8_DTYPE, FP8_MAX
from project04_llm_inference.kernels.kv_quant import dequantize_kv, quantize_kv

from .test_prefill_inputs import make_batch

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _as_fp8(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A float cache (num_blocks, bs, Hkv, D) quantized per KV head."""
    return quantize_kv(cache.float().flatten(0, 1), scale).view(cache.shape)


def _dequant(cache: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return dequantize_kv(cache.flatten(0, 1), scale).view(cache.shape)


def _scales(cache: torch.Tensor) -> torch.Tensor:
    """Per-head scales putting each head's absmax at 448 / 2 (headroom both ways)."""
    return (2 * cache.float().abs().amax(dim=(0, 1, 3)) / FP8_MAX).contiguous()


def _decode_case(lens, hq, hkv, d, bs, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = [max(1, -(-n // bs)) for n in lens]
    nb = sum(blocks) + 3
    kf = torch.randn(nb, bs, hkv, d, device="cuda", generator=g)
    vf = torch.randn(nb, bs, hkv, d, device="cuda", generator=g) * torch.linspace(
        0.1, 4.0, hkv, device="cuda"
    ).view(1, 1, hkv, 1)  # heads of different ranges: one scale each
    ks, vs = _scales(kf), _scales(vf)
    perm = torch.randperm(nb, device="cuda", generator=g).to(torch.int32)
    tables = torch.full((len(lens), max(blocks)), nb - 1, dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[at : at + n]
        at += n
    q = torch.randn(len(lens), hq, d, device="cuda", generator=g).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, _as_fp8(kf, ks), _as_fp8(vf, vs), tables, lens_t, ks, vs


def _check_decode(out, q, kc, vc, tables, lens, scale, ks, vs):
    kd, vd = _dequant(kc, ks), _dequant(vc, vs)
    ref = reference.paged_decode_attention(q.float(), kd, vd, tables, lens, scale)
    u = UNIT_ROUNDOFF[q.dtype]
    bound = u * ref.abs() + u * vd.abs().max() + 1e-4
    err = (out.float() - ref).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"
    empty = lens == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("bs", [16, 64])
@pytest.mark.parametrize("group", [1, 4, 16])
def test_decode_over_an_fp8_cache_matches_reference(dtype, d, bs, group):
    hkv = 2
    lens = [1, 17, 0, 300, 1029, 4099]  # ragged, an empty slot, one split and several
    q, kc, vc, tables, lens_t, ks, vs = _decode_case(lens, hkv * group, hkv, d, bs, dtype)
    scale = d**-0.5
    out = decode.paged_decode_attention(q, kc, vc, tables, lens_t, scale, max(lens), ks, vs)
    _check_decode(out, q, kc, vc, tables, lens_t, scale, ks, vs)


@pytest.mark.smoke
def test_decode_over_an_fp8_cache_odd_shape():
    q, kc, vc, tables, lens, ks, vs = _decode_case([33, 5], 6, 2, 128, 16, torch.bfloat16)
    out = decode.paged_decode_attention(q, kc, vc, tables, lens, 0.1, 33, ks, vs)
    _check_decode(out, q, kc, vc, tables, lens, 0.1, ks, vs)


def test_decode_over_an_fp8_cache_replays_in_a_cuda_graph_with_new_lengths():
    lens = [700, 40, 3000, 1]
    q, kc, vc, tables, lens_t, ks, vs = _decode_case(lens, 8, 2, 64, 16, torch.bfloat16)
    upper = 4096
    decode.paged_decode_attention(q, kc, vc, tables, lens_t, 0.125, upper, ks, vs)  # warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode.paged_decode_attention(q, kc, vc, tables, lens_t, 0.125, upper, ks, vs)
    lens_t.copy_(torch.tensor([5, 2999, 0, 1500], dtype=torch.int32))
    q.copy_(torch.randn_like(q))
    ks.mul_(1.5)  # scales are read on the device: a new value is followed too
    graph.replay()
    torch.cuda.synchronize()
    _check_decode(out, q, kc, vc, tables, lens_t, 0.125, ks, vs)


def _prefill_fp8_args(specs, dtype, **kw):
    args, _ = make_batch(specs, dtype=torch.float32, device="cuda", **kw)
    ks, vs = _scales(args[1]), _scales(args[2])
    args[0] = args[0].to(dtype)
    args[1], args[2] = _as_fp8(args[1], ks), _as_fp8(args[2], vs)
    return args, ks, vs


def _check_prefill(args, ks, vs, dtype):
    out = prefill.paged_prefill_attention(*args, ks, vs)
    assert out.dtype == dtype
    q, kd, vd = args[0].float(), _dequant(args[1], ks), _dequant(args[2], vs)
    ref = reference.paged_prefill_attention(q, kd, vd, *args[3:])
    ref_abs_v = reference.paged_prefill_attention(q, kd, vd.abs(), *args[3:])
    u = UNIT_ROUNDOFF[dtype]
    tol = 1.1 * u * (ref.abs() + ref_abs_v) + 1e-5
    if dtype == torch.float16:
        tol += int(args[5].max()) * 2.0**-25 * float(vd.abs().max())
    rows = int(args[4][-1])
    err = (out[:rows].float() - ref[:rows]).abs()
    worst = (err / tol[:rows]).max().item()
    assert worst <= 1.0, f"max error / bound = {worst:.3f}, max error {err.max().item():.3e}"


MIXED = [(1, 1), (17, 17), (127, 127), (50, 200), (128, 1000), (1, 513), (0, 10), (200, 333)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [16, 64])
def test_prefill_over_an_fp8_cache_matches_reference(dtype, d, group, block_size):
    args, ks, vs = _prefill_fp8_args(MIXED, dtype, hq=2 * group, hkv=2, d=d, block_size=block_size)
    _check_prefill(args, ks, vs, dtype)


@pytest.mark.smoke
def test_prefill_over_an_fp8_cache_odd_shape():
    args, ks, vs = _prefill_fp8_args([(33, 70), (5, 5)], torch.bfloat16, hq=6, hkv=2, d=128)
    _check_prefill(args, ks, vs, torch.bfloat16)


def test_prefill_over_an_fp8_cache_replays_in_a_cuda_graph():
    args, ks, vs = _prefill_fp8_args(
        [(20, 100), (10, 100), (1, 100)], torch.bfloat16, hq=8, hkv=2, d=64
    )
    args[4].copy_(torch.tensor([0, 20, 30, 31]))
    args[5].copy_(torch.tensor([20, 100, 30]))
    prefill.paged_prefill_attention(*args, ks, vs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = prefill.paged_prefill_attention(*args, ks, vs)
    args[0].copy_(torch.randn_like(args[0]))
    args[5].copy_(torch.tensor([60, 25, 31]))
    args[4].copy_(torch.tensor([0, 5, 30, 31]))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, prefill.paged_prefill_attention(*args, ks, vs), rtol=0, atol=0)
    _check_prefill(args, ks, vs, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
def test_the_cache_write_stores_the_references_bytes(dtype, d):
    """The kernel's rotated k (left in k) and v, quantized by the reference, are its bytes."""
    g = torch.Generator(device="cuda").manual_seed(1)
    t, hq, hkv, bs = 37, 8, 2, 16
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device="cuda", generator=g).to(dtype)
    q, k, v = kernels.qkv_views(qkv, hq, hkv, d)
    inv = 1.0 / (10_000 ** (torch.arange(0, d, 2, device="cuda") / d))
    cos_sin = reference.rope_cos_sin_cache(inv, 256)
    pos = torch.randint(0, 256, (t,), device="cuda", generator=g)
    slots = torch.randperm(4 * bs, device="cuda", generator=g)[:t]
    slots[3] = -1
    kc = torch.zeros(4, bs, hkv, d, dtype=FP8_DTYPE, device="cuda")
    vc = torch.zeros_like(kc)
    ks = torch.tensor([0.01, 0.03], device="cuda")
    vs = torch.tensor([0.02, 0.005], device="cuda")  # v saturates in head 1: +-448 x scale
    rope_cache.rope_and_cache(q, k, v, pos, cos_sin, kc, vc, slots, ks, vs)
    ok = slots >= 0
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    u8 = torch.uint8
    assert torch.equal(flat_k[slots[ok]].view(u8), quantize_kv(k[ok], ks).view(u8))
    assert torch.equal(flat_v[slots[ok]].view(u8), quantize_kv(v[ok], vs).view(u8))


def test_a_few_tokens_qkv_projection_writes_the_fp8_cache_outside_the_gemv_kernel():
    """At one token the GEMV kernel takes the projection; with an FP8 cache the rope kernel
    then writes the cache, bit for bit what the reference stores from the kernel's q, k, v."""
    g = torch.Generator(device="cuda").manual_seed(2)
    hq, hkv, d, k_in = 8, 2, 64, 256
    x = torch.randn(1, k_in, device="cuda", generator=g).bfloat16()
    nw = torch.ones(k_in, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn((hq + 2 * hkv) * d, k_in, device="cuda", generator=g) * 0.05).bfloat16()
    inv = 1.0 / (10_000 ** (torch.arange(0, d, 2, device="cuda") / d))
    cos_sin = reference.rope_cos_sin_cache(inv, 64)
    kc = torch.zeros(2, 16, hkv, d, dtype=FP8_DTYPE, device="cuda")
    vc = torch.zeros_like(kc)
    ks = torch.tensor([0.01, 0.02], device="cuda")
    vs = torch.tensor([0.02, 0.01], device="cuda")
    pos = torch.tensor([5], device="cuda")
    slot = torch.tensor([7], device="cuda")
    rope = kernels.RopeWrite(hq, hkv, pos, cos_sin, kc, vc, slot, ks, vs)
    out, _ = kernels.norm_linear(x, None, nw, w, 1e-5, rope=rope)
    _, k, v = kernels.qkv_views(out, hq, hkv, d)  # k rotated in out
    u8 = torch.uint8
    assert torch.equal(kc.view(-1, hkv, d)[7].view(u8), quantize_kv(k, ks)[0].view(u8))
    assert torch.equal(vc.view(-1, hkv, d)[7].view(u8), quantize_kv(v, vs)[0].view(u8))


def test_the_engine_with_an_fp8_cache_under_cuda_graphs(d64_dir):
    """Graph replay and eager steps give the same tokens over an FP8 cache (the same kernels,
    the scales read on the device), and the cache the engine decodes from is e4m3. Tokens are
    not compared with the 16-bit cache's: the prefill reads K and V back through e4m3 (2^-4
    relative), enough to flip a near-tie of random weights even at the first token; the
    accuracy of the FP8 cache is `fp8-accuracy`'s measurement on a trained model."""
    from project04_llm_inference import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 3], list(range(30, 97)), list(range(100, 400, 7))]
    runs = {}
    for name, kw in (
        ("auto", dict(kv_cache_dtype="auto")),
        ("graphs", dict(kv_cache_dtype="fp8")),
        ("eager", dict(kv_cache_dtype="fp8", enforce_eager=True)),
    ):
        llm = LLM(str(d64_dir), num_gpu_blocks=64, **kw)
        if name == "graphs":
            assert llm.engine.runner.graphs
        want = torch.bfloat16 if name == "auto" else torch.float8_e4m3fn
        assert all(k.dtype == v.dtype == want for k, v in llm.engine.runner.kv_caches)
        runs[name] = [o.token_ids for o in llm.generate(prompts, params)]
        del llm
        torch.cuda.empty_cache()
    assert runs["graphs"] == runs["eager"]
    assert all(len(r) == 12 for r in runs["graphs"] + runs["auto"])
