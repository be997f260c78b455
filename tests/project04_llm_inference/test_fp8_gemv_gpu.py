"""GPU tier: the GEMV kernel's FP8 variant (e4m3 weights, one float32 scale per row, 16-bit
activations: W8A16) against float64 references of the dequantized weight, every fold, and in
the engine.

The bound, from the arithmetic (u = unit roundoff of the activation dtype: 2^-8 bf16, 2^-11
fp16; W = q * s the dequantized weight, computed exactly in float64: q has 4 significant bits,
s 24):
- each term q_k x_k is exact in float32 (4 + 8 or 4 + 11 significant bits), so the only
  accumulation error is the float32 summation of K terms in the kernel's order, within
  gamma_K (|x| @ |q|^T); the product by s is one float32 rounding (2^-24), and the result is
  rounded once to the dtype (u |y|). So |ours - exact| <= u |exact| + (1 + u) gamma_{K+1}
  (|x| @ |W|^T): the 16-bit kernel's bound with one more rounding. No activation is quantized,
  so nothing of e4m3's 2^-4 enters: the companion test shows `_scaled_mm`'s W8A8 result (which
  quantizes x) outside this bound.
- the folded RMSNorm stages the same bits as the 16-bit kernel (same arithmetic, same order;
  only where a chunk lies in shared memory differs), so the product is checked against the
  16-bit kernel's own normalised input (`norm_linear` with the identity), and the residual
  stream is bitwise the 16-bit kernel's.
- silu-and-mul and RoPE + the cache write behind the product: each row's scaled dot product
  is what the plain FP8 product computes, then the same epilogue: bitwise equal to the plain
  FP8 GEMV followed by the separate silu-and-mul / RoPE kernels.
"""

from __future__ import annotations

import random

import pytest
import torch

from project04_llm_inference.kernels import fp8 as fp8_module
from project04_llm_inference.kernels import gemv, rope_cache
from project04_llm_inference.kernels.fp8 import MIN_FP8_CAPABILITY, Fp8Weight, fp8_linear
from project04_llm_inference.kernels.norm_act import silu_and_mul
from project04_llm_inference.kernels.reference import rope_cos_sin_cache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_FP8_CAPABILITY,
        reason="needs a CUDA GPU of compute capability >= 8.9",
    ),
]

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
EPS = 1e-5
# (rows, K): Llama-3.2-1B's qkv and down projections, and odd row counts with K = 16 x odd
SHAPES = [(3072, 2048), (2048, 8192), (201, 1040), (25, 208)]


def _gamma(k: int) -> float:
    return k * 2.0**-24 / (1 - k * 2.0**-24)


