"""The README's generated sections come from the JSON records, and the committed records
render."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from project02_fsdp_scaling import report
from shared.results import REPORTS_DIR, load_result

COMMITTED = Path(REPORTS_DIR) / "project02_fsdp_scaling"


def test_readme_sections_filled_from_records(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "intro\n<!-- gpu-sweep -->\nold\n<!-- /gpu-sweep -->\n<!-- gpu-precision -->\n"
        "<!-- /gpu-precision -->\n<!-- gpu-scaling -->\n"
        "<!-- /gpu-scaling -->\n<!-- cpu-scaling -->\n<!-- /cpu-scaling -->\n"
        "<!-- mixed-precision -->\n<!-- /mixed-precision -->\n"
        "<!-- compare -->\n<!-- /compare -->\nend\n"
    )
    empty = tmp_path / "reports"
    empty.mkdir()
    report.refresh_readme(empty, readme=readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("end\n")
    assert "old" not in text and text.count("_Not run yet._") == 6


@pytest.mark.skipif(
    not (COMMITTED / "sweep_gpu_precision.json").is_file(),
    reason="no committed bf16/fp32 sweep record",
)
def test_precision_sweep_renders_each_peak_and_the_ratio():
    md = report.sweep_markdown(load_result(COMMITTED / "sweep_gpu_precision.json"))
    rec = load_result(COMMITTED / "sweep_gpu_precision.json")
    ok = {v["variant"]: v for v in rec["results"]["variants"] if v["status"] == "ok"}
    ratio = ok["compile"]["tokens_per_s"] / ok["compile+fp32"]["tokens_per_s"]
    assert f"compile {ratio:.2f}x" in md
    assert "bfloat16 989.4 TFLOP/s" in md and "float32 67.0 TFLOP/s" in md
    # the fp32 variant's MFU is against the fp32 peak: it must not be picked as the best
    assert "Best by MFU (bf16 variants): **compile**" in md


def test_pick_best_ignores_fp32_mfu():
    from project02_fsdp_scaling.sweep import pick_best

    ok = [
        {"variant": "compile", "compute_dtype": "bfloat16", "mfu": 0.51, "tokens_per_s": 75e3},
        {"variant": "compile+fp32", "compute_dtype": "float32", "mfu": 0.71, "tokens_per_s": 7e3},
        {"variant": "eager", "compute_dtype": "bfloat16", "mfu": 0.35, "tokens_per_s": 52e3},
    ]
    assert pick_best(ok)["variant"] == "compile"
    assert pick_best([ok[1]])["variant"] == "compile+fp32"  # nothing else to choose
    assert pick_best([]) is None


@pytest.mark.skipif(
    not (COMMITTED / "sweep_gpu.json").is_file(), reason="no committed GPU sweep record"
)
def test_committed_gpu_records_render(tmp_path):
    for name in ("sweep_gpu.json", "scaling_gpu.json", "scaling_gpu_ws1.json"):
        shutil.copy(COMMITTED / name, tmp_path / name)
    files = report.render_scaling(tmp_path / "scaling_gpu.json")
    assert all(f.is_file() for f in files)
    md = (tmp_path / "scaling_gpu.md").read_text()
    rec = load_result(tmp_path / "scaling_gpu.json")
    best = rec["results"]["runs"][0]
    assert f"| 1 | {round(best['tokens_per_s'])} |" in md
    # Every cost line that was not measured says so.
    assert md.count("PROJECTED") == sum(not c["measured"] for c in rec["results"]["cost"]["lines"])
    sweep = report.sweep_markdown(load_result(tmp_path / "sweep_gpu.json"))
    assert "Best by MFU" in sweep


def test_all_param_mfu_is_the_same_measurement_rescaled():
    strict = 0.5
    common = report.mfu_all_params(strict, "1b", 2048)
    # 7.13 / 6.735 GFLOP per token: the input embedding table counted as matmul work. The
    # constants are rounded to 5 digits (1e-4 relative each): rel 1e-3 is their rounding, not noise.
    assert common == pytest.approx(strict * 7.1306 / 6.7349, rel=1e-3)
    assert report.mfu_all_params(None, "1b", 2048) is None
