"""CPU tier: the benchmarks' repetitions with fake timers (fixed sequences of times, no GPU): the
order the measurements alternate in, and the medians, ranges and ratios each row records.

The sequences are chosen so that the median of the per-repetition ratios differs from the
ratio of the medians, so a row computed the wrong way fails here."""

from __future__ import annotations

import statistics

import pytest
import torch

from project01_cuda_kernel.bench import attention as bench_attention
from project01_cuda_kernel.bench import gemm as bench_gemm
from project01_cuda_kernel.bench.interleaved import time_interleaved, timing_fields
from shared.hardware import get_gpu
from shared.timing import Timing

SHAPE = (4096, 4096, 4096)
FLOPS = 2 * 4096**3


def timing(ms: float, n: int = 100) -> Timing:
    return Timing(
        median_ms=ms,
        p20_ms=0.99 * ms,
        p80_ms=1.02 * ms,
        min_ms=0.98 * ms,
        mean_ms=ms,
        n=n,
        method="fake",
    )


def fake(times: list[float], calls: list[str] | None = None, name: str = "", fail_at: int = 0):
    """A timer returning `times` in turn; it raises RuntimeError on call `fail_at` (1-based)."""
    it = iter(enumerate(times, 1))

    def timer() -> Timing:
        i, ms = next(it)
        if calls is not None:
            calls.append(name)
        if i == fail_at:
            raise RuntimeError("an illegal memory access was encountered")
        return timing(ms, n=100 + i)

    return timer


CUBLAS_MS = [1.00, 1.10, 0.90, 1.00, 1.20]
OURS_MS = [1.10, 1.00, 1.00, 1.25, 1.20]
# per repetition, cuBLAS time / ours: 0.909, 1.1, 0.9, 0.8, 1.0 -> median 0.909...;
# the ratio of the medians, 1.00 / 1.10, is 0.909 too; for step 8 below the two differ:
STEP8_MS = [1.30, 1.00, 1.50, 1.20, 1.40]  # ratios 0.769, 1.1, 0.6, 0.833, 0.857 -> 0.833


def test_the_order_alternates_between_repetitions():
    calls: list[str] = []
    timers = {k: fake([1.0] * 4, calls, k) for k in ("cublas", "a", "b")}
    timed = time_interleaved(timers, 4)
    assert calls == ["cublas", "a", "b", "b", "a", "cublas", "cublas", "a", "b", "b", "a", "cublas"]
    assert timed.repeats == 4 and all(len(v) == 4 for v in timed.timings.values())


def test_timing_fields_are_medians_with_their_range():
    f = timing_fields(
        [timing(ms, n) for ms, n in zip(CUBLAS_MS, (90, 120, 100, 101, 95))],
        FLOPS,
        nbytes=3 * 4096**2 * 4,
    )
    assert f["median_ms"] == 1.0 and (f["median_ms_min"], f["median_ms_max"]) == (0.9, 1.2)
    assert f["median_ms_reps"] == CUBLAS_MS  # repetition order kept
    assert f["tflops"] == pytest.approx(FLOPS / 1e-3 / 1e12)
    # TFLOP/s falls as time grows: its min comes from the slowest repetition
    assert f["tflops_min"] == pytest.approx(FLOPS / 1.2e-3 / 1e12)
    assert f["tflops_max"] == pytest.approx(FLOPS / 0.9e-3 / 1e12)
    assert f["gbps"] == pytest.approx(3 * 4096**2 * 4 / 1e-3 / 1e9)
    assert f["p20_ms"] == pytest.approx(0.99) and len(f["p80_ms_reps"]) == 5
    assert f["n_timed"] == 100 and f["n_timed_reps"] == [90, 120, 100, 101, 95]
    assert f["timing_method"] == "fake"


def gemm_rows(timers, checked, dtype=torch.bfloat16):
    return bench_gemm.time_shape(
        SHAPE, dtype, checked, timers, 5, cublas_err=1e-3, spec=get_gpu("h200-sxm")
    )


def test_gemm_rows_hold_medians_ranges_and_the_median_of_the_ratios():
    calls: list[str] = []
    timers = {
        "cublas": fake(CUBLAS_MS, calls, "cublas"),
        "hgemm_08_mma_sync": fake(STEP8_MS, calls, "hgemm_08_mma_sync"),
        "hgemm_09_wgmma_tma": fake(OURS_MS, calls, "hgemm_09_wgmma_tma"),
    }
    checked = {"hgemm_08_mma_sync": 1e-3, "hgemm_09_wgmma_tma": 1e-3}
    base, rows = gemm_rows(timers, checked)
    assert calls[:3] == ["cublas", "hgemm_08_mma_sync", "hgemm_09_wgmma_tma"]
    assert calls[3:6] == ["hgemm_09_wgmma_tma", "hgemm_08_mma_sync", "cublas"]
    assert (
        base["kind"] == "cublas"
        and base["median_ms"] == 1.0
        and base["median_ms_reps"] == CUBLAS_MS
    )
    h8, h9 = rows
    assert h9["median_ms"] == 1.1 and (h9["median_ms_min"], h9["median_ms_max"]) == (1.0, 1.25)
    assert h9["tflops"] == pytest.approx(FLOPS / 1.1e-3 / 1e12)
    per_rep = [100 * c / o for c, o in zip(CUBLAS_MS, OURS_MS)]
    assert h9["pct_of_cublas_reps"] == pytest.approx(per_rep)
    assert h9["pct_of_cublas"] == pytest.approx(statistics.median(per_rep))
    assert (h9["pct_of_cublas_min"], h9["pct_of_cublas_max"]) == pytest.approx((80.0, 110.0))
    # the fp16/bf16 roof: 989.4 TFLOP/s; % of roof per repetition, the median of those
    assert h9["pct_of_roof"] == pytest.approx(100 * FLOPS / 1.1e-3 / 989.4e12, rel=1e-6)
    # step 8: the median of the ratios (83.3%), not the ratio of the medians (1.0 / 1.3 = 76.9%)
    per_rep = [100 * c / o for c, o in zip(CUBLAS_MS, STEP8_MS)]
    assert h8["pct_of_cublas"] == pytest.approx(statistics.median(per_rep))
    assert h8["pct_of_cublas"] != pytest.approx(100 * 1.0 / statistics.median(STEP8_MS))
    assert h8["correct"] and h9["correct"]


