"""CPU tier: the GEMM tooling around the kernels: ncu CSV parsing and the occupancy limiter, the
bench/profile dispatcher, chart generation from recorded rows, profile labelling."""

from __future__ import annotations

import pytest

from project01_cuda_kernel import bench, bench_gemm, ncu, profile_gemm

# Shape of `ncu --csv --page raw` output: header, units row, one row per launch; other lines
# (==PROF==, the program's own output) interleaved.
NCU_CSV = """\
==PROF== Connected to process 123
hello from the program
"ID","Process ID","Kernel Name","Block Size","Grid Size","launch__registers_per_thread","launch__occupancy_limit_registers","launch__occupancy_limit_shared_mem","launch__occupancy_limit_warps","sm__warps_active.avg.pct_of_peak_sustained_active","gpu__time_duration.sum"
"","","","","","register/thread","block","block","block","%","nsecond"
"0","123","sm80_xmma_gemm_f32f32","(256, 1, 1)","(16, 32, 1)","254","1","3","8","12.49","2,692,000"
"1","123","void <unnamed>::sgemm_warptile_kernel<1>(const float *, int)","(256, 1, 1)","(1024, 1, 1)","128","2","3","8","24.2","3,280,512"
"2","123","nvjet_sm90_tst_256x128","(384, 1, 1)","(2, 66, 1)","168","1","1","5","14.6","177,000"
"3","123","void <unnamed>::hgemm_wgmma_kernel<__nv_bfloat16>(CUtensorMap_st, T1 *)","(384, 1, 1)","(132, 1, 1)","168","1","1","5","14.0","195,040"
==PROF== Disconnected from process 123
"""


def test_parse_ncu_raw_csv_and_name_the_occupancy_limiter():
    rows = ncu.parse_raw_csv(NCU_CSV, ncu.OCCUPANCY_METRICS)
    assert [r["id"] for r in rows] == [0, 1, 2, 3]
    r = rows[1]
    assert r["registers_per_thread"] == 128.0 and r["achieved_occupancy_pct"] == 24.2
    assert r["duration_ns"] == 3280512.0  # thousands separators removed
    assert r["block_size"] == "(256, 1, 1)"
    assert ncu.occupancy_limiter(r) == "registers"
    assert ncu.occupancy_limiter(rows[2]) == "registers = shared memory"
    assert ncu.occupancy_limiter({"block_limit_warps": 0.0}) is None
    assert ncu.parse_raw_csv("no csv here\n", ncu.OCCUPANCY_METRICS) == []


def test_profile_rows_are_labelled_by_function_and_plan_order():
    rows = ncu.parse_raw_csv(NCU_CSV, ncu.OCCUPANCY_METRICS)
    labelled = profile_gemm.label_rows(rows, ["sgemm_07_warptiling", "hgemm_09_wgmma_tma"])
    assert [r["label"] for r in labelled] == [
        "cuBLAS float32",
        "sgemm_07_warptiling",
        "cuBLAS bfloat16",
        "hgemm_09_wgmma_tma",
    ]
    table = profile_gemm.summary_rows(labelled)
    assert table[3]["CUDA kernel"] == "`hgemm_wgmma_kernel<__nv_bfloat16>`"
    assert table[1]["time (us)"] == 3280 and table[1]["regs"] == 128


def test_missing_ncu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    with pytest.raises(ncu.NcuError, match="ncu .* was not found"):
        ncu.profile_command(["true"])


def test_dispatcher_reports_a_missing_side_in_one_line(capsys):
    assert bench.run_side("attention", "no_such_module", []) == 0
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "not available" in out
    with pytest.raises(SystemExit):
        bench.main(["matmul"])  # not a choice


def test_bench_without_cuda_says_why_in_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert bench.main(["gemm", "--quick", "--no-charts"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("gemm: skipped:") and out.count("\n") == 0


def test_bench_shape_parser():
    assert bench_gemm._parse_shape("8192x5632x2048") == (8192, 5632, 2048)
    for bad in ("8192x5632", "0x1x1", "axbxc"):
        with pytest.raises(Exception, match="shape"):
            bench_gemm._parse_shape(bad)


def test_error_floor_grows_with_k_only_for_float32():
    assert bench_gemm.err_floor("float32", 4096) == pytest.approx(2 * 64 * 2.0**-24)
    assert bench_gemm.err_floor("bfloat16", 4096) == bench_gemm.err_floor("bfloat16", 1)
