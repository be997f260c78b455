"""GPU tier: the decode-step GEMV kernel (csrc/gemv.cu) against float64 references.

Tolerances, from the arithmetic (u = unit roundoff of the dtype: 2^-8 bf16, 2^-11 fp16):
- the product: float32 accumulation of K terms in some order is within gamma_K * (|x| @ |w|^T)
  of the exact sum, gamma_K = K 2^-24 / (1 - K 2^-24); the result is then rounded to the dtype
  (<= u |y|). So |ours - exact| <= u |exact| + (1 + u) gamma_K (|x| @ |w|^T).
- the folded RMSNorm: multiplying by the identity matrix adds nothing to a value (one non-zero
  term), so `norm_linear(x, r, g, I)` returns the kernel's normalised input itself. Against the
  float64 reference it may differ by one ulp (2u relative) where the float32 sum of squares
  (reduced in another order) moves a value across a rounding boundary; the residual sum is one
  rounding of an exact float32 sum: bitwise.
- silu-and-mul behind: the gate and up rows are accumulated exactly as without it, then the same
  expression as the separate kernel: bitwise equal to that composition.
- RoPE and the cache write behind the QKV projection: each row is accumulated exactly as the plain
  product accumulates it, rounded to the dtype, then rotated with the RoPE kernel's operations
  in its order: bitwise equal to the plain GEMV followed by the RoPE kernel.

The tensor-core variant (3 to 8 tokens, `MMA_MAX_TOKENS`; the tests below switch it on):
- the product: a product of two 16-bit values is exact in float32; mma.sync adds a block of b
  of them (b >= 4) to its accumulator with every term aligned to the largest one's exponent and
  truncated, not rounded, to float32's 24 bits, then the sum truncated or rounded (Fasi et al.,
  "Numerical behavior of NVIDIA tensor cores", 2021). Each aligned term then loses less than
  2^-23 of the block's largest term, the sum less than 2^-23 of itself, so a block adds at most
  (b + 2) 2^-23 S with S = |x| @ |w|^T, and the K / b blocks with the kernel's ten float32
  additions of partial sums (four accumulators, eight warps; 2^-24 S each) at most
  (1.5 K + 5) 2^-23 S <= K 2^-22 S for K >= 10: gamma_K with unit 2^-22 instead of 2^-24.
  Small-integer inputs make every partial sum exact (integers below 2^24, which neither the
  alignment nor the rounding touches): there the output is bitwise the exact product, rounded
  once to the dtype, which checks the operand layouts with no tolerance at all.
- the folded RMSNorm: the same arithmetic in the same order as the one-token kernel's: bitwise
  equal to it, row by row (and so within the 2u bound above).
- silu-and-mul and RoPE: each output element's mma result depends only on its own weight row and
  token (not on the row's place in the 16-row tile), so the same bitwise equalities as above.
- a token's output is the same bits at any step size from 3 to 8 (columns of B are independent);
  against the one- and two-token kernel it differs within the bounds (another summation order).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from project04_llm_inference.kernels import gemv, rope_cache
from project04_llm_inference.kernels.norm_act import fused_add_rms_norm, silu_and_mul
from project04_llm_inference.kernels.reference import rope_cos_sin_cache

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
EPS = 1e-5


def _gamma(k: int, unit: float = 2.0**-24) -> float:
    return k * unit / (1 - k * unit)


def _rand(*shape, dtype, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _assert_product_close(out, x, w, unit: float = 2.0**-24):
    """out against the exact x @ w^T, within the bound in the module docstring (unit: of the
    float32 accumulation, 2^-22 for the tensor-core variant)."""
    u, k = UNIT_ROUNDOFF[x.dtype], x.shape[1]
    exact = x.double() @ w.double().T
    bound = u * exact.abs() + (1 + u) * _gamma(k, unit) * (x.double().abs() @ w.double().abs().T)
    err = (out.double() - exact).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("n,k", [(3072, 2048), (2048, 8192), (200, 64), (24, 136)])
def test_linear_is_within_the_rounding_bound(dtype, tokens, n, k):
    x = _rand(tokens, k, dtype=dtype, seed=1)
    w = _rand(n, k, dtype=dtype, scale=0.02, seed=2)
    assert gemv.gemv_applies(x, w)
    _assert_product_close(gemv.linear(x, w), x, w)


def _norm_reference(x, res, g):
    """(normalised input, residual stream) as float64, rounded where Llama's order rounds."""
    dt = x.dtype
    h = (x.float() + res.float()).to(dt) if res is not None else x
    hd = h.double()
    inv = torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + EPS)
    return ((hd * inv).to(dt).double() * g.double()).to(dt), h


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("with_residual", [True, False])
def test_norm_linear_normalises_like_rms_norm(dtype, tokens, with_residual):
    k = 2048
    x = _rand(tokens, k, dtype=dtype, seed=3)
    res = _rand(tokens, k, dtype=dtype, seed=4) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=5)).to(dtype)
    x0, r0 = x.clone(), None if res is None else res.clone()
    eye = torch.eye(k, device="cuda", dtype=dtype)
    hn, stream = gemv.norm_linear(x, res, g, eye, EPS)
    want_hn, want_stream = _norm_reference(x0, r0, g)
    assert torch.equal(x, x0) and (res is None or torch.equal(res, r0)), "inputs were modified"
    assert torch.equal(stream, want_stream), "the residual stream is not x + residual, rounded"
    u = UNIT_ROUNDOFF[dtype]
    err = (hn.double() - want_hn.double()).abs()
    assert (err <= 2 * u * want_hn.double().abs() + 1e-30).all(), f"max error {err.max():.3g}"
    # a one-ulp difference needs a value next to a rounding boundary: rare, not the rule
    assert (err > 0).float().mean().item() < 0.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
