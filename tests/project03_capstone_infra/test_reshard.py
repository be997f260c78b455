"""The resharding demonstration on CPU (2 gloo ranks -> 1, tiny model): bitwise where the world
size does not change, continuous across the change, and a record and chart from it."""

from __future__ import annotations

import json

import pytest

from project03_capstone_infra import runner
from project03_capstone_infra.reshard import TOLERANCE, ReshardConfig, compare_direction, run

from .test_fault_tolerance import REL_LOSS


@pytest.mark.slow  # three torchrun launches: ~20 s on 2 cores
def test_two_ranks_to_one_is_bitwise_before_and_continuous_after(tmp_path):
    # 12 steps, the world changes after step 6: the situation test_fault_tolerance's REL_LOSS
    # is derived for (the 1-rank run takes the 2-rank state at step 6, 6 steps to go).
    cfg = ReshardConfig(
        directions=("2-1",),
        steps=12,
        switch_after=6,
        workdir=str(tmp_path / "w"),
        reports_dir=str(tmp_path / "r"),
    )
    res = run(cfg)
    (d,) = res["directions"]
    assert (d["from_world"], d["to_world"]) == (2, 1)
    assert d["losses_before_bitwise"] and d["state_at_switch_bitwise"], d["state_differences"]
    assert d["resumed_from"] == 6 and d["saved_world_size"] == 2
    first = d["first_after"]
    assert first["step"] == 7 and first["tolerance"] == TOLERANCE["float32"] and first["ok"]
    assert d["max_rel_diff_after"] < REL_LOSS
    assert sorted(int(s) for s in d["curve"]) == list(range(1, 13))
    assert res["continuous"] and res["bitwise_before_switch"] and res["deterministic"] is False
    out = tmp_path / "r" / "project03_capstone_infra"
    rec = json.loads((out / "reshard.json").read_text())
    assert rec["results"]["directions"][0]["first_after"]["ok"] and rec["environment"]["torch"]
    assert (out / "reshard.png").stat().st_size > 10_000
    assert "Resharding" in (out / "summary.md").read_text()

    # The comparison is not vacuous: against a reference of another seed, nothing matches.
    other = tmp_path / "w" / "other"
    done = runner.launch(
        other, nproc=2, preset="tiny", steps=12, ckpt_every=6, milestone_every=6, seed=1
    )
    assert done.returncode == 0, done.output[-2000:]
    bad = compare_direction(other, tmp_path / "w" / "2_to_1", 6, TOLERANCE["float32"])
    assert not bad["losses_before_bitwise"] and not bad["state_at_switch_bitwise"]
    assert not bad["first_after"]["ok"]
