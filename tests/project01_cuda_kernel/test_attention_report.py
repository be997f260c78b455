"""CPU tier: the attention section of the README from recorded JSON, and the ratios the
benchmark records."""

from __future__ import annotations

import json

import pytest

from project01_cuda_kernel.bench.attention import ratios
from project01_cuda_kernel.report.attention import render_markdown
from shared.repeat import Spread, flat


def fake_rows(ours_fwd: float, flash_fwd: float, fa2_fwd: float | None = None) -> list[dict]:
    rows = []
    providers = [("ours", ours_fwd), ("flash", flash_fwd), ("cudnn", 600.0), ("ours_r16", 250.0)]
    if fa2_fwd is not None:
        providers.append(("ours_fa2", fa2_fwd))
    for s in (1024, 4096):
        for causal in (False, True):
            for provider, fwd in providers:
                for mode, scale in (("fwd", 1.0), ("bwd", 0.8), ("fwd_bwd", 0.85)):
                    rows.append(
                        {
                            "head_dim": 128,
                            "seq_len": s,
                            "batch": 16384 // s,
                            "heads": 16,
                            "causal": causal,
                            "provider": provider,
                            "mode": mode,
                            "tflops": fwd * scale,
                        }
                    )
    return rows


def write_bench(tmp_path, rows, forward_kernel="fa2", backward_kernels=None):
    folder = tmp_path / "project01_cuda_kernel"
    folder.mkdir(parents=True)
    record = {
        "environment": {"gpu": "Test GPU", "torch": "2.x", "date": "2026-01-01T00:00:00"},
        "config": {"dtype": "bfloat16", "total_tokens": 16384, "hidden": 2048},
        "results": {
            "rows": rows,
            "checks": [{"max_abs_diff_vs_flash": 0.002}],
            "memory": [
                {
                    "head_dim": 128,
                    "seq_len": 1024,
                    "causal": False,
                    "provider": "ours",
                    "peak_mib": 96.0,
                }
            ],
            "skipped": [],
            "ours_forward_kernel": forward_kernel,
        },
    }
    if backward_kernels is not None:
        record["results"]["ours_backward_kernels"] = backward_kernels
    (folder / "attention.json").write_text(json.dumps(record))
    return record


def test_ratios_pair_ours_with_flash():
    r = ratios(fake_rows(300.0, 400.0))  # the ours_r16 rows are not paired
    assert len(r) == 2 * 2 * 3
    assert all(x["ratio"] == pytest.approx(0.75) for x in r)


def test_report_states_missed_target(tmp_path):
    write_bench(tmp_path, fake_rows(300.0, 400.0))
    md = render_markdown(tmp_path)
    assert "Test GPU" in md
    assert "FlashAttention-2-style forward >= 0.90x SDPA FLASH" in md and "**not met**" in md
    assert "0.75" in md  # the measured ratio is shown
    assert "Hopper forward" in md and "not measured (it runs on compute capability 9.0" in md
    assert "| no | 4,096 | 4 x 16 | 300 | 250 | 400 | 600 |" in md  # ours, ours_r16, FLASH, cuDNN
    assert "Nsight Compute figures: not measured yet" in md


def test_report_states_met_target(tmp_path):
    write_bench(tmp_path, fake_rows(380.0, 400.0))
    md = render_markdown(tmp_path)
    assert (
        "FlashAttention-2-style forward >= 0.90x SDPA FLASH (head dim 128, seq >= 2k): **met**"
        in md
    )


def test_report_on_hopper_judges_each_forward_against_its_target(tmp_path):
    # "ours" ran the Hopper forward (500 = 1.25x FLASH: misses 1.3x); the FA2 forward is ours_fa2.
    write_bench(tmp_path, fake_rows(500.0, 400.0, fa2_fwd=380.0), forward_kernel="hopper")
    md = render_markdown(tmp_path)
    assert (
        "FlashAttention-2-style forward >= 0.90x SDPA FLASH (head dim 128, seq >= 2k): **met**. Ours / FLASH ranges 0.95"
        in md
    )
    assert "Hopper forward (wgmma + TMA, producer/consumer warpgroups) >= 1.30x SDPA FLASH" in md
    assert "1.25" in md and "the gap to the target is 0.05x FLASH" in md
    assert "Hopper forward vs SDPA cuDNN" in md and "0.83 to 0.83x" in md
    # the forward table shows ours (Hopper), both FA2 variants, then FLASH and cuDNN
    assert "| no | 4,096 | 4 x 16 | 500 | 380 | 250 | 400 | 600 |" in md