def test_norm_linear_product_and_silu_fold(dtype, tokens):
    k, f = 2048, 1024
    x = _rand(tokens, k, dtype=dtype, seed=6)
    res = _rand(tokens, k, dtype=dtype, seed=7)
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=8)).to(dtype)
    w = _rand(2 * f, k, dtype=dtype, scale=0.02, seed=9)
    hn, _ = gemv.norm_linear(x, res, g, torch.eye(k, device="cuda", dtype=dtype), EPS)
    y, _ = gemv.norm_linear(x, res, g, w, EPS)
    _assert_product_close(y, hn, w)  # the product of the kernel's own normalised input
    act, _ = gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)
    assert act.shape == (tokens, f)
    assert torch.equal(act, silu_and_mul(y)), "the folded silu-and-mul differs from the kernel"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 8, 64), (16, 4, 128), (8, 8, 64)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_norm_linear_rope_fold_is_the_gemv_then_the_rope_kernel(
    dtype, tokens, hq, hkv, d, with_residual
):
    k, blocks, bs = 2048, 8, 16
    x = _rand(tokens, k, dtype=dtype, seed=11)
    res = _rand(tokens, k, dtype=dtype, seed=12) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=13)).to(dtype)
    w = _rand((hq + 2 * hkv) * d, k, dtype=dtype, scale=0.02, seed=14)
    inv = 1.0 / (500_000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos_sin = rope_cos_sin_cache(inv.float().cuda(), 512)
    pos = torch.tensor([37, 300][:tokens], device="cuda")
    slots = torch.tensor([5, -1][:tokens], device="cuda")  # the second token: not written
    caches = [_rand(blocks, bs, hkv, d, dtype=dtype, seed=s) for s in (15, 16)]
    want_caches = [c.clone() for c in caches]
    # the composition: plain GEMV (the norm folded), then the RoPE kernel on its q, k, v views
    want, want_res = gemv.norm_linear(x.clone(), None if res is None else res.clone(), g, w, EPS)
    rope_cache.rope_and_cache(*gemv.qkv_views(want, hq, hkv, d), pos, cos_sin, *want_caches, slots)
    rope = gemv.RopeWrite(hq, hkv, pos, cos_sin, caches[0], caches[1], slots)
    got, got_res = gemv.norm_linear(x, res, g, w, EPS, rope=rope)
    assert torch.equal(got, want), "q, k, v rows differ"
    assert torch.equal(got_res, want_res)
    assert torch.equal(caches[0], want_caches[0]), "k cache differs"
    assert torch.equal(caches[1], want_caches[1]), "v cache differs"


def test_rows_do_not_depend_on_the_batch():
    """A token's output is the same bits whatever else is in the step (one row or two)."""
    x = _rand(2, 2048, dtype=torch.bfloat16, seed=10)
    w = _rand(3072, 2048, dtype=torch.bfloat16, scale=0.02, seed=11)
    full = gemv.linear(x, w)
    assert torch.equal(gemv.linear(x[:1].contiguous(), w), full[:1])
    assert torch.equal(gemv.linear(x[1:].contiguous(), w), full[1:])


@pytest.mark.parametrize(
    "x_shape,w_shape,dtype",
    [
        ((9, 64), (32, 64), torch.bfloat16),  # 9 tokens: past the tensor-core variant's 8
        ((2, 60), (32, 60), torch.bfloat16),  # K not a multiple of 8
        ((2, 64), (32, 64), torch.float32),
    ],  # not a 16-bit dtype
)
def test_other_shapes_take_cublas(x_shape, w_shape, dtype):
    x, w = _rand(*x_shape, dtype=dtype, seed=12), _rand(*w_shape, dtype=dtype, seed=13)
    assert not gemv.gemv_applies(x, w)
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))
    g = torch.ones(x_shape[1], device="cuda", dtype=dtype)
    got, stream = gemv.norm_linear(x.clone(), x.clone(), g, w, EPS)
    h, r = fused_add_rms_norm(x.clone(), x.clone(), g, EPS)
    assert torch.equal(got, F.linear(h, w)) and torch.equal(stream, r)


