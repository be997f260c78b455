"""The checkpoint benchmark with several ranks, on the CPU tier: two gloo ranks of the tiny model
run the whole benchmark (baseline, sync save, async saves, the resumed torchrun job killed after
its first step), the record carries its world size under its own name, and its report sets its
figures beside the one-rank record found in the same folder."""

from __future__ import annotations

import json

import pytest

from project03_capstone_infra import bench_checkpoint as bench
from project03_capstone_infra.__main__ import main as package_main

SMALL = [
    "--preset",
    "tiny",
    "--timed-steps",
    "3",
    "--warmup-steps",
    "1",
    "--steady-saves",
    "1",
    "--max-steps-during-write",
    "20",
    "--no-prestage",
]


def test_each_world_size_has_its_own_record_name():
    assert bench.bench_name(1) == "checkpoint_bench"  # what the cost model and summary read
    assert bench.bench_name(2) == "checkpoint_bench_ws2"
    with pytest.raises(ValueError, match="--global-batch .* divisible by --nproc"):
        bench.BenchConfig(preset="tiny", global_batch=3, nproc=2, run_dir="x").validate()
    with pytest.raises(ValueError, match="--nproc must be >= 1"):
        bench.BenchConfig(preset="tiny", nproc=0, run_dir="x").validate()


@pytest.mark.slow
def test_two_ranks_end_to_end_beside_the_one_rank_record(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two ranks on two cores
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reports = tmp_path / "reports"
    reports.mkdir()
    out = reports / "project03_capstone_infra"  # where --reports-dir puts the records
    one = package_main(
        [
            "bench-checkpoint",
            *SMALL,
            "--run-dir",
            str(tmp_path / "run1"),
            "--reports-dir",
            str(reports),
        ]
    )
    assert one == 0
    rec1 = json.loads((out / "checkpoint_bench.json").read_text())
    assert rec1["results"]["world_size"] == 1
    assert rec1["results"]["resume"]["returncode"] == -9  # killed after its first step
    # the GPU's state read before the run and after it (here NVML says why it has no GPU)
    gs = rec1["environment"]["gpu_state"]
    assert isinstance(gs["start"], dict) and isinstance(gs["end"], dict)
    assert gs["start"]["time"] <= gs["end"]["time"]

    argv = [
        *SMALL,
        "--nproc",
        "2",
        "--run-dir",
        str(tmp_path / "run2"),
        "--reports-dir",
        str(reports),
    ]
    assert package_main(["bench-checkpoint", *argv]) == 0
    rec = json.loads((out / "checkpoint_bench_ws2.json").read_text())
    res = rec["results"]
    assert rec["name"] == "checkpoint_bench_ws2" and res["world_size"] == 2
    assert rec["config"]["nproc"] == 2
    assert all(isinstance(rec["environment"]["gpu_state"][k], dict) for k in ("start", "end"))
    d = res["derived"]
    for key in ("sync", "async_cold", "async_steady_1", "steady_state"):
        assert key in d, key
    r = res["resume"]
    # resumed from the last async save (training went on while it was written), then killed
    assert 0 < r["from_step"] <= res["steps_run"] and r["to_first_new_step_s"] > 0
    assert r["returncode"] != 0 and r["stderr_tail"] == ""
    md = (out / "checkpoint_bench_ws2.md").read_text()
    assert "tiny, 2 ranks)" in md and "One rank against 2:" in md
    assert (
        "| 1 rank (" in md
        and "| 2 ranks (" in md
        and "global batch (per rank) | 8 (8) | 8 (4)" in md
    )
    assert (out / "checkpoint_bench_ws2.png").is_file()
    # the one-rank record and its report are left as they were
    assert json.loads((out / "checkpoint_bench.json").read_text()) == rec1
    assert "One rank against" not in (out / "checkpoint_bench.md").read_text()
    # and the record re-derives on its own, under its own name
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(rec))
    again = tmp_path / "again"
    again.mkdir()
    argv = ["bench-checkpoint", "--from-json", str(raw), "--reports-dir", str(again)]
    assert package_main(argv) == 0
    assert sorted(p.name for p in (again / "project03_capstone_infra").iterdir()) == [
        "checkpoint_bench_ws2.json",
        "checkpoint_bench_ws2.md",
        "checkpoint_bench_ws2.png",
        "summary.md",  # a reports folder: the project summary is refreshed with the record
    ]


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    """A repetition of two steady saves is summarised by their mean, not the larger one."""
    from project03_capstone_infra.bench_checkpoint import _median

    assert _median([0.45, 0.25]) == pytest.approx(0.35)
    assert _median([0.3, 0.1, 0.2]) == 0.2
    assert _median([]) is None
