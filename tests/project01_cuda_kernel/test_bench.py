"""CPU tier: the benchmarks' configs (what they refuse before any GPU work, what they record),
and the command line saying in one line why a step cannot run here."""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel import __main__ as package_main
from project01_cuda_kernel.bench import attention as bench_attention
from project01_cuda_kernel.bench import gemm as bench_gemm


def test_gemm_shapes_are_parsed_and_refused_with_the_reason():
    cfg = bench_gemm.GemmBenchConfig(shapes=("8192x5632x2048", "16X8X4"))
    assert cfg.shape_list() == [(8192, 5632, 2048), (16, 8, 4)]
    assert bench_gemm.GemmBenchConfig().shape_list() == list(bench_gemm.TRANSFORMER_SHAPES)
    for bad in ("8192x5632", "0x1x1", "axbxc"):
        with pytest.raises(ValueError, match="--shapes: shape"):
            bench_gemm.GemmBenchConfig(shapes=(bad,))


def test_gemm_config_refuses_what_cannot_be_timed():
    with pytest.raises(ValueError, match="--warmup-ms"):
        bench_gemm.GemmBenchConfig(warmup_ms=float("inf"))
    with pytest.raises(ValueError, match="--sizes"):
        bench_gemm.GemmBenchConfig(sizes=(512, 0))
    with pytest.raises(ValueError, match="--kernels: unknown kernel 'sgemm_10'"):
        bench_gemm.GemmBenchConfig(kernels=("sgemm_10",))


def test_error_floor_grows_with_k_only_for_float32():
    assert bench_gemm.err_floor("float32", 4096) == pytest.approx(2 * 64 * 2.0**-24)
    assert bench_gemm.err_floor("bfloat16", 4096) == bench_gemm.err_floor("bfloat16", 1)


def test_attention_config_validation():
    cfg = bench_attention.AttentionBenchConfig
    assert cfg(quick=True).seq_lens == (1024, 4096)
    with pytest.raises(ValueError, match="providers"):
        cfg(providers=("ours", "triton"))
    with pytest.raises(ValueError, match="must divide total_tokens"):
        cfg(seq_lens=(3000,))
    with pytest.raises(ValueError, match="dtype"):
        cfg(dtype="float32")
    assert cfg(kv_heads=8).kv_heads == 8  # 32 (D = 64) and 16 (D = 128) query heads
    with pytest.raises(ValueError, match="kv_heads: 3 must be 0 or divide the 32 query heads"):
        cfg(kv_heads=3)
    with pytest.raises(ValueError, match="kv_heads"):
        cfg(kv_heads=-1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("command", ["bench-gemm", "bench-attention"])
def test_a_benchmark_without_cuda_says_why_in_one_line(command, tmp_path, capsys):
    argv = [command, "--quick", "--no-charts", "--reports-dir", str(tmp_path)]
    assert package_main.main(argv) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{command}: skipped:") and out.count("\n") == 0
    assert not any(tmp_path.iterdir())  # no record of a run that did not happen


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_all_without_cuda_skips_each_benchmark_and_still_reports(tmp_path, capsys):
    """The pipeline goes on past a side that cannot run: the report renders what exists."""
    argv = ["all", "--no-profile", "--no-readme", "--reports-dir", str(tmp_path)]
    assert package_main.main(argv) == 2
    out = capsys.readouterr().out
    assert "bench-gemm: skipped:" in out and "bench-attention: skipped:" in out
    summary = tmp_path / "project01_cuda_kernel" / "summary.md"
    assert "No measurements yet" in summary.read_text()