def test_gemm_kernels_that_fail_are_recorded_not_timed():
    timers = {"cublas": fake(CUBLAS_MS), "hgemm_09_wgmma_tma": fake(OURS_MS, fail_at=3)}
    checked = {
        "hgemm_08_mma_sync": 0.5,  # failed its check: no timer, not timed
        "hgemm_09_wgmma_tma": 1e-3,  # raises in its third repetition
        "sgemm_07_warptiling": "RuntimeError: no kernel image",
    }  # its check run raised
    base, (h8, h9, s7) = gemm_rows(timers, checked)
    assert not h8["correct"] and h8["rel_err"] == 0.5 and "median_ms" not in h8
    assert "pct_of_cublas" not in h8
    assert not h9["correct"] and "repetition 3" in h9["error"] and "median_ms" not in h9
    assert not s7["correct"] and s7["error"] == "RuntimeError: no kernel image"
    assert base["median_ms"] == 1.0  # cuBLAS went on through all five


def test_gemm_stops_when_cublas_fails():
    timers = {"cublas": fake(CUBLAS_MS, fail_at=2), "hgemm_09_wgmma_tma": fake(OURS_MS)}
    with pytest.raises(RuntimeError, match="cuBLAS bfloat16 4096x4096x4096: repetition 2"):
        gemm_rows(timers, {"hgemm_09_wgmma_tma": 1e-3})


ATT_SHAPE = {"head_dim": 128, "seq_len": 4096, "batch": 4, "heads": 16, "causal": False}


def test_attention_rows_and_ratios_are_medians_of_the_repetitions():
    ours, flash, cudnn = OURS_MS, CUBLAS_MS, [1.0, 1.05, 0.95, 1.0, 1.3]
    rows = []
    for mode in ("fwd", "fwd_bwd"):
        timers = {
            "ours": fake(ours),
            "flash": fake(flash),
            "cudnn": fake(cudnn),
            "efficient": fake([2.0] * 5, fail_at=1),
        }
        got, failed = bench_attention.time_mode(ATT_SHAPE, mode, timers, 5, 1e9)
        assert [r["provider"] for r in got] == ["ours", "flash", "cudnn"]
        assert list(failed) == ["efficient"] and "repetition 1" in failed["efficient"]
        rows += got
    r = rows[0]
    assert r["mode"] == "fwd" and r["seq_len"] == 4096 and r["flops"] == 1e9
    assert r["median_ms"] == 1.1 and r["tflops_reps"] == pytest.approx([1 / t for t in ours])
    vs_flash = bench_attention.ratios(rows)
    vs_cudnn = bench_attention.ratios(rows, "cudnn")
    assert [x["mode"] for x in vs_flash] == ["fwd", "fwd_bwd"]
    per_rep = [f / o for o, f in zip(ours, flash)]  # ours / FLASH in TFLOP/s = FLASH ms / ours ms
    assert vs_flash[0]["ratio"] == pytest.approx(statistics.median(per_rep))
    assert vs_flash[0]["ratio_reps"] == pytest.approx(per_rep)
    assert (vs_flash[0]["ratio_min"], vs_flash[0]["ratio_max"]) == pytest.approx((0.8, 1.1))
    assert vs_flash[0]["ours"] == pytest.approx(1 / 1.1) and vs_flash[0]["flash"] == 1.0
    per_rep = [c / o for o, c in zip(ours, cudnn)]
    assert vs_cudnn[0]["ratio"] == pytest.approx(statistics.median(per_rep))
    assert vs_cudnn[0]["ratio"] != pytest.approx(statistics.median(cudnn) / statistics.median(ours))


def test_ratios_of_single_run_rows_are_the_plain_ratio():
    rows = [
        {**ATT_SHAPE, "provider": p, "mode": "fwd", "tflops": t}
        for p, t in (("ours", 632.0), ("flash", 355.0))
    ]
    (r,) = bench_attention.ratios(rows)
    assert r["ratio"] == 632.0 / 355.0 and r["ratio_reps"] == [632.0 / 355.0]


@pytest.mark.parametrize("cls", [bench_gemm.GemmBenchConfig, bench_attention.AttentionBenchConfig])
def test_repeats_default_to_five_and_refuse_less_than_one(cls):
    assert cls().repeats == 5
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="--repeats: expected an integer >= 1"):
            cls(repeats=bad)
