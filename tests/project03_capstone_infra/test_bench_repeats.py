"""The checkpoint benchmark's repetitions (--repeats): the sync save and the steady async saves
measured N times in one process, interleaved (sync, async, async, sync, ...), the headline
figures the medians over the repetitions with their range; a record of one repetition derives
as it always did, and --budget-s admits a further repetition only when it fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project03_capstone_infra import bench_checkpoint as bench
from project03_capstone_infra.__main__ import main as package_main
from shared.repeat import read_flat
from shared.results import REPORTS_DIR

from .test_bench_checkpoint import SMALL as BENCH_SMALL

BASE = {"baseline": {"median_step_s": 1.0}}


def _async(held: float, rep: int | None = None) -> dict:
    """Raw timings of an async save held `held` s: its call, no step above the median."""
    raw = {"call_s": held, "staging_wait_s": 0.0, "to_commit_s": 5.0, "step_s_during_write": [1.0]}
    return raw if rep is None else {**raw, "repetition": rep}


def test_one_repetition_derives_as_before():
    res = {
        **BASE,
        "sync": {"blocking_s": 10.0},
        "async_steady_1": _async(0.3),
        "async_steady_2": _async(0.1),
        "async_after_prestage": _async(0.2),
    }
    d = bench.derive(res, 100)
    assert d["sync"] == {"held_s": 10.0, "fraction": 10.0 / 110.0}
    st = d["steady_state"]
    assert st["median_held_s"] == 0.2 and st["saves"] == 3 and st["max_held_s"] == 0.3
    assert "median_held_s_reps" not in st and "repetitions" not in st
    assert d["async_warm"]["held_s"] == 0.2


def test_repetitions_give_medians_with_their_range():
    res = {
        **BASE,
        "sync": {"blocking_s": 10.0, "repetition": 1},
        "sync_2": {"blocking_s": 14.0, "repetition": 2},
        "sync_3": {"blocking_s": 11.0, "repetition": 3},
        # two steady saves per repetition; each repetition's figure is their median (the mean)
        "async_steady_1": _async(0.1, 1),
        "async_steady_2": _async(0.5, 1),
        "async_steady_3": _async(0.2, 2),
        "async_steady_4": _async(0.2, 2),
        "async_steady_5": _async(0.9, 3),
        "async_steady_6": _async(0.3, 3),
        # made after the last repetition: it counts with it
        "async_after_prestage": _async(0.4),
    }
    d = bench.derive(res, 100)
    sync = read_flat(d["sync"], "held_s")
    assert sync.values == (10.0, 14.0, 11.0) and d["sync"]["held_s"] == 11.0
    assert d["sync"]["saves"] == 3 and d["sync"]["fraction"] == pytest.approx(11.0 / 111.0)
    st = d["steady_state"]
    # rep 1: 0.1, 0.5 -> 0.3 (not the upper one, 0.5); rep 3: 0.9, 0.3, 0.4 -> 0.4
    assert st["median_held_s_reps"] == pytest.approx([0.3, 0.2, 0.4])
    assert st["median_held_s"] == pytest.approx(0.3) and st["median_held_s_min"] == 0.2
    assert st["repetitions"] == 3 and st["saves"] == 7 and st["max_held_s"] == 0.9
    assert st["fraction"] == pytest.approx(0.3 / 100.3)
    assert st["met"] is True  # 0.3 s of 100.3
    warm = d["async_warm"]
    assert warm["held_s"] == pytest.approx(0.3)
    assert warm["held_s_reps"] == pytest.approx([0.3, 0.2, 0.4])


@pytest.mark.skipif(
    not (Path(REPORTS_DIR) / "project03_capstone_infra" / "checkpoint_bench.json").is_file(),
    reason="no committed record",
)
def test_the_committed_single_run_record_derives_unchanged():
    rec = json.loads(
        (Path(REPORTS_DIR) / "project03_capstone_infra" / "checkpoint_bench.json").read_text()
    )
    res = rec["results"]
    d = bench.derive(res, rec["config"]["ckpt_interval"])
    assert d["sync"] == res["derived"]["sync"]
    assert d["steady_state"] == res["derived"]["steady_state"]


# test_bench_checkpoint's small run, without the resume phase the repeated figures do not read
SMALL = ["bench-checkpoint", *BENCH_SMALL, "--no-resume"]


@pytest.mark.slow
def test_repeated_phases_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "project03_capstone_infra"
    argv = [*SMALL, "--repeats", "3", "--run-dir", str(tmp_path / "run")]
    assert package_main([*argv, "--reports-dir", str(tmp_path)]) == 0
    res = json.loads((out / "checkpoint_bench.json").read_text())["results"]
    assert res["repeats"]["run"] == 3
    assert res["repeats"]["order"] == [["sync", "async"], ["async", "sync"], ["sync", "async"]]
    assert [res[k]["repetition"] for k in ("sync", "sync_2", "sync_3")] == [1, 2, 3]
    assert [res[f"async_steady_{i}"]["repetition"] for i in (1, 2, 3)] == [1, 2, 3]
    assert "async_cold" in res and "async_steady_4" not in res  # the cold save, once
    d = res["derived"]
    assert len(d["sync"]["held_s_reps"]) == 3 and d["steady_state"]["repetitions"] == 3
    assert d["sync"]["held_s_min"] <= d["sync"]["held_s"] <= d["sync"]["held_s_max"]
    md = (out / "checkpoint_bench.md").read_text()
    assert "| sync, median of 3 (min–max) |" in md and "saves in 3 repetitions" in md
    assert "repetition 3)" in md
    assert "median (min–max) of 3 repetitions" in (out / "summary.md").read_text()

    # a budget already spent: the first repetition runs (without steady saves), no second
    argv = [*SMALL, "--repeats", "3", "--budget-s", "0.001", "--run-dir", str(tmp_path / "r2")]
    assert package_main([*argv, "--reports-dir", str(tmp_path / "b")]) == 0
    rec = json.loads((tmp_path / "b" / out.name / "checkpoint_bench.json").read_text())
    res = rec["results"]
    assert res["repeats"]["run"] == 1 and "stopped after 1 of 3" in res["repeats"]["note"]
    assert "sync_2" not in res and "async_steady_1" not in res
    assert res["derived"]["sync"]["held_s"] == res["sync"]["blocking_s"]


def test_bad_repeats_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--repeats must be an integer >= 0"):
        bench.BenchConfig(preset="tiny", repeats=-1, run_dir=str(tmp_path)).validate()
    assert bench.BenchConfig(preset="tiny").resolved_repeats() == 1  # CPU here; 5 on GPUs