def _rand(*shape, dtype, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _fp8(n, k, seed):
    return Fp8Weight.from_float(_rand(n, k, dtype=torch.float32, scale=0.02, seed=seed))


def _bound_excess(out, x, fw: Fp8Weight) -> float:
    """max(|out - exact| - bound) over the output (<= 0: within the module docstring's bound)."""
    u, k = UNIT_ROUNDOFF[x.dtype], x.shape[1]
    w = fw.qweight.double() * fw.scale.double()[:, None]  # exact
    exact = x.double() @ w.T
    bound = u * exact.abs() + (1 + u) * _gamma(k + 1) * (x.double().abs() @ w.abs().T)
    return ((out.double() - exact).abs() - bound).max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("n,k", SHAPES)
def test_fp8_linear_is_within_the_w8a16_bound(dtype, tokens, n, k):
    x, fw = _rand(tokens, k, dtype=dtype, seed=1), _fp8(n, k, seed=2)
    assert gemv.gemv_applies(x, fw)
    y = gemv.linear(x, fw)
    assert y.dtype == dtype and y.shape == (tokens, n)
    assert _bound_excess(y, x, fw) <= 0


@pytest.mark.smoke  # the FP8 variant once, on an odd shape: 201 rows, K = 16 x 65, 2 tokens
def test_fp8_linear_smoke():
    x, fw = _rand(2, 1040, dtype=torch.bfloat16, seed=9), _fp8(201, 1040, seed=10)
    assert gemv.gemv_applies(x, fw)
    assert _bound_excess(gemv.linear(x, fw), x, fw) <= 0


def test_the_w8a8_product_is_outside_the_w8a16_bound():
    """The companion: `_scaled_mm` quantizes the activations to e4m3 (2^-4 relative), which
    this bound has no room for, so the bound would catch a kernel that did the same."""
    x, fw = _rand(1, 2048, dtype=torch.bfloat16, seed=3), _fp8(3072, 2048, seed=4)
    assert gemv.fp8_route(1, 3072, 2048, torch.bfloat16, "cuda", (9, 0)) == "gemv"
    assert _bound_excess(fp8_linear(x, fw), x, fw) > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("f,k", [(1024, 2048), (201, 1040)])
def test_fp8_norm_linear_product_and_silu_fold(dtype, tokens, with_residual, f, k):
    x = _rand(tokens, k, dtype=dtype, seed=5)
    res = _rand(tokens, k, dtype=dtype, seed=6) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=7)).to(dtype)
    fw = _fp8(2 * f, k, seed=8)

    def call(weight, **kw):
        return gemv.norm_linear(x, res, g, weight, EPS, **kw)

    x0, r0 = x.clone(), None if res is None else res.clone()
    hn, want_stream = call(torch.eye(k, device="cuda", dtype=dtype))  # the 16-bit kernel's
    assert gemv.gemv_applies(x, fw)
    y, stream = call(fw)
    assert torch.equal(x, x0) and (res is None or torch.equal(res, r0)), "inputs were modified"
    assert torch.equal(stream, want_stream), "the residual stream differs from the 16-bit kernel's"
    assert _bound_excess(y, hn, fw) <= 0  # the product of the kernel's normalised input
    act, act_stream = call(fw, silu_mul=True)
    assert act.shape == (tokens, f)
    assert torch.equal(act, silu_and_mul(y)), "the folded silu-and-mul differs from the kernel"
    assert torch.equal(act_stream, stream)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 8, 64), (16, 4, 128), (8, 8, 64)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_fp8_norm_linear_rope_fold_is_the_gemv_then_the_rope_kernel(
    dtype, tokens, hq, hkv, d, with_residual
):
    k, blocks, bs = 2048, 8, 16
    x = _rand(tokens, k, dtype=dtype, seed=11)
    res = _rand(tokens, k, dtype=dtype, seed=12) if with_residual else None
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=13)).to(dtype)
    fw = _fp8((hq + 2 * hkv) * d, k, seed=14)
    inv = 1.0 / (500_000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos_sin = rope_cos_sin_cache(inv.float().cuda(), 512)
    pos = torch.tensor([37, 300][:tokens], device="cuda")
    slots = torch.tensor([5, -1][:tokens], device="cuda")  # the second token: not written
    caches = [_rand(blocks, bs, hkv, d, dtype=dtype, seed=s) for s in (15, 16)]
    want_caches = [c.clone() for c in caches]
    want, want_res = gemv.norm_linear(x.clone(), None if res is None else res.clone(), g, fw, EPS)
    rope_cache.rope_and_cache(*gemv.qkv_views(want, hq, hkv, d), pos, cos_sin, *want_caches, slots)
    rope = gemv.RopeWrite(hq, hkv, pos, cos_sin, caches[0], caches[1], slots)
    got, got_res = gemv.norm_linear(x, res, g, fw, EPS, rope=rope)
    assert torch.equal(got, want), "q, k, v rows differ"
    assert torch.equal(got_res, want_res)
    assert torch.equal(caches[0], want_caches[0]), "k cache differs"
    assert torch.equal(caches[1], want_caches[1]), "v cache differs"


def test_fp8_rows_do_not_depend_on_the_batch():
    x, fw = _rand(2, 2048, dtype=torch.bfloat16, seed=20), _fp8(3072, 2048, seed=21)
    full = gemv.linear(x, fw)
    assert torch.equal(gemv.linear(x[:1].contiguous(), fw), full[:1])
    assert torch.equal(gemv.linear(x[1:].contiguous(), fw), full[1:])


@pytest.mark.parametrize("tokens", [3, 8, 64])
def test_three_tokens_and_more_take_scaled_mm(tokens):
    """The tensor-core variant reads 16-bit weights only: FP8 at 3..8 tokens (and beyond) keeps
    `torch._scaled_mm`, bit for bit what `fp8_linear` computes."""
    x, fw = _rand(tokens, 2048, dtype=torch.bfloat16, seed=22), _fp8(3072, 2048, seed=23)
    assert not gemv.gemv_applies(x, fw)
    assert fp8_module.scaled_mm_applies(x, fw)
    assert torch.equal(gemv.linear(x, fw), fp8_linear(x, fw))


@pytest.mark.smoke  # the FP8 variant's folds captured in a CUDA graph and replayed
def test_fp8_replays_in_a_cuda_graph():
    k = 2048
    x = _rand(2, k, dtype=torch.bfloat16, seed=24)
    res = _rand(2, k, dtype=torch.bfloat16, seed=25)
    g = (1 + _rand(k, dtype=torch.float32, scale=0.1, seed=26)).to(torch.bfloat16)
    gate_up, down = _fp8(1024, k, seed=27), _fp8(256, 512, seed=28)
    gemv.norm_linear(x, res, g, gate_up, EPS, silu_mul=True)  # builds and warms up outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        act, stream = gemv.norm_linear(x, res, g, gate_up, EPS, silu_mul=True)
        y = gemv.linear(act, down)
    for seed in (29, 30):
        x.copy_(_rand(2, k, dtype=torch.bfloat16, seed=seed))
        graph.replay()
        want_act, want_stream = gemv.norm_linear(x, res, g, gate_up, EPS, silu_mul=True)
        assert torch.equal(act, want_act) and torch.equal(stream, want_stream)
        assert torch.equal(y, gemv.linear(want_act, down))


# ---- the engine: --quantization fp8 at batch 1 ------------------------------------------------


def _prompts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randint(10, 200))] for _ in range(n)]