def test_rows_too_wide_to_stage_take_cublas():
    k = gemv.MAX_STAGED_BYTES // 4 + 8  # two bf16 rows just past the shared-memory bound
    x, w = _rand(2, k, dtype=torch.bfloat16, seed=20), _rand(16, k, dtype=torch.bfloat16, seed=21)
    assert not gemv.gemv_applies(x, w) and gemv.gemv_applies(x[:1], w)
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))
    _assert_product_close(gemv.linear(x[:1].contiguous(), w), x[:1], w)


@pytest.mark.smoke  # the folded norm, silu-and-mul and a plain product, captured and replayed
def test_replays_in_a_cuda_graph():
    k = 2048
    x = _rand(2, k, dtype=torch.bfloat16, seed=14)
    res = _rand(2, k, dtype=torch.bfloat16, seed=15)
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=16)).to(torch.bfloat16)
    w = _rand(512, k, dtype=torch.bfloat16, scale=0.02, seed=17)
    gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)  # builds and warms up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        act, stream = gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)
        y = gemv.linear(act, w[:, :256].contiguous())
    for seed in (18, 19):
        x.copy_(_rand(2, k, dtype=torch.bfloat16, seed=seed))
        graph.replay()
        want_act, want_stream = gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)
        assert torch.equal(act, want_act) and torch.equal(stream, want_stream)
        assert torch.equal(y, gemv.linear(want_act, w[:, :256].contiguous()))


@pytest.mark.smoke  # programmatic dependent launch keeps every read after the write it needs
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])  # 5, 8: the tensor-core variant
def test_a_chain_with_pdl_equals_ordinary_launches(tokens, monkeypatch):
    """Layers of norm -> projection -> projection -> norm+SwiGLU -> projection, each product
    reading the one before, captured in one CUDA graph with PDL: every kernel starts early and
    loads weights before it waits, so a read of an input before its producer finished would
    change the output. Same kernels, same order: bitwise equal to eager ordinary launches."""
    from project04_llm_inference.kernels import pdl

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90 or newer")
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", 8)
    d, f, layers = 2048, 4096, 4
    ws = [
        {
            "n1": (1 + _rand(d, dtype=torch.float32, scale=0.1, seed=100 + i)).to(torch.bfloat16),
            "n2": (1 + _rand(d, dtype=torch.float32, scale=0.1, seed=200 + i)).to(torch.bfloat16),
            "a": _rand(d, d, dtype=torch.bfloat16, scale=d**-0.5, seed=300 + i),
            "o": _rand(d, d, dtype=torch.bfloat16, scale=d**-0.5, seed=400 + i),
            "gu": _rand(2 * f, d, dtype=torch.bfloat16, scale=d**-0.5, seed=500 + i),
            "down": _rand(d, f, dtype=torch.bfloat16, scale=f**-0.5, seed=600 + i),
        }
        for i in range(layers)
    ]
    x = _rand(tokens, d, dtype=torch.bfloat16, seed=20)
    assert gemv.gemv_applies(x, ws[0]["a"])

    def chain():
        h, res = x, None
        for lw in ws:
            a, res = gemv.norm_linear(h, res, lw["n1"], lw["a"], EPS)
            o = gemv.linear(a, lw["o"])
            act, res = gemv.norm_linear(o, res, lw["n2"], lw["gu"], EPS, silu_mul=True)
            h = gemv.linear(act, lw["down"])
        return h, res

    saved = pdl.USE_PDL
    try:
        pdl.USE_PDL = True
        chain()  # builds and warms up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, stream = chain()
        pdl.USE_PDL = False
        for seed in (21, 22, 23):
            x.copy_(_rand(tokens, d, dtype=torch.bfloat16, seed=seed))
            graph.replay()
            want, want_stream = chain()
            assert torch.isfinite(want.float()).all()
            assert torch.equal(out, want) and torch.equal(stream, want_stream)
    finally:
        pdl.USE_PDL = saved


