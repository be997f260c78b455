"""The chaos tool's plan and its accounting, on synthetic event logs (the real faults are
exercised by test_fault_tolerance.py; the whole demonstration by `make project03`)."""

from __future__ import annotations

import pytest

from project03_capstone_infra.chaos import ChaosConfig, fault_table, plan_faults
from project03_capstone_infra.faults import parse_faults


@pytest.mark.parametrize("seed", range(20))
def test_plan_puts_every_fault_where_its_attempt_reaches_it(seed):
    cfg = ChaosConfig(seed=seed)
    faults, sigterm = plan_faults(cfg, nproc=2)
    parse_faults(__import__("json").dumps(faults))  # valid for the trainer
    steps = [f["step"] for f in faults]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[0] > cfg.ckpt_every and sigterm > steps[-1] and sigterm < cfg.steps
    assert [f["attempt"] for f in faults] == [0, 1, 1, 2, 3]
    assert all(0 <= f["rank"] < 2 for f in faults)
    # the truncated/flipped checkpoint exists: a checkpoint step lies between them and the
    # previous fault
    for prev, f in zip(faults, faults[1:]):
        if f["kind"] in ("truncate", "flip"):
            assert f["step"] - prev["step"] > cfg.ckpt_every


def test_plan_on_one_rank_replaces_the_hang():
    faults, _ = plan_faults(ChaosConfig(), nproc=1)
    assert "hang" not in {f["kind"] for f in faults} and all(f["rank"] == 0 for f in faults)
    with pytest.raises(ValueError, match="steps"):
        plan_faults(ChaosConfig(steps=20, ckpt_every=5), nproc=2)


def _ev(t, event, **kw):
    return {"t": t, "event": event, "rank": kw.pop("rank", 0), "attempt": 0, **kw}


def test_fault_table_counts_steps_lost_and_recovery_time():
    events = [
        _ev(0.0, "start"),
        *[_ev(1.0 + s, "step", step=s, loss=1.0) for s in range(1, 8)],
        _ev(8.5, "fault", kind="kill", step=8, rank=1, detail=""),
        _ev(12.0, "resume", from_step=5, skipped=[]),
        *[_ev(12.0 + s, "step", step=s, loss=1.0) for s in range(6, 9)],
        _ev(21.0, "fault", kind="truncate", step=9, rank=0, detail="truncated x"),
        _ev(25.0, "resume", from_step=5, skipped=[["step_00000008", "truncated"]]),
        _ev(26.0, "step", step=6, loss=1.0),
        _ev(27.0, "step", step=7, loss=1.0),
        _ev(28.0, "step", step=8, loss=1.0),
        _ev(30.0, "preempted", step=8, save_s=0.4),
        _ev(40.0, "resume", from_step=8, skipped=[]),
        _ev(41.0, "step", step=9, loss=1.0),
    ]
    rows = fault_table(events, sigterm_sent_t=29.0)
    kill, trunc, term = rows
    assert (kill["fault"], kill["at_step"], kill["resumed_from"], kill["steps_lost"]) == (
        "kill",
        7,
        5,
        2,
    )
    assert kill["to_first_new_step_s"] == pytest.approx(18.0 - 8.5)  # step 6 after the resume
    assert kill["to_caught_up_s"] == pytest.approx(19.0 - 8.5)  # back at step 7
    assert (trunc["steps_lost"], trunc["skipped"]) == (3, "step_00000008: truncated")
    assert (term["fault"], term["steps_lost"], term["resumed_from"]) == ("sigterm", 0, 8)
    assert term["to_first_new_step_s"] == pytest.approx(41.0 - 29.0)


def test_the_faulted_run_says_which_fault_it_is_in():
    from project03_capstone_infra.chaos import _fault_status, _steps_done

    faults = [
        {"kind": "kill", "step": 7, "rank": 1, "attempt": 0},
        {"kind": "nan", "step": 12, "rank": 0, "attempt": 1},
    ]
    events = [{"event": "start", "attempt": 0, "rank": 0}, {"event": "step", "step": 6, "rank": 0}]
    assert _fault_status(events, faults, 30) == "attempt 0; next: kill @ step 7"
    events += [
        {"event": "fault", "kind": "kill", "step": 7, "rank": 1},
        {"event": "start", "attempt": 1, "rank": 0},
        {"event": "step", "step": 5, "rank": 0},
    ]
    assert _fault_status(events, faults, 30) == (
        "attempt 1; last fault: kill @ step 7 (rank 1); next: nan @ step 12"
    )
    assert _steps_done(events) == 6  # the furthest step reached, replays included
    events.append({"event": "fault", "kind": "nan", "step": 12, "rank": 0})
    assert _fault_status(events, faults, 30).endswith("next: SIGTERM after step 30")