def test_fp8_engine_at_batch_1_replays_the_gemv_path_from_cuda_graphs(d64_dir):
    """Every decode projection at batch 1 takes the FP8 GEMV; the decode steps replayed from
    CUDA graphs give the eager engine's greedy tokens and logprobs, bit for bit (same kernels,
    same shapes)."""
    from project04_llm_inference import LLM, SamplingParams

    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True)
    kw = dict(dtype="bfloat16", max_model_len=1024, num_gpu_blocks=256, quantization="fp8")
    graphs, eager = LLM(str(d64_dir), **kw), LLM(str(d64_dir), enforce_eager=True, **kw)
    layer = graphs.engine.runner.model.layers[0]
    x = torch.zeros(1, layer.down_proj.shape[1], device="cuda", dtype=torch.bfloat16)
    assert gemv.gemv_applies(x, layer.down_proj)
    assert graphs.engine.runner.graphs
    for p in _prompts(4, seed=1):  # one request at a time: batch 1
        a = graphs.generate([p], params)[0]
        b = eager.generate([p], params)[0]
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_fp8_engine_decode_logits_w8a16_gemv_against_w8a8(d64_dir, monkeypatch):
    """One decode step at batch 1, teacher-forced, three ways on the same inputs: the FP8 GEMV
    (W8A16), `_scaled_mm` (W8A8, what FP8 ran before the GEMV) and the dequantizing reference
    (W8A16 through cuBLAS with the weights dequantized to bf16).

    Greedy tokens are not compared: W8A8 quantizes every activation to e4m3 (2^-4 relative per
    element) and W8A16 does not, so the two paths' logits differ by far more than bf16
    rounding, and random weights have near-ties of the top two logits which that difference
    flips (the rest of the sequence then diverges). What the arithmetic does say: the GEMV and
    the reference both keep the activations in bf16 and differ only by bf16 roundings (2^-8:
    the reference's dequantized weights and both outputs), 16 times below e4m3's 2^-4, so the
    GEMV's logits lie much closer to the reference's than the W8A8 logits do (asserted with a
    factor 2 where the unit roundoffs give 16)."""
    from project04_llm_inference import LLM, SamplingParams

    llm = LLM(
        str(d64_dir),
        dtype="bfloat16",
        max_model_len=1024,
        num_gpu_blocks=256,
        quantization="fp8",
        enforce_eager=True,
        async_scheduling=False,
    )
    eng, model = llm.engine, llm.engine.runner.model
    for i, prompt in enumerate(_prompts(4, seed=2)):
        eng.add_request(str(i), prompt, SamplingParams(max_tokens=4, temperature=0))
        eng.step()  # the prefill, which samples the first token
        batch = eng.scheduler.schedule()
        ids, meta, _ = eng.runner.prepare(batch.items)
        assert ids.numel() == 1  # the decode step of one sequence
        logits = {}
        with torch.inference_mode():
            for path in ("gemv", "scaled_mm", "reference"):
                monkeypatch.setattr(gemv, "FP8_GEMV", path == "gemv")
                if path == "reference":
                    monkeypatch.setattr(fp8_module, "scaled_mm_applies", lambda x, w: False)
                logits[path] = model.compute_logits(model(ids, meta, eng.runner.kv_caches))[-1]
        monkeypatch.undo()
        ref = logits["reference"].float()
        err_gemv = (logits["gemv"].float() - ref).norm()
        err_mm = (logits["scaled_mm"].float() - ref).norm()
        assert err_mm > 0, "the W8A8 path computed the W8A16 logits: it did not run"
        assert err_gemv <= 0.5 * err_mm, (float(err_gemv), float(err_mm))
        eng.abort(str(i))
