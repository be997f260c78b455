"""CPU tier: the README tables regenerate from recorded result JSON (no GPU needed).

The records here are built in the test with the benchmark's own row builder and round numbers,
so every expected figure below can be checked by hand."""

from __future__ import annotations

import json

import pytest
import torch

from project01_cuda_kernel import report
from project01_cuda_kernel.bench import gemm as bench_gemm
from project01_cuda_kernel.report import gemm as report_gemm
from shared.hardware import get_gpu
from shared.repeat import Spread, flat


class _Timing:
    def __init__(self, ms: float):
        self.median_ms = self.p20_ms = self.p80_ms = ms
        self.n, self.method = 10, "recorded"

    def tflops(self, flops):
        return flops / (self.median_ms * 1e-3) / 1e12

    def gbps(self, nbytes):
        return nbytes / (self.median_ms * 1e-3) / 1e9


def _ms(size: int, tflops: float) -> float:
    return 2 * size**3 / (tflops * 1e12) * 1e3


def _record(tmp_path, ladder_tflops: dict[tuple[str, int], float]) -> None:
    spec = get_gpu("h200-sxm")
    base, rows = [], []
    cublas = {"float32": 50.0, "bfloat16": 700.0}
    for size in (4096, 8192):
        shape = (size, size, size)
        for dt, tf in cublas.items():
            t = getattr(torch, dt)
            base.append(
                bench_gemm._row(
                    "cublas", "cublas", dt, shape, [_Timing(_ms(size, tf))], 1e-3, 1e-3, spec, t
                )
            )
        for (kernel, s), tf in ladder_tflops.items():
            if s != size:
                continue
            dt = "float32" if kernel.startswith("sgemm") else "bfloat16"
            r = bench_gemm._row(
                "ladder",
                kernel,
                dt,
                shape,
                [_Timing(_ms(size, tf))],
                1e-3,
                1e-3,
                spec,
                getattr(torch, dt),
            )
            r["pct_of_cublas"] = 100 * r["tflops"] / cublas[dt]
            rows.append(r)
    rows.append(
        {
            "kind": "ladder",
            "kernel": "hgemm_09_wgmma_tma",
            "dtype": "bfloat16",
            "shape": "4096x4096x4096",
            "m": 4096,
            "n": 4096,
            "k": 4096,
            "correct": False,
            "rel_err": 0.5,
            "cublas_rel_err": 1e-3,
        }
    )
    folder = tmp_path / "project01_cuda_kernel"
    folder.mkdir(parents=True)
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-11-29T12:00:00+00:00"}
    (folder / "gemm.json").write_text(
        json.dumps({"environment": env, "config": {}, "results": {"rows": rows, "baseline": base}})
    )
    compile_rec = {
        "environment": env,
        "config": {"nvcc": "13.0", "arch": "sm_90a", "flags": []},
        "results": [
            {
                "file": "gemm/sgemm_07_warptiling.cu",
                "no_spill": True,
                "kernels": [
                    {
                        "kernel": "sgemm_warptile_kernel<true>(float*)",
                        "registers": 128,
                        "smem_bytes": 33280,
                        "stack_frame_bytes": 0,
                        "spill_store_bytes": 0,
                        "spill_load_bytes": 0,
                    }
                ],
            }
        ],
    }
    (folder / "compile.json").write_text(json.dumps(compile_rec))


README = """# x
<!-- gemm:targets -->
old
<!-- /gemm:targets -->
<!-- gemm:ladder -->
<!-- /gemm:ladder -->
<!-- gemm:compile -->
<!-- /gemm:compile -->
<!-- gemm:profile -->
<!-- /gemm:profile -->
## FlashAttention
<!-- attention -->
<!-- /attention -->
"""


@pytest.fixture
def recorded(tmp_path):
    _record(
        tmp_path,
        {
            ("sgemm_07_warptiling", 4096): 46.0,
            ("hgemm_08_mma_sync", 4096): 420.0,
            ("hgemm_08_mma_sync", 8192): 350.0,
        },
    )
    return tmp_path


