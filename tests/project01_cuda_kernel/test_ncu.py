"""CPU tier: Nsight Compute's output read once for both profiles (profile.ncu): the raw CSV,
units, unknown metrics and the occupancy limiter; each profile's labels for the launches."""

from __future__ import annotations

import pytest

from project01_cuda_kernel.profile import attention as profile_attention
from project01_cuda_kernel.profile import gemm as profile_gemm
from project01_cuda_kernel.profile import ncu
from project01_cuda_kernel.report import gemm as report_gemm

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
    table = report_gemm.profile_rows(labelled)
    assert table[3]["CUDA kernel"] == "`hgemm_wgmma_kernel<__nv_bfloat16>`"
    assert table[1]["time (us)"] == 3280 and table[1]["regs"] == 128


def test_missing_ncu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: None)
    with pytest.raises(ncu.NcuError, match="ncu .* was not found"):
        ncu.profile_command(["true"])


ATTENTION_CSV = """==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active","launch__shared_mem_per_block_dynamic"
"","","","","","","","nsecond","register/thread","%","byte"
"0","123","python3","127.0.0.1","void flash::flash_fwd_kernel<...>(flash::FwdParams)","1","7","1,234,000","242","15.6","65536"
"1","123","python3","127.0.0.1","void flash::flash_bwd_kernel<...>(flash::BwdParams)","1","7","3,000,000","255","12.1","107520"
"""


def test_parse_ncu_csv_converts_units():
    rows = profile_attention.parse_ncu_csv(ATTENTION_CSV)
    assert [("fwd" in r["kernel"], "bwd" in r["kernel"]) for r in rows] == [
        (True, False),
        (False, True),
    ]
    assert rows[0]["duration"] == pytest.approx(1234.0)  # us
    assert rows[0]["registers/thread"] == 242
    assert rows[0]["dynamic shared/CTA"] == pytest.approx(64.0)  # KiB
    assert rows[1]["achieved occupancy"] == pytest.approx(12.1)
    assert rows[0]["units"]["dynamic shared/CTA"] == "KiB"
    assert rows[0]["units"]["duration"] == "us"


def test_parse_ncu_csv_without_header():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        profile_attention.parse_ncu_csv("==PROF== nothing profiled\n")


def test_ncu_metrics_unknown_to_the_gpu_are_dropped():
    tensor = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    assert tensor in profile_attention.METRICS
    out = f"==ERROR== Failed to find metric {tensor}\n"
    assert ncu.unknown_metrics(out, profile_attention.METRICS) == [tensor]
    metrics = profile_attention.METRICS
    base = "sm__pipe_tensor_op_hmma_cycles_active"  # ncu may name the metric without suffixes
    assert ncu.unknown_metrics(f"==ERROR== Failed to find metric {base}\n", metrics) == [tensor]
    assert ncu.unknown_metrics("==PROF== Disconnected from process 1\n", metrics) == []


def test_profiled_kernels_get_short_labels():
    assert profile_attention.kernel_label(
        "void flash::hopper::flash_fwd_hopper_kernel<bf16, 128>(...)"
    ) == ("forward (Hopper)")
    assert profile_attention.kernel_label(
        "void flash::flash_fwd_kernel<bf16, 128, 4, 2, 32, 0>(...)"
    ) == ("forward (FA2)")
    assert (
        profile_attention.kernel_label("void flash::flash_bwd_kernel<bf16, 128, 8>(...)")
        == "backward"
    )
    assert (
        profile_attention.kernel_label(
            "void flash::hopper_bwd::flash_bwd_hopper_kernel<bf16, 128, true>(...)"
        )
        == "backward (Hopper)"
    )


FAKE_NCU = """#!{python}
import json, sys
args = sys.argv[1:]
metrics = args[args.index("--metrics") + 1].split(",")
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if "sm__unknown_metric.sum" in metrics:
    print("==ERROR== Failed to find metric sm__unknown_metric.sum")
    sys.exit(1)
print('"ID","Kernel Name","' + '","'.join(metrics) + '"')
print('"","","' + '","'.join("nsecond" for _ in metrics) + '"')
print('"0","flash_fwd_kernel","' + '","'.join("2,000" for _ in metrics) + '"')
"""


def test_run_ncu_drops_metrics_the_gpu_does_not_know_and_passes_its_filters(tmp_path, capsys):
    import json
    import sys

    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    metrics = ["gpu__time_duration.sum", "sm__unknown_metric.sum"]
    out, used = ncu.run_ncu(
        ["true"],
        metrics,
        kernel_regex="flash_fwd",
        launch_count=3,
        drop_unknown=True,
        ncu=str(fake),
    )
    assert used == ["gpu__time_duration.sum"]
    assert "sm__unknown_metric.sum" in capsys.readouterr().out  # said, not silently dropped
    header, units, launches = ncu.read_csv(out)
    assert header[2:] == used and units[2] == "nsecond" and launches[0][1] == "flash_fwd_kernel"
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first[:2] == ["--clock-control", "none"]
    assert "sm__unknown_metric.sum" in first[first.index("--metrics") + 1]
    assert second[second.index("--kernel-name") + 1] == "regex:flash_fwd"
    assert second[second.index("--launch-count") + 1] == "3" and second[-1] == "true"
    with pytest.raises(ncu.NcuError, match="exited with 1"):  # without dropping: a clear error
        ncu.run_ncu(["true"], metrics, ncu=str(fake))