# ---- the tensor-core variant: 3 to 8 tokens ---------------------------------------------------

MMA_UNIT = 2.0**-22  # the accumulation's unit (module docstring)
# Llama-3.2-1B's projections (rows, K, fold) and the LM head, as bench/gemv.py times them
SHAPES_1B = [
    (3072, 2048, "qkv"),
    (2048, 2048, "o"),
    (16384, 2048, "gate_up"),
    (2048, 8192, "down"),
    (128256, 2048, "lm_head"),
]
MMA_TOKENS = [3, 4, 5, 6, 7, 8]


@pytest.fixture
def mma_on(monkeypatch):
    """The tensor-core variant on for 3..8 tokens (off by default until measured)."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the tensor-core variant needs sm_80 or newer")
    monkeypatch.setattr(gemv, "MMA_MAX_TOKENS", 8)


def _ints(*shape, dtype, seed):
    """Integers in [-3, 3]: every partial sum of a product of K <= 8192 terms is exact."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-3, 4, shape, device="cuda", generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", MMA_TOKENS)
@pytest.mark.parametrize("n,k", [(n, k) for n, k, _ in SHAPES_1B] + [(200, 64), (24, 136)])
def test_mma_linear_is_within_the_rounding_bound(mma_on, dtype, tokens, n, k):
    x = _rand(tokens, k, dtype=dtype, seed=31)
    w = _rand(n, k, dtype=dtype, scale=0.02, seed=32)
    assert gemv.gemv_applies(x, w)
    _assert_product_close(gemv.linear(x, w), x, w, MMA_UNIT)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", MMA_TOKENS)
@pytest.mark.parametrize("n,k", [(n, k) for n, k, _ in SHAPES_1B] + [(200, 64), (24, 136)])
def test_mma_linear_of_small_integers_is_exact(mma_on, dtype, tokens, n, k):
    """Exact partial sums: any slip in the A or B fragment layout, the k permutation, the
    K split over warps or a tail shows as a wrong value, with no tolerance to hide in."""
    x, w = _ints(tokens, k, dtype=dtype, seed=33), _ints(n, k, dtype=dtype, seed=34)
    want = (x.double() @ w.double().T).to(dtype)
    assert torch.equal(gemv.linear(x, w), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", MMA_TOKENS)
@pytest.mark.parametrize("with_residual", [True, False])
def test_mma_norm_linear_normalises_like_the_one_token_kernel(mma_on, dtype, tokens, with_residual):
    k = 2048
    x = _rand(tokens, k, dtype=dtype, seed=35)
    res = _rand(tokens, k, dtype=dtype, seed=36) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=37)).to(dtype)
    x0, r0 = x.clone(), None if res is None else res.clone()
    eye = torch.eye(k, device="cuda", dtype=dtype)
    hn, stream = gemv.norm_linear(x, res, g, eye, EPS)
    assert torch.equal(x, x0) and (res is None or torch.equal(res, r0)), "inputs were modified"
    want_hn, want_stream = _norm_reference(x0, r0, g)
    assert torch.equal(stream, want_stream), "the residual stream is not x + residual, rounded"
    u = UNIT_ROUNDOFF[dtype]
    err = (hn.double() - want_hn.double()).abs()
    assert (err <= 2 * u * want_hn.double().abs() + 1e-30).all(), f"max error {err.max():.3g}"
    for t in range(tokens):  # the one-token kernel: the same arithmetic, the same order
        row = x0[t : t + 1].contiguous()
        one, _ = gemv.norm_linear(
            row, None if r0 is None else r0[t : t + 1].contiguous(), g, eye, EPS
        )
        assert torch.equal(hn[t : t + 1], one), f"token {t}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", MMA_TOKENS)
