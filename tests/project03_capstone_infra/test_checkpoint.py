"""CheckpointManager in one process (no process group): commit protocol, manifest, retention,
verification and fallback, async save, RNG round trip, and the checkpoint command line."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.checkpoint.layout import (
    MANIFEST,
    CheckpointError,
    list_checkpoints,
    read_latest,
)
from project03_capstone_infra.checkpoint.manager import CheckpointManager
from project03_capstone_infra.checkpoint.retention import retained_steps
from project03_capstone_infra.checkpoint.verify import verify_checkpoint


def _model_and_opt(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _train(model, opt, n=1):
    for _ in range(n):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def _state(model, opt):
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _steps(root):
    return [int(p.name.split("_")[1]) for p in list_checkpoints(root)]


def test_retention_policy_is_exact():
    assert retained_steps(range(1, 13), keep_last=2, milestone_every=5) == {5, 10, 11, 12}
    assert retained_steps([100, 200, 300, 400], keep_last=1, milestone_every=0) == {400}
    assert retained_steps([], keep_last=3) == set()
    assert retained_steps([3, 6], keep_last=5, milestone_every=4) == {3, 6}
    with pytest.raises(ValueError, match="keep_last"):
        retained_steps([1], keep_last=0)
    with pytest.raises(ValueError, match="milestone_every"):
        retained_steps([1], keep_last=1, milestone_every=-1)


def test_save_commits_atomically_with_manifest_and_latest(tmp_path):
    model, opt = _model_and_opt()
    _train(model, opt)
    mgr = CheckpointManager(
        tmp_path, config_hash="abc123", config={"lr": 1e-2}, git_commit="deadbeef"
    )
    stats = mgr.save(7, _state(model, opt), {"step": 7, "data": {"step": 7}})
    assert stats.mode == "sync" and stats.bytes > 0 and stats.blocking_s > 0
    d = tmp_path / "step_00000007"
    assert read_latest(tmp_path) == "step_00000007"
    assert not list(tmp_path.glob(".tmp-*"))  # the temporary directory was renamed
    m = json.loads((d / MANIFEST).read_text())
    assert m["step"] == 7 and m["world_size"] == 1 and m["config_hash"] == "abc123"
    assert m["git_commit"] == "deadbeef" and m["config"] == {"lr": 1e-2} and m["time"]
    on_disk = {p.name for p in d.iterdir()} - {MANIFEST}
    assert set(m["files"]) == on_disk and ".metadata" in on_disk
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in m["files"].values())
    assert verify_checkpoint(d).ok


def test_round_trip_restores_model_optimizer_extra_and_rng(tmp_path):
    model, opt = _model_and_opt()
    _train(model, opt, 3)
    mgr = CheckpointManager(tmp_path)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    mgr.save(3, _state(model, opt), {"step": 3, "note": "x"})
    expected_rng = (random.random(), np.random.rand(), torch.rand(1).item())
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model, opt, 2)  # move away from the saved state

    model2, opt2 = _model_and_opt(seed=99)
    state = _state(model2, opt2)
    res = mgr.load(state)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert res.step == 3 and res.extra == {"step": 3, "note": "x"} and res.skipped == []
    for k, v in model2.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected_rng
    # Both continue identically from the restored state.
    model3, opt3 = _model_and_opt(seed=5)
    st3 = _state(model3, opt3)
    CheckpointManager(tmp_path).load(st3)
    set_state_dict(model3, opt3, model_state_dict=st3["model"], optim_state_dict=st3["optim"])
    torch.manual_seed(0)
    _train(model2, opt2)
    torch.manual_seed(0)
    _train(model3, opt3)
    for (k, a), b in zip(model2.state_dict().items(), model3.state_dict().values()):
        assert torch.equal(a, b), k


def test_retention_keeps_exactly_last_k_plus_milestones(tmp_path):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(tmp_path, keep_last=2, milestone_every=5)
    for step in range(1, 13):
        mgr.save(step, _state(model, opt), {"step": step})
    assert _steps(tmp_path) == [5, 10, 11, 12]
    assert read_latest(tmp_path) == "step_00000012"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_damaged_newest_is_skipped_quarantined_and_explained(tmp_path, damage):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(tmp_path, keep_last=5)
    for step in (1, 2):
        _train(model, opt)
        mgr.save(step, _state(model, opt), {"step": step})
    newest = tmp_path / "step_00000002"
    shard = next(newest.glob("*.distcp"))
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit
        shard.write_bytes(bytes(data))
        why = "sha256"
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-100])
        why = "truncated"
    elif damage == "delete":
        shard.unlink()
        why = "missing"
    else:
        (newest / MANIFEST).write_text("{not json")
        why = "not valid JSON"
    assert not verify_checkpoint(newest).ok
    model2, opt2 = _model_and_opt(seed=3)
    res = CheckpointManager(tmp_path).load(_state(model2, opt2))
    assert res.step == 1
    ((name, reason),) = res.skipped
    assert name == "step_00000002" and why in reason
    assert _steps(tmp_path) == [1]
    (q,) = (tmp_path / "quarantine").iterdir()
    assert q.name.startswith("step_00000002") and why in (q / "QUARANTINE_REASON.txt").read_text()


def test_no_good_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(model, opt), {"step": 1})
    shard = next((tmp_path / "step_00000001").glob("*.distcp"))
    shard.write_bytes(b"")
    with pytest.raises(CheckpointError, match="no good checkpoint"):
        mgr.load(_state(model, opt))
    assert CheckpointManager(tmp_path / "empty").load(_state(model, opt)) is None


def test_interrupted_save_is_never_loaded_and_is_cleaned(tmp_path):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(model, opt), {"step": 1})
    # A crash mid-save leaves only a temporary directory (no step_* name, no manifest).
    partial = tmp_path / ".tmp-step_00000002-123-456"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"half a shard")
    assert _steps(tmp_path) == [1]
    res = CheckpointManager(tmp_path).load(_state(model, opt))  # a new run starts
    assert res.step == 1
    assert not partial.exists()


def test_async_save_commits_in_background_and_loads(tmp_path):
    model, opt = _model_and_opt()
    _train(model, opt)
    mgr = CheckpointManager(tmp_path)
    stats = mgr.save(5, _state(model, opt), {"step": 5}, mode="async")
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    mgr.wait_staging()
    _train(model, opt)  # training goes on while the write finishes
    done = mgr.wait()
    assert done is stats and stats.total_s >= stats.blocking_s > 0 and stats.bytes > 0
    assert verify_checkpoint(tmp_path / "step_00000005").ok
    model2, opt2 = _model_and_opt(seed=4)
    state = _state(model2, opt2)
    mgr.load(state)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for k, v in model2.state_dict().items():
        assert torch.equal(v, expected[k]), k  # the state at save time, not after
    mgr.close()
    with pytest.raises(ValueError, match="mode"):
        mgr.save(6, _state(model, opt), mode="later")


def test_checkpoint_cli_list_verify_prune_compare(tmp_path, capsys):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(tmp_path, keep_last=10)
    for step in range(1, 7):
        mgr.save(step, _state(model, opt), {"step": step})
    _train(model, opt)
    mgr.save(7, _state(model, opt), {"step": 7})
    root = str(tmp_path)
    assert package_main(["checkpoint", "list", root]) == 0
    assert "<-" in capsys.readouterr().out
    assert package_main(["checkpoint", "verify", root]) == 0
    assert (
        package_main(["checkpoint", "compare", f"{root}/step_00000005", f"{root}/step_00000006"])
        == 0
    )
    assert "bitwise identical" in capsys.readouterr().out
    assert (
        package_main(["checkpoint", "compare", f"{root}/step_00000006", f"{root}/step_00000007"])
        == 1
    )
    shard = next((tmp_path / "step_00000003").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    assert package_main(["checkpoint", "verify", root]) == 1
    assert "step_00000003: FAILED" in capsys.readouterr().out
    assert (
        package_main(
            ["checkpoint", "prune", root, "--keep-last", "2", "--milestone-every", "3", "--dry-run"]
        )
        == 0
    )
    assert _steps(tmp_path) == list(range(1, 8))
    assert (
        package_main(["checkpoint", "prune", root, "--keep-last", "2", "--milestone-every", "3"])
        == 0
    )
    assert _steps(tmp_path) == [3, 6, 7]


def test_a_failed_async_save_degrades_to_sync_saves(tmp_path, monkeypatch):
    """An async save whose write fails is not committed; the next save says so and is
    synchronous, and so is every later one, so training keeps its checkpoints."""
    import concurrent.futures

    import torch.distributed.checkpoint as dcp

    calls = []

    def failing_async_save(*args, **kwargs):
        calls.append(1)
        fut = concurrent.futures.Future()
        fut.set_exception(RuntimeError("staging blew up"))
        return fut

    monkeypatch.setattr(dcp, "async_save", failing_async_save)
    warnings = []
    model, opt = _model_and_opt()
    mgr = CheckpointManager(tmp_path, keep_last=5, warn=warnings.append, async_staging=False)
    mgr.save(1, _state(model, opt), {"step": 1}, mode="async")
    _train(model, opt)
    stats = mgr.save(2, _state(model, opt), {"step": 2}, mode="async")
    assert stats.mode == "sync" and mgr.async_disabled
    assert len(warnings) == 1 and "staging blew up" in warnings[0]
    mgr.save(3, _state(model, opt), {"step": 3}, mode="async")
    mgr.wait()
    assert len(calls) == 1  # the later async requests never reached async_save
    assert _steps(tmp_path) == [2, 3]  # step 1 was never committed
    assert read_latest(tmp_path) == "step_00000003"
    mgr.close()