PROFILE_NCU = """#!{python}
import subprocess, sys
args = sys.argv[1:]
child = args[args.index("-c") - 1:]  # the profiled command: python -c "from ... import worker; ..."
subprocess.run([child[0], "-c", child[2].split(";")[0]], check=True)  # its worker imports
metrics = args[args.index("--metrics") + 1].split(",")
print('"ID","Kernel Name","' + '","'.join(metrics) + '"')
print('"","","' + '","'.join("nsecond" for _ in metrics) + '"')
for i, name in enumerate({kernels!r}):
    print(f'"{{i}}","{{name}}","' + '","'.join("2,000" for _ in metrics) + '"')
"""


def _fake_ncu(tmp_path, monkeypatch, kernels: list[str]):
    import sys

    from project01_cuda_kernel import _build

    fake = tmp_path / "ncu"
    fake.write_text(PROFILE_NCU.format(python=sys.executable, kernels=kernels))
    fake.chmod(0o755)
    monkeypatch.setattr(ncu, "find_ncu", lambda: str(fake))
    monkeypatch.setattr(_build, "require_cuda", lambda: None)


def test_gemm_profile_runs_ncu_over_its_worker_and_writes_the_record(tmp_path, monkeypatch):
    from project01_cuda_kernel import gemm
    from shared.results import load_result

    _fake_ncu(tmp_path, monkeypatch, ["gemm_f32", "void sgemm_warptile_kernel<1>(float*)"])
    monkeypatch.setattr(gemm, "_ext", lambda: None)  # nothing to build without a GPU
    cfg = profile_gemm.GemmProfileConfig(
        size=256, kernels=("sgemm_07_warptiling",), reports_dir=str(tmp_path / "reports")
    )
    rec = load_result(profile_gemm.run(cfg))
    assert [r["label"] for r in rec["results"]] == ["cuBLAS float32", "sgemm_07_warptiling"]
    assert rec["results"][1]["duration_ns"] == 2000.0 and rec["config"]["size"] == 256


def test_attention_profile_runs_ncu_over_its_worker_and_writes_the_record(tmp_path, monkeypatch):
    from project01_cuda_kernel import attention
    from shared.results import load_result

    _fake_ncu(tmp_path, monkeypatch, ["void flash::flash_fwd_kernel<>()", "flash_bwd_kernel"])
    monkeypatch.setattr(attention, "build", lambda: None)
    cfg = profile_attention.AttentionProfileConfig(seq_len=1024, reports_dir=str(tmp_path / "r"))
    rec = load_result(profile_attention.run(cfg))
    kernels = rec["results"]["kernels"]
    assert [k["kernel_short"] for k in kernels] == ["forward (FA2)", "backward"]
    assert kernels[0]["duration"] == 2.0 and kernels[0]["units"]["duration"] == "us"
    assert rec["results"]["shape"]["batch"] == 16 and rec["config"]["kernel_filter"].startswith(
        "regex:flash_"
    )


def test_attention_profile_keeps_one_column_per_kernel(tmp_path, monkeypatch):
    """On a Hopper GPU the worker runs the Hopper forward twice (the Hopper backward needs a
    forward's out and lse): the record keeps each kernel's first launch, in launch order."""
    from project01_cuda_kernel import attention
    from shared.results import load_result

    launches = [
        "void flash::hopper::flash_fwd_hopper_kernel<bf16, 128>()",
        "void flash::flash_bwd_kernel<bf16, 128, 8>()",
        "void flash::flash_fwd_kernel<bf16, 128, 4, 2, 32, 0>()",
        "void flash::hopper::flash_fwd_hopper_kernel<bf16, 128>()",
        "void flash::hopper_bwd::flash_bwd_hopper_kernel<bf16, 128, true>()",
    ]
    _fake_ncu(tmp_path, monkeypatch, launches)
    monkeypatch.setattr(attention, "build", lambda: None)
    cfg = profile_attention.AttentionProfileConfig(seq_len=1024, reports_dir=str(tmp_path / "r"))
    kernels = load_result(profile_attention.run(cfg))["results"]["kernels"]
    assert [k["kernel_short"] for k in kernels] == [
        "forward (Hopper)",
        "backward",
        "forward (FA2)",
        "backward (Hopper)",
    ]
