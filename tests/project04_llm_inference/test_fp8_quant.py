"""FP8 e4m3 weights with per-output-channel scales: the quantizer's error bound, the projection
against its float32 reference, the model's layers taking FP8 weights, and refused settings.

The bound: e4m3 keeps 3 mantissa bits, so rounding a value in e4m3's normal range (|v| >= 2^-6)
to nearest errs by at most half a unit in the last place, 2^-4 relative; below it (subnormals,
step 2^-9) the error is at most 2^-10 absolute. Quantized values are v = w / s with one scale s
per row, so the bounds hold for w with the row's s as the unit: |w - w_hat| <= 2^-4 |w| where
|w / s| >= 2^-6, else <= 2^-10 s. The float32 division and product add <= 2^-23 relative (SLACK).
"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference import kernels
from project04_llm_inference.config import DUMMY_SHAPES, EngineArgs
from project04_llm_inference.kernels.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Weight,
    dequantize_rows,
    fp8_linear,
    quantize_rows,
)
from project04_llm_inference.model.loader import build_model
from project04_llm_inference.model.quant import check_fp8_device

REL = 2.0**-4  # half an e4m3 ulp, relative, for normal values
SUB = 2.0**-10  # half the subnormal step 2^-9, in units of the row's scale
SLACK = 2.0**-22  # float32 rounding of w / s and of q * s


def _rows_of_many_magnitudes(n=48, k=160, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    mags = 10.0 ** torch.linspace(-6, 3, n)  # rows from 1e-6 to 1e3: a per-row scale matters
    w = w * mags[:, None]
    w[0, :5] = 0.0  # exact zeros stay zero
    w[1] = 0.0  # an all-zero row gets a finite scale
    return w


def _bound_violations(w: torch.Tensor, w_hat: torch.Tensor, s: torch.Tensor) -> int:
    v = (w / s[:, None]).abs()
    err = (w - w_hat).abs()
    normal = v >= 2.0**-6
    bound = torch.where(normal, (REL + SLACK) * w.abs(), (SUB + SLACK) * s[:, None].expand_as(w))
    return int((err > bound).sum())


def test_round_trip_is_within_the_e4m3_bound_per_element():
    w = _rows_of_many_magnitudes()
    q, s = quantize_rows(w)
    assert q.dtype == FP8_DTYPE and s.shape == (w.shape[0],) and torch.isfinite(s).all()
    w_hat = dequantize_rows(q, s)
    assert _bound_violations(w, w_hat, s) == 0
    assert torch.equal(w_hat[1], torch.zeros_like(w[1])) and (w_hat[0, :5] == 0).all()
    # each row's largest magnitude maps onto e4m3's largest value, 448, exactly
    assert torch.equal(q[2:].float().abs().amax(dim=1), torch.full((w.shape[0] - 2,), FP8_MAX))


def test_one_scale_for_the_whole_tensor_breaks_the_bound():
    """The companion: the per-channel bound fails for a quantizer with one per-tensor scale,
    which flushes the small rows into subnormals and zero."""
    w = _rows_of_many_magnitudes()
    s = torch.full((w.shape[0],), float(w.abs().max()) / FP8_MAX)
    q = (w / s[:, None]).to(FP8_DTYPE)
    _, per_row = quantize_rows(w)
    assert _bound_violations(w, dequantize_rows(q, s), per_row) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_against_its_float32_reference(dtype):
    """|x W^T - x W_hat^T| <= sum_k |x_k| |w_k - w_hat_k|: per element 2^-4 |w_k| for normal
    values and 2^-10 s for subnormal ones, so the sum is within 2^-4 (|x| @ |W|^T) plus
    2^-10 s sum_k |x_k|; the output dtype's rounding adds 2^-8 (bfloat16) or 2^-22 (float32) of
    |x| @ |W|^T, which bounds |y|."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 96, generator=g)
    w = torch.randn(80, 96, generator=g) * 0.05
    fw = Fp8Weight.from_float(w)
    y = fp8_linear(x.to(dtype), fw).float()
    ref = x.to(dtype).float() @ w.T
    mag = x.to(dtype).float().abs() @ w.abs().T
    sub = (SUB * fw.scale)[None, :] * x.to(dtype).float().abs().sum(dim=1, keepdim=True)
    out_round = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-22
    assert ((y - ref).abs() <= (REL + out_round) * mag + sub + 1e-6).all()
    # and it is the dequantized product, which is what the CPU path computes
    torch.testing.assert_close(y, (x.to(dtype) @ fw.dequantize(dtype).T).float(), atol=0, rtol=0)


def test_the_layers_take_fp8_weights_through_the_same_ops():
    """kernels.linear and kernels.norm_linear (SwiGLU and the QKV + RoPE + cache write) with an
    Fp8Weight compute exactly what they compute with its dequantized weight."""
    g = torch.Generator().manual_seed(2)
    x, res, nw = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g), torch.ones(64)
    w = torch.randn(128, 64, generator=g) * 0.1
    fw = Fp8Weight.from_float(w)
    dq = fw.dequantize()
    assert torch.equal(kernels.linear(x, fw), kernels.linear(x, dq))
    a = kernels.norm_linear(x.clone(), res.clone(), nw, fw, 1e-5, silu_mul=True)
    b = kernels.norm_linear(x.clone(), res.clone(), nw, dq, 1e-5, silu_mul=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_model_loaded_with_fp8_quantizes_its_projections_only():
    model = build_model(
        DUMMY_SHAPES["tiny"],
        model_dir=None,
        dtype=torch.float32,
        device=torch.device("cpu"),
        max_positions=64,
        quantization="fp8",
    )
    layer = model.layers[0]
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        assert isinstance(getattr(layer, name), Fp8Weight)
    assert model.embed_tokens.dtype == model.lm_head.dtype == torch.float32
    names = {n for n, _ in model.named_parameters()}
    assert not any("proj" in n for n in names)  # the full-precision copies are gone


def test_fp8_engine_generates_on_the_cpu(hf_model_dir):
    """End to end through the engine (the CPU's dequantizing path): greedy tokens from the FP8
    model, most of them those of the float32 model (the tiny model's logit gaps are wide)."""
    from project04_llm_inference import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 3], list(range(30, 52))]
    outs = {}
    for q in ("none", "fp8"):
        llm = LLM(str(hf_model_dir), device="cpu", num_gpu_blocks=16, quantization=q)
        outs[q] = [o.token_ids for o in llm.generate(prompts, params)]
    same = sum(a == b for p, f in zip(outs["none"], outs["fp8"]) for a, b in zip(p, f))
    assert same >= 6  # at least half of the 12 tokens: FP8 follows the model, not noise


def test_fp8_on_a_gpu_without_fp8_names_its_compute_capability():
    with pytest.raises(
        ValueError, match=r"compute capability >= 8\.9.*has compute capability 8\.0"
    ):
        check_fp8_device(torch.device("cuda"), capability=(8, 0))
    check_fp8_device(torch.device("cuda"), capability=(9, 0))  # Hopper: accepted
    check_fp8_device(torch.device("cpu"))  # the reference path: accepted


def test_bad_quantization_settings_are_refused():
    with pytest.raises(ValueError, match="EngineArgs.quantization: expected one of"):
        EngineArgs(load_format="dummy", quantization="int4")
    with pytest.raises(ValueError, match="inf or nan"):
        quantize_rows(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(TypeError, match="bfloat16/float16/float32"):
        quantize_rows(torch.ones(2, 2, dtype=torch.int32))