def test_targets_are_judged_from_the_numbers(recorded):
    gemm = json.loads((recorded / "project01_cuda_kernel" / "gemm.json").read_text())
    t = {row["target"]: row for row in report_gemm.targets(gemm)}
    fp32 = t["best float32 kernel >= 90% of cuBLAS at 4096³"]
    assert fp32["met"] and fp32["measured % of cuBLAS"] == pytest.approx(92.0)
    bf16 = t["best bfloat16 kernel >= 90% of cuBLAS at 4096³"]
    assert not bf16["met"] and bf16["measured % of cuBLAS"] == pytest.approx(60.0)
    assert bf16["best kernel"] == "`hgemm_08_mma_sync`"  # the failed step-9 row is not counted
    assert t["best bfloat16 kernel >= 90% of cuBLAS at 8192³"]["measured % of cuBLAS"] == (
        pytest.approx(50.0)
    )


def test_readme_sections_regenerate_between_markers(recorded, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert report.main(report.ReportConfig(reports_dir=str(recorded), readme_file=str(readme))) == 0
    text = readme.read_text()
    assert "old" not in text
    ladder = text.split("<!-- gemm:ladder -->")[1].split("<!-- /gemm:ladder -->")[0]
    assert "`sgemm_07_warptiling`" in ladder and "46" in ladder and "92" in ladder
    assert "FAILED check" in ladder  # hgemm_09's failed correctness check is shown, not a speed
    assert "cuBLAS bfloat16" in ladder and "700" in ladder
    assert "NVIDIA H200" in ladder and "2026-11-29" in ladder  # the context of the numbers
    assert "| sgemm_07_warptiling.cu" not in text and "sgemm_warptile_kernel<true>" in text
    assert "_No profile yet" in text  # no profile_gemm.json recorded
    check = report.ReportConfig(reports_dir=str(recorded), readme_file=str(readme), check=True)
    assert report.main(check) == 0


def test_check_mode_reports_a_stale_readme(recorded, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    check = report.ReportConfig(reports_dir=str(recorded), readme_file=str(readme), check=True)
    assert report.main(check) == 1
    assert readme.read_text() == README  # --check writes nothing


def test_missing_results_say_how_to_make_them(tmp_path):
    sections = report.render_all(tmp_path)
    assert "python -m project01_cuda_kernel bench-gemm" in sections["gemm:ladder"]
    assert "python -m project01_cuda_kernel compile-check" in sections["gemm:compile"]


def test_the_committed_readme_has_its_results_block():
    # the README is a front page: one generated table (`make readme`); the full tables are in
    # reports/project01_cuda_kernel/summary.md, and no stale block of them is left behind
    text = report.README.read_text()
    marker = "results:project01_cuda_kernel"
    assert f"<!-- {marker} -->" in text and f"<!-- /{marker} -->" in text
    assert "<!-- gemm:ladder -->" not in text and "<!-- attention -->" not in text


def test_charts_regenerate_from_a_recorded_json(recorded, tmp_path):
    rec = json.loads((recorded / "project01_cuda_kernel" / "gemm.json").read_text())
    rec["results"]["gpu_spec"] = {
        "key": "h200-sxm",
        "peak_tflops": {"fp32": 67, "bf16": 989.4},
        "bandwidth_gbs": 4800,
    }
    paths = report_gemm.make_charts(rec["results"], tmp_path / "charts", "recorded test data")
    names = {p.name for p in paths}
    assert {"gemm_ladder.png", "gemm_sizes.png", "gemm_roofline_bf16.png"} <= names
    assert all(p.stat().st_size > 10_000 for p in paths)  # real PNGs, not empty files


def test_a_repeated_record_shows_each_figure_as_median_and_range():
    """Two or more repetitions: 'median (min–max)' and a sentence saying so; the same figures
    from one run stay plain numbers (as every committed record renders)."""
    spec, shape, bf16 = get_gpu("h200-sxm"), (4096, 4096, 4096), torch.bfloat16

    def record(cublas_tf: list[float], ours_tf: list[float], pct: list[float]) -> dict:
        times = [[_Timing(_ms(4096, tf)) for tf in tfs] for tfs in (cublas_tf, ours_tf)]
        base = bench_gemm._row(
            "cublas", "cublas", "bfloat16", shape, times[0], 1e-3, 1e-3, spec, bf16
        )
        row = bench_gemm._row(
            "ladder", "hgemm_09_wgmma_tma", "bfloat16", shape, times[1], 1e-3, 1e-3, spec, bf16
        )
        row.update(flat("pct_of_cublas", Spread.of(pct)))
        results = {"rows": [row], "baseline": [base], "repeats": len(pct)}
        return {"environment": {"gpu": "NVIDIA H200"}, "config": {}, "results": results}

    gemm = record([700.0, 690.0, 720.0], [630.0, 650.0, 640.0], [90.0, 94.2, 88.9])
    ladder = report_gemm.render_ladder(gemm)
    assert "| 640 (630–650) | 90 (88.9–94.2) |" in ladder
    assert "| 700 (690–720) | 100 |" in ladder  # cuBLAS's own spread
    assert "median of 3 repetitions" in ladder
    targets = report_gemm.render_targets(gemm)
    assert "| `hgemm_09_wgmma_tma` | 90.0 (88.9–94.2) | yes |" in targets
    assert "88.9–94.2" in report_gemm.render_shapes(gemm)
    single = record([700.0], [640.0], [91.4])
    assert "| 640 | 91.4 |" in report_gemm.render_ladder(single)
    assert "| `hgemm_09_wgmma_tma` | 91.4 | yes |" in report_gemm.render_targets(single)
    assert "repetitions" not in report_gemm.render_ladder(single) + report_gemm.render_targets(
        single
    )


def test_the_fp8_step_renders_beside_the_ladder_against_scaled_mm(tmp_path):
    """FP8 rows (dtype float8_e4m3fn, baseline torch._scaled_mm): minimum bytes with 1-byte
    inputs and a 2-byte output, the FP8 peak as roof, a row and a baseline line in the ladder
    table, an FP8 roofline chart; the bfloat16 targets do not count them."""
    spec, fp8 = get_gpu("h200-sxm"), torch.float8_e4m3fn
    base, rows = [], []
    for size, cublas_tf, ours_tf in ((4096, 1200.0, 1080.0), (8192, 1300.0, 1235.0)):
        shape = (size, size, size)
        b = bench_gemm._row(
            "cublas", "cublas", "float8_e4m3fn", shape, [_Timing(_ms(size, cublas_tf))], 2e-3,
            2e-3, spec, fp8,
        )  # fmt: skip
        r = bench_gemm._row(
            "ladder", "fp8gemm_10_wgmma_tma", "float8_e4m3fn", shape,
            [_Timing(_ms(size, ours_tf))], 2e-3, 2e-3, spec, fp8,
        )  # fmt: skip
        r["pct_of_cublas"] = 100 * ours_tf / cublas_tf
        base.append(b)
        rows.append(r)
    assert rows[0]["min_bytes"] == 2 * 4096 * 4096 * 1 + 4096 * 4096 * 2
    assert rows[0]["correct"]  # 2e-3 <= 2 x 2e-3 + floor
    assert rows[0]["attainable_tflops"] == pytest.approx(spec.peak_flops(fp8) / 1e12)
    gemm = {"environment": {"gpu": "NVIDIA H200"}, "config": {}}
    gemm["results"] = {"rows": rows, "baseline": base}
    ladder = report_gemm.render_ladder(gemm)
    assert "| 10 | `fp8gemm_10_wgmma_tma` |" in ladder and "| 90 |" in ladder and "| 95 |" in ladder
    assert "| cuBLASLt float8_e4m3fn (torch._scaled_mm) | baseline, same run |" in ladder
    assert "torch._scaled_mm on the same inputs" in ladder
    assert "`fp8gemm_10_wgmma_tma`" in report_gemm.render_shapes(gemm)
    assert report_gemm.best_row(gemm, "bfloat16", 4096) is None
    gemm["results"]["gpu_spec"] = {
        "key": "h200-sxm",
        "peak_tflops": {"fp32": 67, "bf16": 989.4, "fp8": 1978.9},
        "bandwidth_gbs": 4800,
    }
    paths = report_gemm.make_charts(gemm["results"], tmp_path, "recorded test data")
    assert {p.name for p in paths} >= {"gemm_ladder.png", "gemm_sizes.png", "gemm_roofline_fp8.png"}
