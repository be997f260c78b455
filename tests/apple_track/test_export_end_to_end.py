"""`python -m apple_track export` end to end, into temporary folders: every runtime converts,
runs and lands within its tolerance; the record, chart and README are written. Needs the
track's environment (.venv-apple), where every exporter is installed."""

from __future__ import annotations

import json

import pytest

for _mod, _why in (
    ("coremltools", "coremltools"),
    ("litert_torch", "litert-torch"),
    ("ai_edge_litert", "ai-edge-litert"),
    ("mlx.core", "mlx"),
):
    pytest.importorskip(_mod, reason=f"{_why} is not installed: run in .venv-apple")
pytest.importorskip("sklearn", reason="scikit-learn (k-means palettization) is not installed")

from apple_track import export  # noqa: E402


@pytest.mark.slow
def test_export_writes_a_complete_record(tmp_path):
    readme = tmp_path / "README.md"
    rc = export.main(
        [
            "--train-steps",
            "60",
            "--seq-len",
            "32",
            "--coreml",
            "fp16",
            "palettize4",
            "--litert",
            "fp32",
            "int8",
            "--mlx",
            "fp32",
            "q4",
            "--models-dir",
            str(tmp_path / "models"),
            "--reports-dir",
            str(tmp_path / "reports"),
            "--no-readme",
        ]
    )
    assert rc == 0
    record_path = tmp_path / "reports" / "apple_track" / "export.json"
    record = json.loads(record_path.read_text())
    results = record["results"]
    assert results["runtime_failures"] == {}
    got = {(v["runtime"], v["variant"]) for v in results["variants"]}
    assert got == {
        ("coreml", "fp16"),
        ("coreml", "palettize4"),
        ("litert", "fp32"),
        ("litert", "int8"),
        ("mlx", "fp32"),
        ("mlx", "q4"),
    }
    for v in results["variants"]:
        assert v["within_tolerance"], (v["runtime"], v["variant"], v["parity"])
        assert v["bytes"] > 0 and (tmp_path / "models" / v["file"]).exists()
        if v["runtime"] != "coreml" or v["prediction"] == "ran":
            assert v["latency"]["median_ms"] > 0
    assert record["baseline"]["latency"]["median_ms"] > 0
    assert record["environment"]["torch"] and record["config"]["seq_len"] == 32
    from apple_track import report

    report.write_report(record_path, readme=readme)
    assert "details.md" in readme.read_text()  # the front page links the full tables
    assert "| LiteRT | int8 |" in (record_path.parent / "details.md").read_text()

    # the profiling loop runs the files the export wrote
    from apple_track import profile

    common = [
        "--seconds",
        "0.2",
        "--models-dir",
        str(tmp_path / "models"),
        "--record",
        str(record_path),
    ]
    assert profile.main(["litert", "int8", *common]) == 0
    assert profile.main(["mlx", "q4", *common]) == 0
