import time

import pytest
import torch

from shared.timing import CudaTimer, Timing, benchmark, summarize


def test_summarize_by_hand():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "test")
    assert t.median_ms == 3.0
    assert t.min_ms == 1.0
    assert t.mean_ms == 3.0
    # 20th percentile of 1..5 by linear interpolation: position 0.8 -> 1.8; 80th: 4.2
    assert t.p20_ms == pytest.approx(1.8)
    assert t.p80_ms == pytest.approx(4.2)
    assert t.n == 5
    with pytest.raises(ValueError):
        summarize([], "test")


def test_rates():
    t = Timing(2.0, 1.9, 2.1, 1.8, 2.0, 10, "test")
    assert t.tflops(4e12) == pytest.approx(2000.0)  # 4e12 FLOP in 2 ms = 2e15 FLOP/s
    assert t.gbps(8e9) == pytest.approx(4000.0)  # 8 GB in 2 ms
    assert t.spread == pytest.approx(0.1)


def test_cpu_benchmark_measures_a_known_sleep():
    t = benchmark(lambda: time.sleep(0.003), rep_ms=60, device="cpu")
    assert t.method == "torch.utils.benchmark"
    assert t.n >= 10
    assert 2.9 <= t.median_ms <= 8.0  # sleep(3 ms) never returns early
    assert t.p20_ms <= t.median_ms <= t.p80_ms


def test_cpu_benchmark_orders_work_sizes():
    small, large = torch.randn(64, 64), torch.randn(384, 384)
    ts = benchmark(lambda: small @ small, rep_ms=40, device="cpu")
    tl = benchmark(lambda: large @ large, rep_ms=40, device="cpu")
    assert tl.median_ms > 10 * ts.median_ms  # 216x the FLOPs


@pytest.mark.gpu
def test_cuda_benchmark_paths_agree():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t1 = benchmark(lambda: a @ a)
    t2 = benchmark(lambda: a @ a, use_triton=False)
    assert t1.method == "do_bench" and t2.method == "cuda_events"
    assert t1.median_ms == pytest.approx(t2.median_ms, rel=0.3)
    with CudaTimer() as timer:
        a @ a
    assert timer.elapsed_ms > 0
