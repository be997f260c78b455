"""GPU tier: both benchmarks end to end at a tiny size with two repetitions: the record holds every
figure as a median with its range and repetitions, ratios paired by repetition, and the GPU's
state at the start and the end. Speed itself is never asserted."""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel.bench import attention as bench_attention
from project01_cuda_kernel.bench import gemm as bench_gemm
from shared.results import load_result

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def assert_repeated(row: dict, key: str, n: int) -> None:
    reps = row[f"{key}_reps"]
    assert len(reps) == n and row[f"{key}_min"] <= row[key] <= row[f"{key}_max"], (key, row)
    assert min(reps) == row[f"{key}_min"] and max(reps) == row[f"{key}_max"]


def assert_gpu_state(record: dict) -> None:
    state = record["environment"]["gpu_state"]
    assert set(state) == {"start", "end"}
    assert all("available" in state[k] for k in ("start", "end"))


@pytest.mark.smoke  # the benchmark's repetitions, once, on a small odd-sized extra shape
def test_gemm_bench_records_medians_with_ranges(tmp_path):
    kernels = ("sgemm_07_warptiling", "hgemm_08_mma_sync")
    cfg = bench_gemm.GemmBenchConfig(
        sizes=(256,),
        shapes=("200x136x72",),
        kernels=kernels,
        warmup_ms=2.0,
        rep_ms=5.0,
        repeats=2,
        reports_dir=str(tmp_path),
        charts=False,
    )
    record = load_result(bench_gemm.run(cfg))
    res = record["results"]
    assert res["repeats"] == 2 and record["config"]["repeats"] == 2
    assert len(res["baseline"]) == 2 * 2  # two shapes x float32, bfloat16
    assert len(res["rows"]) == 2 * 2  # each kernel in its own dtype at both shapes
    for row in res["rows"]:
        assert row["correct"], row
        for key in ("median_ms", "tflops", "gbps", "pct_of_cublas"):
            assert_repeated(row, key, 2)
    for row in res["baseline"]:
        assert_repeated(row, "median_ms", 2)
    assert_gpu_state(record)


def test_attention_bench_records_medians_with_ranges(tmp_path):
    cfg = bench_attention.AttentionBenchConfig(
        head_dims=(64,),
        seq_lens=(256,),
        causal=(False,),
        total_tokens=512,
        hidden=256,
        providers=("ours", "ours_k64", "flash", "math"),
        warmup_ms=2.0,
        rep_ms=5.0,
        repeats=2,
        reports_dir=str(tmp_path),
        charts=False,
    )
    record = load_result(bench_attention.run(cfg))
    res = record["results"]
    assert res["repeats"] == 2
    modes = {(r["provider"], r["mode"]) for r in res["rows"]}
    assert ("ours_k64", "bwd") in modes and ("ours_k64", "fwd") not in modes
    assert {("ours", m) for m in bench_attention.MODES} <= modes
    for row in res["rows"]:
        assert_repeated(row, "tflops", 2)
    assert len(res["ratios_vs_flash"]) == 3
    for r in res["ratios_vs_flash"]:
        assert_repeated(r, "ratio", 2)
    assert res["ratios_vs_cudnn"] == []  # cuDNN was not among the providers
    assert_gpu_state(record)


def test_attention_bench_grouped_query_against_sdpa_enable_gqa(tmp_path):
    # 4 query heads over 2 k/v heads: ours natively, SDPA with enable_gqa=True; the bench's own
    # correctness check (ours vs SDPA FLASH at the benchmarked shape) must pass for the record
    cfg = bench_attention.AttentionBenchConfig(
        head_dims=(64,),
        seq_lens=(256,),
        causal=(False, True),
        total_tokens=512,
        hidden=256,
        kv_heads=2,
        providers=("ours", "flash", "math"),
        warmup_ms=2.0,
        rep_ms=5.0,
        repeats=1,
        reports_dir=str(tmp_path),
        charts=False,
    )
    res = load_result(bench_attention.run(cfg))["results"]
    assert {r["kv_heads"] for r in res["rows"]} == {2}
    assert {r["heads"] for r in res["rows"]} == {4}
    assert all(c["max_abs_diff_vs_flash"] <= 0.05 for c in res["checks"])
    assert len(res["ratios_vs_flash"]) == 2 * len(bench_attention.MODES)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
    reason="the FP8 step needs a Hopper GPU (compute capability 9.0)",
)
def test_gemm_bench_measures_the_fp8_step_beside_scaled_mm(tmp_path):
    """The FP8 step in the same run as the bfloat16 ladder: its own group against
    torch._scaled_mm, checked, timed alternating, and charted (an FP8 roofline)."""
    from project01_cuda_kernel.report.gemm import render_charts

    cfg = bench_gemm.GemmBenchConfig(
        sizes=(256,),
        shapes=(),
        kernels=("hgemm_09_wgmma_tma", "fp8gemm_10_wgmma_tma"),
        fp8_sizes=(512,),
        warmup_ms=2.0,
        rep_ms=5.0,
        repeats=2,
        reports_dir=str(tmp_path),
        charts=False,
    )
    path = bench_gemm.run(cfg)
    record = load_result(path)
    res = record["results"]
    assert record["config"]["fp8_sizes"] == [512]
    fp8 = [r for r in res["rows"] if r["dtype"] == "float8_e4m3fn"]
    assert [(r["kernel"], r["shape"]) for r in fp8] == [("fp8gemm_10_wgmma_tma", "512x512x512")]
    assert fp8[0]["correct"], fp8[0]
    for key in ("median_ms", "tflops", "pct_of_cublas"):
        assert_repeated(fp8[0], key, 2)
    assert fp8[0]["min_bytes"] == 2 * 512 * 512 + 2 * 512 * 512  # 1-byte A, B; 2-byte C
    base = [r for r in res["baseline"] if r["dtype"] == "float8_e4m3fn"]
    assert len(base) == 1 and base[0]["shape"] == "512x512x512"
    assert {r["dtype"] for r in res["baseline"]} == {"float32", "bfloat16", "float8_e4m3fn"}
    assert "gemm_roofline_fp8.png" in {p.name for p in render_charts(path)}
