"""The scaling harness's repetitions with a fake launcher (no torchrun: each "job" writes the
record train.py would, with a throughput chosen per world size and repetition): the jobs run
interleaved, order reversed on alternate repetitions, each repetition its own job and record;
the figures are medians with their range, efficiency is per repetition, only the first
repetition profiles, and the report shows median (min–max). A world size whose job fails stops
there, its completed repetitions standing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project02_fsdp_scaling import report, scaling
from project02_fsdp_scaling.config import TrainConfig
from shared.repeat import read_flat

# tokens/s of each repetition: world size 2 at 0.9, 1.0 and 0.8 of twice the one-device run of
# the same repetition (the ratio of medians would be 2 x 200 / 100 / 2 = 1.0 instead of 0.9)
TPS = {1: [100.0, 200.0, 50.0], 2: [180.0, 400.0, 80.0]}


def _record(ws: int, tps: float, profile: bool) -> dict:
    step = 1000.0 / tps
    return {
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / ws,
        "step_time_s": {"median": step, "p20": 0.9 * step, "p80": 1.1 * step, "n": 2},
        "mfu": None,
        "achieved_tflops_per_device": None,
        "peak_memory_gib": 1.0 + ws,
        "memory_kind": "fake",
        "micro_batch": 8 // ws,
        "grad_accum_steps": 1,
        "compute_dtype": "bfloat16",
        "losses": [10.0, 9.0],
        "gpu": None,
        "profile": {"rank0": None, "trace": f"trace_ws{ws}.json.gz"} if profile else None,
    }


@pytest.fixture
def fake_launch(monkeypatch):
    calls: list[tuple[int, bool]] = []
    fail_at: dict[int, int] = {}  # world size -> the call (1-based) that fails

    def launch(ws, command, flags, *, on_gpu, timeout_s):
        assert command == "train" and not on_gpu
        profile = "--profile" in flags
        calls.append((ws, profile))
        n = sum(1 for w, _ in calls if w == ws)
        if fail_at.get(ws) == n:
            return 1, "boom\n"
        out = Path(flags[flags.index("--out") + 1])
        out.write_text(json.dumps(_record(ws, TPS[ws][n - 1], profile)))
        return 0, ""

    monkeypatch.setattr(scaling, "launch", launch)
    monkeypatch.setattr(scaling.os, "cpu_count", lambda: 2)
    return calls, fail_at


def _run(tmp_path, repeats: int):
    train = TrainConfig(preset="auto", global_batch=0, steps=2, warmup_steps=1, profile=True)
    cfg = scaling.ScalingConfig(
        gpus="1,2", reports_dir=str(tmp_path), train=train, repeats=repeats, readme=False
    )
    return scaling.run(cfg)


def test_repetitions_interleave_and_efficiency_is_per_repetition(tmp_path, fake_launch, capsys):
    calls, _ = fake_launch
    path = _run(tmp_path, 3)
    # interleaved, reversed on the second repetition; each a job of its own; one profile each
    assert calls == [(1, True), (2, True), (2, False), (1, False), (1, False), (2, False)]
    assert "repetition 2 of 3: world size 2" in capsys.readouterr().out
    rec = json.loads(path.read_text())
    res = rec["results"]
    assert res["repeats"] == 3 and rec["config"]["scaling"]["repeats"] == 3
    one, two = res["runs"]
    assert one["tokens_per_s"] == 100.0 and one["tokens_per_s_reps"] == TPS[1]
    assert (one["tokens_per_s_min"], one["tokens_per_s_max"]) == (50.0, 200.0)
    assert two["tokens_per_s"] == 180.0 and two["tokens_per_s_per_device"] == 90.0
    # efficiency per repetition: 180/(2x100), 400/(2x200), 80/(2x50)
    assert two["efficiency_reps"] == pytest.approx([0.9, 1.0, 0.8])
    assert two["efficiency"] == pytest.approx(0.9)
    assert two["speedup"] == pytest.approx(1.8)
    assert read_flat(two, "efficiency").n == 3
    assert one["efficiency_reps"] == [1.0, 1.0, 1.0]
    assert res["baseline"]["tokens_per_s"] == 100.0
    # every repetition's record kept; the first under the name a single run has
    assert one["files"] == [
        "scaling_cpu_ws1.json",
        "scaling_cpu_ws1_rep2.json",
        "scaling_cpu_ws1_rep3.json",
    ]
    for f in (*one["files"], *two["files"]):
        assert (path.parent / f).is_file()
    assert one["trace"] == "trace_ws1.json.gz" and one["step_time_s_reps"] == [10.0, 5.0, 20.0]
    assert one["step_time_p20_s"] == pytest.approx(9.0) and one["peak_memory_gib"] == 2.0
    md = (path.parent / "scaling_cpu.md").read_text()
    assert "| 1 | 100 (50–200) | 100 (50–200) |" in md
    assert "| 90 (80–100) |" in md  # efficiency %, median (min-max)
    assert "10 (5–20), 3 runs of 2 steps" in md
    assert "Each world size ran 3 times" in md
    # the per-repetition records are not taken for scaling records by the folder's renderer
    report.render_all(path.parent)
    assert (path.parent / "scaling_cpu.md").read_text() == md
    assert "median (min–max) of 3 runs" in report.summary_markdown(path.parent)


def test_one_repetition_is_the_record_of_one_run(tmp_path, fake_launch):
    calls, _ = fake_launch
    res = json.loads(_run(tmp_path, 1).read_text())["results"]
    assert calls == [(1, True), (2, True)]
    one, two = res["runs"]
    assert "tokens_per_s_reps" not in one and "efficiency_reps" not in two
    assert two["efficiency"] == pytest.approx(0.9) and one["file"] == "scaling_cpu_ws1.json"
    assert (
        "step time (s), median [p20, p80]"
        in (tmp_path / "project02_fsdp_scaling" / "scaling_cpu.md").read_text()
    )


def test_a_failed_repetition_stops_its_world_size_and_is_reported(tmp_path, fake_launch):
    calls, fail_at = fake_launch
    fail_at[2] = 2
    with pytest.raises(RuntimeError, match=r"world sizes \[2\] failed"):
        _run(tmp_path, 3)
    assert calls == [(1, True), (2, True), (2, False), (1, False), (1, False)]
    rec = json.loads((tmp_path / "project02_fsdp_scaling" / "scaling_cpu.json").read_text())
    one, two = rec["results"]["runs"]
    assert one["tokens_per_s_reps"] == TPS[1] and two["status"] == "ok"
    assert two["failed_repetition"]["repetition"] == 2 and "tokens_per_s_reps" not in two
    assert two["efficiency"] == pytest.approx(0.9)  # its one run against the first of ws1


def test_repeats_default_by_tier_and_bad_values(tmp_path):
    cfg = scaling.ScalingConfig(reports_dir=str(tmp_path))
    assert scaling.make_plan(cfg).repeats == 1  # no GPU here: 1 on CPU, 5 on GPUs
    with pytest.raises(ValueError, match="repeats must be an integer >= 0"):
        scaling.ScalingConfig(repeats=-1).validate()
