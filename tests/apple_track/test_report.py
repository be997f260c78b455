"""The report from a recorded result: tables, notes on what was skipped, chart, README. And the
export driver's glue run where no exporter is installed (the main environment): every runtime
is reported as skipped with the reason, nothing crashes. Needs neither coremltools, LiteRT nor
MLX."""

from __future__ import annotations

import json

import pytest

from apple_track import report
from apple_track.model import TOLERANCES, ExportConfig
from shared.testing import assert_one_line_error, run_entry

ENV = {
    "date": "2026-11-29T12:00:00+00:00",
    "gpu": None,
    "cpu_count": 2,
    "torch": "2.14.1",
    "cuda": None,
    "python": "3.11.7",
    "git_commit": "0123456789abcdef",
    "git_dirty": False,
    "driver": None,
}


def _timing(ms: float) -> dict:
    return {
        "median_ms": ms,
        "p20_ms": ms * 0.9,
        "p80_ms": ms * 1.1,
        "min_ms": ms * 0.8,
        "mean_ms": ms,
        "n": 50,
        "method": "torch.utils.benchmark",
    }


def _variant(runtime, variant, nbytes, rel_l2, ms, emulated=False, **extra):
    v = {
        "runtime": runtime,
        "variant": variant,
        "description": "d",
        "bytes": nbytes,
        "tolerance": TOLERANCES[(runtime, variant)],
        "n_ops": 100,
        "compressed_weight_ops": 12,
        "op_counts": {"linear": 11, "const": 80} if runtime == "coreml" else None,
        "parity": {
            "max_abs": rel_l2 * 5,
            "rel_l2": rel_l2,
            "top1_agree": 1.0,
            "loss": 1.0,
            "loss_delta": rel_l2 / 10,
        },
        "parity_source": "emulated: weights" if emulated else "measured on the runtime",
        "latency": _timing(ms) if ms else None,
        "within_tolerance": True,
        "io": {
            "inputs": [{"name": "tokens", "dtype": "int32", "shape": [1, 64]}],
            "outputs": [{"name": "logits", "dtype": "float16", "shape": [1, 64, 256]}],
        },
    }
    return v | extra


@pytest.fixture
def record_path(tmp_path):
    skipped = "skipped: Core ML predicts only on macOS (this is Linux)"
    variants = [
        _variant("coreml", "fp16", 320_000, 5e-4, None, emulated=True, prediction=skipped),
        _variant(
            "coreml",
            "palettize4",
            115_000,
            8e-2,
            None,
            emulated=True,
            prediction=skipped,
            op_counts={"linear": 11, "const": 70, "constexpr_lut_to_dense": 12},
        ),
        _variant("litert", "int8", 220_000, 6e-3, 0.2),
        _variant("mlx", "q4", 110_000, 7e-2, 11.0),
    ]
    record = {
        "schema": 1,
        "project": "apple_track",
        "name": "export",
        "environment": ENV,
        "config": {"preset": "tiny"},
        "baseline": {
            "runtime": "pytorch",
            "variant": "fp32 eager",
            "bytes": 565_000,
            "latency": _timing(1.0),
            "latency_at_end": _timing(1.25),
            "loss": 1.06,
        },
        "results": {
            "model": {
                "preset": "tiny",
                "num_params": 139_584,
                "batch": 1,
                "seq_len": 64,
                "train_steps": 300,
                "eval_loss": 1.06,
            },
            "versions": {"torch": "2.14.1", "coremltools": "9.0"},
            "platform": {"system": "Linux", "machine": "x86_64"},
            "variants": variants,
            "runtime_failures": {},
            "metal": {"ran": False, "reason": "no Metal device (Linux)"},
            "load_average_1_5_15": [1.0, 1.0, 1.0],
        },
    }
    path = tmp_path / "reports" / "apple_track" / "export.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def test_rows_compare_with_the_baseline_of_the_same_run(record_path):
    rows = report.variant_rows(json.loads(record_path.read_text()))
    by = {(r["runtime"], r["variant"]): r for r in rows}
    lit = by[("LiteRT", "int8")]
    assert lit["speedup"] == pytest.approx(1.0 / 0.2)
    assert lit["vs_fp32"] == pytest.approx(220_000 / 565_000)
    assert lit["source"] == "measured"
    cm = by[("Core ML", "fp16")]
    assert cm["source"] == "emulated" and cm["latency_ms"] is None and cm["speedup"] is None


