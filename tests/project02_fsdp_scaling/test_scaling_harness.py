"""The strong-scaling harness end to end on CPU: world sizes 1 and 2 over gloo (and one too
large for the machine, skipped with a note) produce the JSON record, charts and Markdown."""

from __future__ import annotations

import json

import pytest

from project02_fsdp_scaling import report, scaling
from project02_fsdp_scaling.config import TrainConfig
from project02_fsdp_scaling.report import README

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    readme_before = README.read_text() if README.exists() else None
    mp = pytest.MonkeyPatch()
    mp.setattr(scaling.os, "cpu_count", lambda: 2)  # a 2-core machine whatever runs the test
    try:
        train = TrainConfig(preset="auto", global_batch=0, steps=2, warmup_steps=1, profile=True)
        path = scaling.run(scaling.ScalingConfig(gpus="1,2,4", reports_dir=str(root), train=train))
    finally:
        mp.undo()
    assert (README.read_text() if README.exists() else None) == readme_before
    return path, json.loads(path.read_text())


def test_record_has_every_world_size(record):
    path, rec = record
    assert path.name == "scaling_cpu.json"
    assert rec["environment"]["torch"]
    # the GPU's state before the jobs and at the end (on CPU: NVML's reason for having none)
    assert all(isinstance(rec["environment"]["gpu_state"][k], dict) for k in ("start", "end"))
    res = rec["results"]
    assert [(r["world_size"], r["status"]) for r in res["runs"]] == [
        (1, "ok"),
        (2, "ok"),
        (4, "skipped"),
    ]
    assert "world size 4 needs 4 CPU cores, this machine has 2" in res["runs"][2]["note"]
    one, two = res["runs"][0], res["runs"][1]
    assert res["baseline"]["tokens_per_s"] == one["tokens_per_s"]
    assert two["efficiency"] == pytest.approx(two["tokens_per_s"] / (2 * one["tokens_per_s"]))
    assert two["tokens_per_s_per_device"] == pytest.approx(two["tokens_per_s"] / 2)
    for r in (one, two):
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["peak_memory_gib"] > 0
        assert r["timed_steps"] == 2
        # The one-process baseline trains in the same precision as the data-parallel run.
        assert r["compute_dtype"] == "bfloat16"
    assert (one["micro_batch"], two["micro_batch"]) == (8, 4)
    assert res["cost"]["lines"] == [] and "needs a measured GPU" in res["cost"]["note"]


def test_profiles_and_traces(record):
    path, rec = record
    one, two = rec["results"]["runs"][:2]
    for r in (one, two):
        p = r["profile"]
        assert p["steps"] == 1 and p["compute_ms"] > 0
        assert p["compute_ms"] + p["exposed_comm_ms"] + p["other_ms"] == pytest.approx(p["step_ms"])
        assert (path.parent / r["trace"]).is_file()
    # Two processes all-gather parameters; gloo runs the collectives on its own threads.
    assert two["profile"]["comm_ms"] > 0
    assert "allgather" in two["profile"]["collectives"]


def test_charts_and_markdown(record):
    path, _ = record
    for suffix in ("throughput", "efficiency", "breakdown"):
        png = path.parent / f"scaling_cpu_{suffix}.png"
        assert png.is_file() and png.stat().st_size > 10_000
    md = (path.parent / "scaling_cpu.md").read_text()
    assert "| world size |" in md and "skipped: world size 4" in md
    assert "![throughput](scaling_cpu_throughput.png)" in md
    # Re-rendering from the JSON alone gives the same Markdown.
    report.render_scaling(path)
    assert (path.parent / "scaling_cpu.md").read_text() == md