@pytest.mark.parametrize("with_residual", [True, False])
def test_mma_norm_linear_product_and_silu_fold(mma_on, dtype, tokens, with_residual):
    n, k = 16384, 2048  # Llama-3.2-1B's gate/up projection
    x = _rand(tokens, k, dtype=dtype, seed=38)
    res = _rand(tokens, k, dtype=dtype, seed=39) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=40)).to(dtype)
    w = _rand(n, k, dtype=dtype, scale=0.02, seed=41)

    def call(weight, **kw):
        return gemv.norm_linear(x, None if res is None else res, g, weight, EPS, **kw)

    hn, _ = call(torch.eye(k, device="cuda", dtype=dtype))
    y, stream = call(w)
    _assert_product_close(y, hn, w, MMA_UNIT)  # the product of the kernel's own normalised input
    act, act_stream = call(w, silu_mul=True)
    assert act.shape == (tokens, n // 2)
    assert torch.equal(act, silu_and_mul(y)), "the folded silu-and-mul differs from the kernel"
    assert torch.equal(act_stream, stream)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", MMA_TOKENS)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 8, 64), (16, 4, 128), (8, 8, 64)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_mma_norm_linear_rope_fold_is_the_gemv_then_the_rope_kernel(
    mma_on, dtype, tokens, hq, hkv, d, with_residual
):
    k, blocks, bs = 2048, 8, 16
    x = _rand(tokens, k, dtype=dtype, seed=42)
    res = _rand(tokens, k, dtype=dtype, seed=43) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=44)).to(dtype)
    w = _rand((hq + 2 * hkv) * d, k, dtype=dtype, scale=0.02, seed=45)
    inv = 1.0 / (500_000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos_sin = rope_cos_sin_cache(inv.float().cuda(), 512)
    pos = torch.tensor([37, 300, 5, 511, 0, 64, 65, 200][:tokens], device="cuda")
    slots = torch.tensor([5, -1, 17, 100, 127, 0, 64, -1][:tokens], device="cuda")
    caches = [_rand(blocks, bs, hkv, d, dtype=dtype, seed=s) for s in (46, 47)]
    want_caches = [c.clone() for c in caches]
    want, want_res = gemv.norm_linear(x.clone(), None if res is None else res.clone(), g, w, EPS)
    rope_cache.rope_and_cache(*gemv.qkv_views(want, hq, hkv, d), pos, cos_sin, *want_caches, slots)
    rope = gemv.RopeWrite(hq, hkv, pos, cos_sin, caches[0], caches[1], slots)
    got, got_res = gemv.norm_linear(x, res, g, w, EPS, rope=rope)
    assert torch.equal(got, want), "q, k, v rows differ"
    assert torch.equal(got_res, want_res)
    assert torch.equal(caches[0], want_caches[0]), "k cache differs"
    assert torch.equal(caches[1], want_caches[1]), "v cache differs"


def test_mma_rows_do_not_depend_on_the_step_size(mma_on):
    """A token's output is the same bits at any step of 3 to 8 tokens."""
    x = _rand(8, 2048, dtype=torch.bfloat16, seed=48)
    w = _rand(3072, 2048, dtype=torch.bfloat16, scale=0.02, seed=49)
    full = gemv.linear(x, w)
    for lo, hi in [(0, 3), (0, 7), (2, 7), (5, 8)]:
        assert torch.equal(gemv.linear(x[lo:hi].contiguous(), w), full[lo:hi]), (lo, hi)


def test_mma_widest_staged_rows_and_the_bound(mma_on):
    """Eight rows of K = 9,216 (144 KB staged, past the 48 KB default: the shared-memory opt-in)
    run the kernel; a few more K take cuBLAS."""
    k = gemv.MMA_MAX_STAGED_BYTES // 16
    x, w = _rand(8, k, dtype=torch.bfloat16, seed=50), _rand(64, k, dtype=torch.bfloat16, seed=51)
    assert gemv.gemv_applies(x, w)
    _assert_product_close(gemv.linear(x, w), x, w, MMA_UNIT)
    x, w = _rand(8, k + 8, dtype=torch.bfloat16, seed=52), _rand(64, k + 8, dtype=torch.bfloat16)
    assert not gemv.gemv_applies(x, w)
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))


def test_more_than_eight_tokens_take_cublas(mma_on):
    x, w = _rand(9, 64, dtype=torch.bfloat16, seed=53), _rand(32, 64, dtype=torch.bfloat16)
    assert not gemv.gemv_applies(x, w)
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))


@pytest.mark.smoke  # the tensor-core variant, every fold, captured and replayed
def test_mma_replays_in_a_cuda_graph(mma_on):
    k, t = 2048, 6
    x = _rand(t, k, dtype=torch.bfloat16, seed=54)
    res = _rand(t, k, dtype=torch.bfloat16, seed=55)
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=56)).to(torch.bfloat16)
    w = _rand(512, k, dtype=torch.bfloat16, scale=0.02, seed=57)
    gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)  # builds and warms up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        act, stream = gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)
        y = gemv.linear(act, w[:, :256].contiguous())
    for seed in (58, 59):
        x.copy_(_rand(t, k, dtype=torch.bfloat16, seed=seed))
        graph.replay()
        want_act, want_stream = gemv.norm_linear(x, res, g, w, EPS, silu_mul=True)
        assert torch.equal(act, want_act) and torch.equal(stream, want_stream)
        assert torch.equal(y, gemv.linear(want_act, w[:, :256].contiguous()))