def test_report_files_and_readme(record_path, tmp_path):
    readme = tmp_path / "apple_track" / "README.md"
    readme.parent.mkdir()
    written = report.write_report(record_path, readme=readme)
    out = record_path.parent
    assert {p.name for p in written} == {"tradeoff.png", "summary.md", "README.md", "details.md"}
    png = (out / "tradeoff.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    text = readme.read_text()  # the front page: its generated table links the record
    assert "<!-- results:apple_track -->" in text and "<!-- /results:apple_track -->" in text
    assert "](../reports/apple_track/export.json)" in text and "2026-11-29" in text
    assert "](../reports/apple_track/tradeoff.png)" in text  # relative to the README
    assert "](../reports/apple_track/details.md)" in text
    details = (out / "details.md").read_text()  # every table, beside the records
    assert "| Core ML | palettize4 | 112 KiB |" in details  # 115,000 bytes
    assert "Core ML prediction: skipped: Core ML predicts only on macOS" in details
    assert "Metal kernels: not run: no Metal device (Linux)" in details
    assert "](tradeoff.png)" in details
    assert "constexpr_lut_to_dense +12" in details  # what palettization adds to the op counts
    assert "0123456789" in details and "2026-11-29" in details  # where it was measured
    assert "1.000 ms per forward" in details
    assert "Timed again at the end of the run: 1.250 ms" in details
    assert "Load average" not in details  # a quiet machine (load 1.0 on 2 cores): no warning
    summary = (out / "summary.md").read_text()  # links relative to its own folder
    assert "](tradeoff.png)" in summary and "| LiteRT | int8 |" in summary
    assert "[Details](details.md)" in summary and "4 within their stated" in summary


def test_other_runs_get_their_own_chart_and_section(record_path, tmp_path):
    other = json.loads(record_path.read_text())
    other["name"] = "export_125m"
    other["results"]["model"] |= {"preset": "125m", "num_params": 134_105_856, "seq_len": 128}
    other_path = record_path.with_name("export_125m.json")
    other_path.write_text(json.dumps(other))
    (record_path.parent / "notes.json").write_text('{"not": "a record"}')  # ignored
    readme = tmp_path / "README.md"
    written = report.write_report(other_path, readme=readme)
    names = {p.name for p in written}
    assert names == {"export_125m_tradeoff.png", "README.md", "details.md"}  # no summary
    text = (record_path.parent / "details.md").read_text()
    assert "### Run `export_125m`: preset `125m`, seq 128" in text
    assert "(export_125m_tradeoff.png)" in text
    assert "134,105,856 parameters" in text and "139,584 parameters" in text  # both runs


def test_readme_without_results_says_how_to_get_them():
    text = report.render_readme(None, "../reports/apple_track/")
    assert "No results recorded yet" in text and "make apple" in text


def test_report_command_on_a_missing_record(tmp_path, capsys):
    argv = ["--record", str(tmp_path / "none.json"), "--no-readme"]
    assert_one_line_error(*run_entry(report.main, argv, capsys), "no result file")


def test_export_without_exporters_reports_each_runtime_as_skipped(tmp_path):
    """In the main environment none of coremltools / LiteRT / MLX is installed: the driver still
    measures the PyTorch baseline, records why each runtime was skipped, and exits 0."""
    pytest.importorskip("torch")
    for mod in ("coremltools", "litert_torch", "mlx"):
        try:
            __import__(mod)
        except ImportError:
            continue
        pytest.skip(f"{mod} is installed here: this test is for an environment without it")
    from apple_track import export

    cfg = ExportConfig(train_steps=2, seq_len=16)
    path, n_failed = export.measure(cfg, tmp_path / "models", reports_dir=tmp_path / "reports")
    record = json.loads(path.read_text())
    assert n_failed == 0
    failures = record["results"]["runtime_failures"]
    assert set(failures) == {"coreml", "litert", "mlx"}
    assert all(v.startswith("skipped:") and "not installed" in v for v in failures.values())
    assert record["baseline"]["latency"]["median_ms"] > 0
    assert record["results"]["metal"]["ran"] is False
    assert record["environment"]["torch"]
    written = report.write_report(path, readme=tmp_path / "README.md")
    assert "skipped" in (path.parent / "details.md").read_text()
    assert len(written) == 4
