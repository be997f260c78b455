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
