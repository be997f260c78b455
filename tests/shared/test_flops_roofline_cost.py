import pytest
import torch

from shared.cost import cost_line, cost_per_million_tokens, run_cost
from shared.flops import (
    arithmetic_intensity,
    attention_bytes,
    attention_flops,
    dtype_bytes,
    matmul_bytes,
    matmul_flops,
    transformer_train_flops_per_token,
)
from shared.hardware import get_gpu
from shared.roofline import mfu, roofline


def test_matmul_counts_by_hand():
    assert matmul_flops(2, 3, 4) == 48  # 2*2*3*4
    assert matmul_flops(4096, 4096, 4096) == 137_438_953_472
    # bf16 4096^3: 3 matrices of 4096^2 x 2 bytes = 100,663,296 bytes
    assert matmul_bytes(4096, 4096, 4096, 2) == 100_663_296
    # fp16 in, fp32 out: (2*3 + 3*4) * 2 + 2*4 * 4 = 36 + 32
    assert matmul_bytes(2, 4, 3, 2, 4) == 68
    with pytest.raises(ValueError, match="k must be a positive integer"):
        matmul_flops(1, 1, 0)


def test_attention_counts_by_hand():
    # B=2, H=16, S=2048, D=128: 4*2*16*2048*2048*128 = 68,719,476,736
    fwd = attention_flops(2, 16, 2048, 2048, 128)
    assert fwd == 68_719_476_736
    assert attention_flops(2, 16, 2048, 2048, 128, causal=True) == fwd / 2
    assert attention_flops(2, 16, 2048, 2048, 128, mode="bwd") == 2.5 * fwd
    assert attention_flops(2, 16, 2048, 2048, 128, mode="fwd_bwd") == 3.5 * fwd
    with pytest.raises(ValueError, match="mode"):
        attention_flops(1, 1, 1, 1, 1, mode="sideways")
    # fwd bytes, B=H=1, S_q=S_k=4, D=2, bf16: Q 16 + K 16 + V 16 + O 16 + LSE 16 = 80
    assert attention_bytes(1, 1, 4, 4, 2, 2) == 80
    # bwd: read Q,O,dO 48 + K,V 32 + LSE 16; write dQ 16 + dK,dV 32 = 144
    assert attention_bytes(1, 1, 4, 4, 2, 2, mode="bwd") == 144


def test_transformer_flops_per_token():
    # N=1e9, L=16, d=2048, S=2048: 6e9 + 12*16*2048*2048 = 6e9 + 805,306,368
    assert transformer_train_flops_per_token(10**9, 16, 2048, 2048, causal=False) == (
        6e9 + 805_306_368
    )
    assert transformer_train_flops_per_token(10**9, 16, 2048, 2048) == 6e9 + 805_306_368 / 2


def test_dtype_bytes_and_intensity():
    assert dtype_bytes(torch.bfloat16) == 2
    assert dtype_bytes("float32") == 4
    with pytest.raises(ValueError):
        dtype_bytes("float7")
    assert arithmetic_intensity(100.0, 4.0) == 25.0
    with pytest.raises(ValueError):
        arithmetic_intensity(1.0, 0)


def test_roofline_memory_and_compute_bound():
    h200 = get_gpu("h200-sxm")
    peak, bw = h200.peak_flops("bf16"), h200.bandwidth()
    # bf16 4096^3 matmul: 137.4 GFLOP over 100.7 MB = 1365 FLOP/B > ridge 206: compute-bound
    p = roofline(matmul_flops(4096, 4096, 4096), matmul_bytes(4096, 4096, 4096, 2), peak, bw)
    assert p.intensity == pytest.approx(1365.33, rel=1e-4)
    assert p.bound == "compute" and p.attainable_flops == peak
    # a copy-like kernel at 0.25 FLOP/B: attainable 0.25 * 4.8e12 = 1.2e12 FLOP/s
    q = roofline(1e9, 4e9, peak, bw)
    assert q.bound == "memory"
    assert q.attainable_flops == pytest.approx(1.2e12)
    assert q.fraction_of_roof(0.6e12) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        roofline(1, 0, peak, bw)


def test_mfu():
    assert mfu(494.7e12, 989.4e12) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0)


def test_cost_by_hand():
    # 8 GPUs at $2/h = $16/h; 100,000 tok/s = 3.6e8 tok/h -> $16 / 360 M tokens = $0.0444 per M
    assert cost_per_million_tokens(100_000, 2.0, 8) == pytest.approx(16 / 360)
    r = run_cost(3.6e9, 100_000, 2.0, 8)  # 10 hours
    assert r["hours"] == pytest.approx(10.0)
    assert r["gpu_hours"] == pytest.approx(80.0)
    assert r["usd"] == pytest.approx(160.0)
    with pytest.raises(ValueError, match="n_gpus"):
        cost_per_million_tokens(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="tokens_per_s"):
        run_cost(1.0, 0.0, 1.0, 1)


def test_cost_line_spot_vs_on_demand():
    spec = get_gpu("h200-sxm")
    line = cost_line(spec, 4, 300_000, measured=False)
    assert line.config == "4x h200-sxm" and not line.measured
    ratio = line.usd_per_m_tokens_spot / line.usd_per_m_tokens_on_demand
    assert ratio == pytest.approx(spec.price_spot.value / spec.price_on_demand.value)
    expected = 4 * spec.price_on_demand.value / (300_000 * 3600) * 1e6
    assert line.usd_per_m_tokens_on_demand == pytest.approx(expected)
