"""FP8 projections on a GPU (compute capability >= 8.9): `torch._scaled_mm` W8A8 against the
float32 product within the stated bound, eagerly and replayed from a CUDA graph, and the
engine's FP8 model against its bf16 model.

The W8A8 bound: each weight and each activation is rounded to e4m3 once (2^-4 relative each,
normal values), so each product term errs by <= (1 + 2^-4)^2 - 1 < 2^-3 + 2^-8 relative;
the float32 accumulation adds K 2^-24 and the bfloat16 output 2^-8, all relative to
|x| @ |W|^T. Subnormal weights and activations add at most 2^-10 of their scale times the
other operand's magnitude per term: with randn activations (|x| < 6, scale < 6/448) and
0.02 randn weights (|w| < 0.12, scale < 0.12/448) over K = 1024 terms, under SUBNORMAL.
"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference.kernels.fp8 import (
    MIN_FP8_CAPABILITY,
    Fp8Weight,
    fp8_linear,
    scaled_mm_applies,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < MIN_FP8_CAPABILITY,
        reason="needs a CUDA GPU of compute capability >= 8.9",
    ),
]
BOUND = 2.0**-3 + 2.0**-8 + 2.0**-8
SUBNORMAL = 1024 * 2.0**-10 * (6 / 448 * 0.12 + 0.12 / 448 * 6)


def _case(t: int, n: int = 2048, k: int = 1024, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    return x, w, Fp8Weight.from_float(w)


def _check(y, x, w):
    ref = x.float() @ w.float().T
    mag = x.float().abs() @ w.float().abs().T
    assert ((y.float() - ref).abs() <= BOUND * mag + SUBNORMAL).all()


@pytest.mark.smoke
@pytest.mark.parametrize("t", [1, 7, 64, 333])
def test_scaled_mm_against_float32_within_the_w8a8_bound(t):
    x, w, fw = _case(t)
    assert scaled_mm_applies(x, fw)
    y = fp8_linear(x, fw)
    assert y.dtype == torch.bfloat16 and y.shape == (t, 2048)
    _check(y, x, fw.dequantize())


def test_scaled_mm_under_a_cuda_graph_matches_eager():
    x, w, fw = _case(16)
    eager = fp8_linear(x, fw)
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fp8_linear(static_x, fw)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fp8_linear(static_x, fw)
    x2, _, _ = _case(16, seed=3)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fp8_linear(x2, fw))
    static_x.copy_(x)
    g.replay()
    assert torch.equal(out, eager)


def test_fp8_engine_runs_its_decode_steps_from_cuda_graphs():
    """The FP8 model (dummy Llama-3.2-1B shape) in the engine: graphs captured over the
    `_scaled_mm` path, every request finishing with its tokens. (Accuracy against bf16 is the
    fp8-accuracy benchmark's record: random weights have too narrow logit gaps to assert.)"""
    from project04_llm_inference import LLM, SamplingParams
    from project04_llm_inference.kernels.fp8 import Fp8Weight as W

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = LLM(load_format="dummy", max_model_len=512, num_gpu_blocks=256, quantization="fp8")
    assert isinstance(llm.engine.runner.model.layers[0].qkv_proj, W)
    assert llm.engine.runner.graphs
    outs = llm.generate([list(range(100, 140)), [5]], params)
    assert [len(o.token_ids) for o in outs] == [16, 16]