def test_report_once_auto_runs_the_hopper_backward(tmp_path):
    """A record whose "ours" ran the Hopper backward (ours_backward_kernels): the FA2 backward's
    target is judged on ours_fa2bwd, the Hopper backward's (fwd+bwd >= 0.85x cuDNN at head dim
    128, seq >= 4k) on ours, and the text, the bwd table and the chart label say which ran."""
    from project01_cuda_kernel.report.attention import OURS_LABEL_HOPPER_BWD, provider_label

    rows = fake_rows(520.0, 400.0, fa2_fwd=380.0)
    rows += [
        {**r, "provider": "ours_fa2bwd", "tflops": 300.0}
        for r in rows
        if r["provider"] == "ours" and r["mode"] == "bwd"
    ]
    record = write_bench(tmp_path, rows, "hopper", {"128": "hopper"})
    md = render_markdown(tmp_path)
    # FA2 backward 300 / FLASH bwd 320 = 0.94 (ours' own 416 / 320 would be 1.30)
    assert "FlashAttention-2-style backward >= 0.75x SDPA FLASH" in md
    assert "**met**. Ours / FLASH ranges 0.94" in md
    # ours fwd+bwd 520 x 0.85 over cuDNN's 600 x 0.85: 0.87 at both seq-4,096 shapes
    assert (
        "- Target: forward + backward with the Hopper backward >= 0.85x SDPA cuDNN (head dim "
        "128, seq >= 4,096, causal and not): **met**; the 2 shapes measured range 0.87-0.87x"
    ) in md
    assert "'ours' runs the Hopper forward and the Hopper backward (wgmma + TMA)" in md
    # the backward table: ours (Hopper), the FA2 backward named, then FLASH and cuDNN
    assert "| causal | seq | batch x heads | ours | ours, FA2 bwd (128 keys/CTA) | FLASH |" in md
    assert "| no | 4,096 | 4 x 16 | 416 | 300 | 320 | 480 |" in md
    assert provider_label("ours", record["results"]) == OURS_LABEL_HOPPER_BWD
    del record["results"]["ours_backward_kernels"]  # a record from before: FA2's backward
    assert "FA2" in provider_label("ours", record["results"])
    assert provider_label("ours", record["results"]) != OURS_LABEL_HOPPER_BWD


def test_report_without_measurements(tmp_path):
    assert "No attention measurements yet" in render_markdown(tmp_path)


def test_a_repeated_record_shows_median_and_range(tmp_path):
    """Rows of two or more repetitions: 'median (min–max)' cells, ours / FLASH as the median of
    the per-repetition ratios with its range, and a sentence saying so."""
    rows = fake_rows(300.0, 400.0)
    spreads = {"ours": [300.0, 290.0, 310.0], "flash": [400.0, 380.0, 390.0]}
    for r in rows:
        if r["provider"] in spreads and r["mode"] == "fwd":
            r.update(flat("tflops", Spread.of(spreads[r["provider"]])))
    write_bench(tmp_path, rows)
    record = json.loads((tmp_path / "project01_cuda_kernel" / "attention.json").read_text())
    record["results"]["repeats"] = 3
    (tmp_path / "project01_cuda_kernel" / "attention.json").write_text(json.dumps(record))
    md = render_markdown(tmp_path)
    # per repetition 300/400, 290/380, 310/390: 0.75, 0.763, 0.795 -> 0.76 (0.75–0.79)
    assert "| no | 4,096 | 4 x 16 | 300 (290–310) | 250 | 390 (380–400) | 600 |" in md
    assert "| 0.76 (0.75–0.79) |" in md
    assert "timed 3 times, ours and SDPA's backends alternating" in md
    # the target is judged on the median of the ratios
    assert "Ours / FLASH ranges 0.76 (seq 4,096" in md


def test_a_single_run_record_has_no_ranges(tmp_path):
    write_bench(tmp_path, fake_rows(300.0, 400.0))
    md = render_markdown(tmp_path)
    assert "–" not in md and "alternating" not in md


def test_ncu_heading_names_when_and_at_which_commit_the_profile_ran():
    from project01_cuda_kernel.report.attention import _measured_at

    env = {"date": "2026-12-04T21:00:00+00:00", "git_commit": "3272576286c272b8128e6986d73c6502"}
    assert _measured_at(env) == " (measured 2026-12-04, commit 3272576)"
    assert _measured_at({"date": "2026-12-04T21:00:00+00:00"}) == " (measured 2026-12-04)"
    assert _measured_at({}) == ""