# A faulted run's timeline as the record holds it: (seconds, step) of rank 0's steps and the
# fault marks. Shaped on a 2-GPU run: kill before step 10 (resumed at 6), NaN before 15 (rolled
# back to 11; its mark stamped a millisecond before rank 0 logged step 14), a hang before 17,
# then a launch that ended after step 25 with no fault (resumed at 21), so the truncation planned
# for that launch at step 26 never fired; the flip before 37 and the SIGTERM after 42 did.
_PLAN = [
    {"kind": "kill", "step": 10, "rank": 1, "attempt": 0},
    {"kind": "nan", "step": 15, "rank": 1, "attempt": 1},
    {"kind": "hang", "step": 17, "rank": 1, "attempt": 1},
    {"kind": "truncate", "step": 26, "rank": 1, "attempt": 2},
    {"kind": "flip", "step": 37, "rank": 0, "attempt": 3},
]


def _timeline(segments, marks):
    pts = [[t0 + 0.01 * i, s] for t0, (a, b) in segments for i, s in enumerate(range(a, b + 1))]
    return {"faulted": pts, "faults": [{"t": t, "kind": k, "step": s} for t, k, s in marks]}


_SEGMENTS = [(0.0, (1, 9)), (18.0, (6, 14)), (18.5, (11, 16)), (45.0, (16, 25)), (64.0, (21, 36))]
_SEGMENTS += [(83.0, (31, 44)), (95.0, (45, 60))]
_MARKS = [(0.085, "kill", 10), (18.079, "nan", 15), (18.555, "hang", 17), (64.16, "flip", 37)]
_MARKS += [(83.2, "sigterm", 42)]


def test_coverage_names_a_fault_that_never_fired_and_the_restart_nobody_planned():
    from project03_capstone_infra.report.chaos import coverage

    cov = coverage(_PLAN, _timeline(_SEGMENTS, _MARKS))
    assert cov["faults_not_fired"] == [{"kind": "truncate", "step": 26, "rank": 1, "attempt": 2}]
    [u] = cov["unexplained_restarts"]
    assert (u["after_step"], u["resumed_at_step"]) == (25, 21)
    assert u["t_resumed"] == 64.0


def test_coverage_of_a_run_that_went_through_every_fault_is_clean():
    from project03_capstone_infra.report.chaos import coverage

    # the same run where the launch after the hang reached step 26 and truncation ended it there
    segments = [*_SEGMENTS[:3], (45.0, (16, 25)), (64.0, (21, 36)), (83.0, (31, 44))]
    segments.append((95.0, (45, 60)))
    marks = sorted([*_MARKS, (45.105, "truncate", 26)])
    cov = coverage(_PLAN, _timeline(segments, marks))
    assert cov == {"faults_not_fired": [], "unexplained_restarts": []}


def test_the_summary_lists_the_faults_the_run_went_through_not_the_plan(tmp_path):
    import json

    from project03_capstone_infra.report.summary import _chaos_summary

    def record(marks):
        rows = [{"fault": k, "steps_lost": 1, "to_first_new_step_s": 1.0} for _, k, _ in marks]
        return {
            "environment": {"date": "2026-12-04T00:00:00+00:00"},
            "config": {"preset": "tiny", "nproc": 2, "steps": 60, "fault_plan": _PLAN},
            "results": {
                "identical": True,
                "faults": rows,
                "tensors_compared": 69,
                "loss_curves_equal": True,
                "timeline": _timeline(_SEGMENTS, marks),
            },
        }

    (tmp_path / "chaos_gpu.json").write_text(json.dumps(record(_MARKS)))
    text = "\n".join(_chaos_summary(tmp_path, "chaos_gpu"))
    assert "after kill -9, NaN, a hung rank, a bit-flipped checkpoint and a SIGTERM," in text
    assert "Planned but never fired: a truncated checkpoint (step 26)" in text


def test_every_rank_lets_its_save_land_before_a_peer_damages_a_checkpoint(tmp_path):
    """The commit of an async save needs every rank's background thread; a truncating rank that
    waited for it alone while its peer ran on into the next step's collectives waited until the
    NCCL watchdog ended the peer (two H200s). So the other ranks flush at that step too, and only
    the faulty rank damages and dies (were rank 0 to fire, this test process would be killed)."""
    from project03_capstone_infra.faults import EventLog, FaultInjector

    plan = parse_faults(
        '[{"kind": "truncate", "step": 26, "rank": 1, "attempt": 2},'
        ' {"kind": "flip", "step": 37, "rank": 1, "attempt": 3},'
        ' {"kind": "truncate", "after": 3, "rank": 1}]'
    )
    flushed = []
    inj = FaultInjector(
        plan,
        rank=0,
        attempt=2,
        events=EventLog(None, rank=0, attempt=2),
        ckpt_root=tmp_path,
        flush=lambda: flushed.append(step),
    )
    for step in range(21, 40):
        assert inj.at_step(step) is False
    # step 26 (this attempt's truncation) and the 4th step of the attempt (24, "after 3");
    # not the flip planned for attempt 3, and each only once
    assert flushed == [24, 26]
    assert not any(tmp_path.iterdir())  # nothing damaged by rank 0
