"""CPU tier: the attention benchmark's bookkeeping, ncu CSV parsing and report rendering."""

from __future__ import annotations

import json

import pytest

from project01_cuda_kernel.attention_report import render_markdown
from project01_cuda_kernel.bench_attention import BenchConfig, ratios
from project01_cuda_kernel.profile_attention import parse_ncu_csv


def fake_rows(ours_fwd: float, flash_fwd: float) -> list[dict]:
    rows = []
    for s in (1024, 4096):
        for causal in (False, True):
            for provider, fwd in (("ours", ours_fwd), ("flash", flash_fwd), ("cudnn", 600.0),
                                  ("ours_r16", 250.0)):  # fmt: skip
                for mode, scale in (("fwd", 1.0), ("bwd", 0.8), ("fwd_bwd", 0.85)):
                    rows.append({"head_dim": 128, "seq_len": s, "batch": 16384 // s,
                                 "heads": 16, "causal": causal, "provider": provider,
                                 "mode": mode, "tflops": fwd * scale})  # fmt: skip
    return rows


def write_bench(tmp_path, rows):
    folder = tmp_path / "project01_cuda_kernel"
    folder.mkdir(parents=True)
    record = {
        "environment": {"gpu": "Test GPU", "torch": "2.x", "date": "2026-01-01T00:00:00"},
        "config": {"dtype": "bfloat16", "total_tokens": 16384, "hidden": 2048},
        "results": {"rows": rows, "checks": [{"max_abs_diff_vs_flash": 0.002}],
                    "memory": [{"head_dim": 128, "seq_len": 1024, "causal": False,
                                "provider": "ours", "peak_mib": 96.0}], "skipped": []},
    }  # fmt: skip
    (folder / "attention.json").write_text(json.dumps(record))


def test_ratios_pair_ours_with_flash():
    r = ratios(fake_rows(300.0, 400.0))  # the ours_r16 rows are not paired
    assert len(r) == 2 * 2 * 3
    assert all(x["ratio"] == pytest.approx(0.75) for x in r)


def test_report_states_missed_target(tmp_path):
    write_bench(tmp_path, fake_rows(300.0, 400.0))
    md = render_markdown(tmp_path)
    assert "Test GPU" in md
    assert "Forward >= 90% of SDPA FLASH" in md and "**not met**" in md
    assert "0.75" in md  # the measured ratio is shown
    assert "Hopper forward" in md and "not implemented" in md
    assert "| no | 4,096 | 4 x 16 | 300 | 250 | 400 | 600 |" in md  # ours, ours_r16, FLASH, cuDNN
    assert "Nsight Compute figures: not measured yet" in md


def test_report_states_met_target(tmp_path):
    write_bench(tmp_path, fake_rows(380.0, 400.0))
    md = render_markdown(tmp_path)
    assert "Forward >= 90% of SDPA FLASH (head dim 128, seq >= 2k): **met**" in md


def test_report_without_measurements(tmp_path):
    assert "No attention measurements yet" in render_markdown(tmp_path)


def test_bench_config_validation():
    assert BenchConfig(quick=True).seq_lens == (1024, 4096)
    with pytest.raises(ValueError, match="providers"):
        BenchConfig(providers=("ours", "triton"))
    with pytest.raises(ValueError, match="must divide total_tokens"):
        BenchConfig(seq_lens=(3000,))
    with pytest.raises(ValueError, match="dtype"):
        BenchConfig(dtype="float32")


NCU_CSV = """==PROF== Connected to process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","launch__registers_per_thread","sm__warps_active.avg.pct_of_peak_sustained_active","launch__shared_mem_per_block_dynamic"
"","","","","","","","nsecond","register/thread","%","byte"
"0","123","python3","127.0.0.1","void flash::flash_fwd_kernel<...>(flash::FwdParams)","1","7","1,234,000","242","15.6","65536"
"1","123","python3","127.0.0.1","void flash::flash_bwd_kernel<...>(flash::BwdParams)","1","7","3,000,000","255","12.1","107520"
"""


def test_parse_ncu_csv_converts_units():
    rows = parse_ncu_csv(NCU_CSV)
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
        parse_ncu_csv("==PROF== nothing profiled\n")
