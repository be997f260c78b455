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


def test_hopper_backward_provider_is_opt_in():
    """ours_hbwd (forward auto + the Hopper backward) is accepted when named, not run by default,
    and has a chart style; where the Hopper backward cannot run its function raises
    RuntimeError, which the bench records as a skip (a ValueError would end the run)."""
    from project01_cuda_kernel._build import is_hopper
    from project01_cuda_kernel.report import attention as report_attention

    cfg = bench_attention.AttentionBenchConfig
    assert "ours_hbwd" in bench_attention.PROVIDERS
    assert "ours_hbwd" not in cfg().providers
    assert cfg(providers=("ours", "ours_hbwd", "cudnn")).providers[1] == "ours_hbwd"
    assert "ours_hbwd" not in bench_attention.VARIANT_MODE  # fwd, bwd and fwd_bwd, like ours
    assert bench_attention.EXPLICIT_BWD == {"ours_hbwd": "hopper", "ours_fa2bwd": "fa2"}
    for table in (
        report_attention.PROVIDER_LABELS,
        report_attention.PROVIDER_MARKERS,
        report_attention.PROVIDER_COLORS,
    ):
        assert set(bench_attention.PROVIDERS) <= set(table)
    fn = bench_attention.attention_fn("ours_hbwd", causal=True)
    q = torch.randn(1, 2, 16, 256).bfloat16()  # head dim 256: refused on every GPU
    with pytest.raises(RuntimeError, match="ours_hbwd: bwd_kernel='hopper' is compiled for"):
        fn(q, q, q)
    if not is_hopper():
        q = q[..., :128].contiguous()
        with pytest.raises(RuntimeError, match="ours_hbwd: bwd_kernel='hopper' needs a GPU"):
            fn(q, q, q)


def test_default_providers_follow_what_auto_runs_backward():
    """While "auto" runs the FA2 backward, "ours" is it and neither named-backward provider runs
    by default; once it takes the Hopper backward, ours_fa2bwd keeps FA2's in the record (the
    bwd mode only, a variant column) and ours_hbwd, the same kernel as ours, stays opt-in."""
    from project01_cuda_kernel import attention

    for switch in (False, True):
        default = bench_attention.default_providers(switch)
        assert "ours_hbwd" not in default
        assert ("ours_fa2bwd" in default) is switch
        assert set(default) | {"ours_hbwd", "ours_fa2bwd"} == set(bench_attention.PROVIDERS)
    assert bench_attention.VARIANT_MODE["ours_fa2bwd"] == "bwd"
    expect = bench_attention.default_providers(attention.AUTO_BWD_HOPPER)
    assert bench_attention.DEFAULT_PROVIDERS == expect
    assert bench_attention.AttentionBenchConfig().providers == expect


def test_fa2_backward_provider_of_a_record():
    """The FA2 backward's provider: ours_fa2bwd when measured, else ours when "auto" ran FA2's
    (or the record predates ours_backward_kernels), else none."""
    fa2 = bench_attention.fa2_backward_provider
    row = {"head_dim": 128, "seq_len": 4096, "causal": False, "mode": "bwd", "tflops": 1.0}
    assert fa2({"rows": [{**row, "provider": "ours"}]}) == "ours"
    both = {"rows": [{**row, "provider": "ours"}], "ours_backward_kernels": {"128": "fa2"}}
    assert fa2(both) == "ours"
    hopper = {"rows": [{**row, "provider": "ours"}], "ours_backward_kernels": {"128": "hopper"}}
    assert fa2(hopper) is None
    hopper["rows"].append({**row, "provider": "ours_fa2bwd"})
    assert fa2(hopper) == "ours_fa2bwd"


def test_named_fa2_backward_provider_refuses_nothing_on_cpu_shapes():
    """ours_fa2bwd's function checks its kernel like ours_hbwd's: "fa2" takes every head dim, so
    the check passes (the forward then needs CUDA tensors)."""
    fn = bench_attention.attention_fn("ours_fa2bwd", causal=False)
    assert fn.causal is False
    q = torch.randn(1, 2, 16, 256).bfloat16()
    with pytest.raises(Exception) as e:  # the forward's own refusal of CPU tensors, not the check
        fn(q, q, q)
    assert "ours_fa2bwd:" not in str(e.value)


def test_hopper_backward_table_and_ratios():
    """The summary's ours_hbwd table: its TFLOP/s and ratios to the FA2 backward (ours here),
    cuDNN and FLASH; with ours_fa2bwd named as the FA2 backward, the ratio is to it."""
    shape = {"head_dim": 128, "seq_len": 4096, "causal": False, "mode": "fwd_bwd"}
    rows = [
        {**shape, "provider": p, "tflops": t}
        for p, t in (("ours", 300.0), ("ours_hbwd", 450.0), ("cudnn", 500.0), ("flash", 250.0))
    ]
    (row,) = bench_attention.hbwd_table(rows)
    assert row["ours_hbwd TFLOP/s"] == 450.0
    assert row["hbwd/FA2 bwd"] == pytest.approx(1.5)
    fa2 = [{**shape, "provider": "ours_fa2bwd", "tflops": 225.0}]
    (row2,) = bench_attention.hbwd_table(rows + fa2, "ours_fa2bwd")
    assert row2["hbwd/FA2 bwd"] == pytest.approx(2.0)
    (row3,) = bench_attention.hbwd_table(rows, None)
    assert "hbwd/FA2 bwd" not in row3 and row3["hbwd/cuDNN"] == pytest.approx(0.9)
    assert row["hbwd/cuDNN"] == pytest.approx(0.9)
    assert row["hbwd/FLASH"] == pytest.approx(1.8)
    (r,) = bench_attention.ratios(rows, "cudnn", "ours_hbwd")
    assert r["ratio"] == pytest.approx(0.9)
    assert bench_attention.hbwd_table([r for r in rows if r["provider"] != "ours_hbwd"]) == []


def test_gemm_config_fp8_sizes_follow_the_kernel_choice():
    """The FP8 step runs at --fp8-sizes (4096 and 8192 by default, 512 with --quick) unless
    --kernels leaves it out; sizes must be multiples of 16, its K rule."""
    cfg = bench_gemm.GemmBenchConfig
    assert bench_gemm.fp8_sizes_of(cfg()) == [4096, 8192]
    assert bench_gemm.fp8_sizes_of(cfg(quick=True)) == [512]
    assert bench_gemm.fp8_sizes_of(cfg(kernels=("hgemm_09_wgmma_tma",))) == []
    only = cfg(kernels=("fp8gemm_10_wgmma_tma",), fp8_sizes=(1024,))
    assert bench_gemm.fp8_sizes_of(only) == [1024]
    assert bench_gemm.fp8_sizes_of(cfg(fp8_sizes=())) == []
    for bad in (1000, 0):
        with pytest.raises(ValueError, match="--fp8-sizes: expected multiples of 16"):
            cfg(fp8_sizes=(bad,))
    assert bench_gemm.err_floor("float8_e4m3fn", 4096) == 2.0**-10
