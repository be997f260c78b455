"""A careless operator and a second trainer: a run that has checkpointed never silently starts
over, one trainer per run directory (an OS lock released on death), an unwritable checkpoint
directory is found at start, P03_FAULTS acts only with --fault-injection, skipped steps are
bounded and the run ends with a checkpoint, changed --lr / --weight-decay are applied as the log
says, the metrics endpoint binds to loopback, and the launch script exits 75 on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from project03_capstone_infra import runner
from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.checkpoint.compare import compare_states
from project03_capstone_infra.checkpoint.layout import CheckpointError, list_checkpoints
from project03_capstone_infra.checkpoint.lock import RunDirLocked
from project03_capstone_infra.checkpoint.manager import CheckpointManager
from project03_capstone_infra.checkpoint.safe_read import read_full_state
from project03_capstone_infra.checkpoint.verify import verify_checkpoint
from project03_capstone_infra.config import EXIT_PREEMPTED, TrainConfig
from project03_capstone_infra.faults import FAULTS_ENV, read_events
from project03_capstone_infra.train import NonFiniteLossError, lr_multiplier, train
from project03_capstone_infra.train import main as train_main

from .conftest import RUN


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)


@pytest.fixture
def train_log():
    """The trainer's log lines (its logger does not propagate to pytest's capture)."""
    import logging

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("project03.train")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def _cfg(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(run_dir=str(tmp_path), **{**RUN, **kw})


def _events(run_dir, kind):
    return [e for e in read_events(run_dir / "events.jsonl") if e["event"] == kind]


def _steps(root):
    return [int(p.name.split("_")[1]) for p in list_checkpoints(root)]


def _corrupt(step_dir):
    shard = next(step_dir.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-7])


# --- a run that has checkpointed does not start over -----------------------------------------


def test_all_checkpoints_corrupt_never_restarts_from_step_0(tmp_path, capsys):
    first = train(_cfg(tmp_path, steps=6, ckpt_every=3))
    ckpts = tmp_path / "checkpoints"
    for d in list_checkpoints(ckpts):
        _corrupt(d)
    args = ["--run-dir", str(tmp_path), "--steps", "6", "--ckpt-every", "3", "--log-every", "100"]
    capsys.readouterr()
    assert train_main(args) == 1  # every checkpoint fails: quarantined, no fresh start
    assert "no good checkpoint" in capsys.readouterr().err
    assert _steps(ckpts) == [] and len(list((ckpts / "quarantine").iterdir())) == 2
    assert train_main(args) == 1  # the second launch: nothing left, still no fresh start
    err = capsys.readouterr().err
    assert "refusing to start over from step 0" in err and "--resume never" in err
    assert len(_events(tmp_path, "step")) == 6  # only the first run's steps
    again = train(_cfg(tmp_path, steps=6, ckpt_every=3, resume="never"))  # told to
    assert again["step"] == 6 and again["resume"] is None
    assert again["loss"] == first["loss"]  # a fresh start, deterministic


# --- one trainer per run directory ------------------------------------------------------------

_HOLD = """
import sys, time
from project03_capstone_infra.checkpoint.manager import CheckpointManager
CheckpointManager(sys.argv[1])
print("holding", flush=True)
time.sleep(600)
"""


def test_a_second_trainer_is_refused_and_a_killed_one_releases_the_lock(tmp_path):
    root = tmp_path / "checkpoints"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(root)],
        env=runner.child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        in_flight = root / ".tmp-step_00000005-1-2"  # the holder's save being written
        in_flight.mkdir()
        with pytest.raises(RunDirLocked, match=f"in use by another trainer \\(pid {holder.pid} "):
            CheckpointManager(root)
        assert in_flight.is_dir()  # the refused one removed nothing
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
    mgr = CheckpointManager(root)  # the dead holder's lock is gone
    assert not in_flight.exists()  # and its interrupted save is cleaned now
    mgr.close()
    CheckpointManager(root).close()  # re-acquired after close


def test_a_second_trainer_process_gets_a_clear_message(tmp_path):
    args = runner.cli_args(run_dir=str(tmp_path), **{**RUN, "steps": 400, "ckpt_every": 2})
    cmd = [sys.executable, "-m", "project03_capstone_infra.train", *args]
    first = subprocess.Popen(
        cmd,
        cwd=runner.REPO_ROOT,
        env=runner.child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        runner.wait_for_step(tmp_path, 3, first)
        second = subprocess.run(
            cmd,
            cwd=runner.REPO_ROOT,
            env=runner.child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 1, second.stderr[-2000:]
        assert f"in use by another trainer (pid {first.pid} " in second.stderr
        assert "Traceback" not in second.stderr
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == EXIT_PREEMPTED, out[-2000:]
    assert all(verify_checkpoint(d).ok for d in list_checkpoints(tmp_path / "checkpoints"))
    assert {e["pid"] for e in _events(tmp_path, "start")} == {first.pid}  # nothing from the 2nd


# --- an unwritable checkpoint directory is found at start -------------------------------------


def test_a_checkpoint_root_that_is_a_file_is_refused_at_start(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="cannot be made|not a directory"):
        CheckpointManager(tmp_path / "file")
    with pytest.raises(CheckpointError, match="cannot be made"):
        CheckpointManager(tmp_path / "file" / "checkpoints")


def _make_read_only(folder: Path) -> bool:
    """Make `folder` unwritable for this process: mode 0555 for a normal user; for root, which
    writes through mode bits, the immutable attribute (`chattr +i`, which binds root too).
    False when neither is possible here."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return True
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if done.returncode != 0:
        return False
    try:  # the attribute really binds: a write must fail
        (folder / "probe").touch()
    except PermissionError:
        return True
    (folder / "probe").unlink()
    subprocess.run(["chattr", "-i", str(folder)], check=False)
    return False


def test_a_read_only_checkpoint_root_is_refused_at_start(tmp_path, capsys):
    root = tmp_path / "checkpoints"
    root.mkdir()
    try:
        read_only = shutil.which("chattr") is not None or os.geteuid() != 0
        if not (read_only and _make_read_only(root)):
            pytest.skip(
                "running as root without a working chattr: no folder is unwritable here "
                "(the file-in-the-way flavours above and in test_cli_errors still run)"
            )
        with pytest.raises(CheckpointError, match="not writable"):
            CheckpointManager(root)
        with pytest.raises(SystemExit) as exc:  # the command line's one-line error, exit 2
            train_main(["--run-dir", str(tmp_path)])
        assert exc.value.code == 2
        assert "--run-dir: cannot write under" in capsys.readouterr().err
    finally:
        if os.geteuid() == 0 and shutil.which("chattr"):
            subprocess.run(["chattr", "-i", str(root)], capture_output=True, check=False)
        root.chmod(0o755)


# --- P03_FAULTS needs --fault-injection -------------------------------------------------------


def _single_process(run_dir, faults, **flags):
    args = runner.cli_args(run_dir=str(run_dir), **{**RUN, "steps": 6, "ckpt_every": 2, **flags})
    return subprocess.run(
        [sys.executable, "-m", "project03_capstone_infra.train", *args],
        cwd=runner.REPO_ROOT,
        env=runner.child_env(faults),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_leftover_fault_variable_without_the_flag_does_nothing(tmp_path):
    faults = [{"kind": "truncate", "step": 5}, {"kind": "kill", "step": 6}]
    done = _single_process(tmp_path / "off", faults)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "P03_FAULTS is set (2 faults) but --fault-injection is off: ignoring it" in done.stderr
    ckpts = list_checkpoints(tmp_path / "off" / "checkpoints")
    assert [d.name for d in ckpts] == ["step_00000002", "step_00000004", "step_00000006"]
    assert all(verify_checkpoint(d).ok for d in ckpts)
    assert not _events(tmp_path / "off", "fault")
    # With the flag the same variable fires, and says so loudly.
    done = _single_process(tmp_path / "on", faults, fault_injection=True)
    assert done.returncode == -signal.SIGKILL
    assert "FAULT INJECTION IS ON" in done.stderr and "truncate@5(rank 0)" in done.stderr
    assert [e["kind"] for e in _events(tmp_path / "on", "fault")] == ["truncate"]


# --- skipped steps are bounded; the run ends with a checkpoint --------------------------------


def test_a_skipped_final_step_still_ends_with_a_checkpoint_of_the_last_good_state(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(FAULTS_ENV, json.dumps([{"kind": "nan", "step": 6}]))
    out = train(_cfg(tmp_path, steps=6, ckpt_every=5, nan_policy="skip", fault_injection=True))
    assert out["status"] == "completed" and out["skipped_steps"] == 1
    ckpts = tmp_path / "checkpoints"
    assert _steps(ckpts) == [5, 6] and verify_checkpoint(ckpts / "step_00000006").ok
    a, b = read_full_state(ckpts / "step_00000005"), read_full_state(ckpts / "step_00000006")
    assert not compare_states(a, b)  # the weights and moments of step 5: step 6 changed nothing
    assert json.loads(b["extra"])["data"]["step"] == 6  # its batch is consumed
    assert _events(tmp_path, "done")


def test_rollback_without_a_checkpoint_skips_a_bounded_number_of_steps(tmp_path, monkeypatch):
    faults = [{"kind": "nan", "step": s, "times": 100} for s in (1, 2, 3, 4)]
    monkeypatch.setenv(FAULTS_ENV, json.dumps(faults))
    cfg = _cfg(tmp_path, steps=8, ckpt_every=8, max_nan_retries=2, fault_injection=True)
    with pytest.raises(NonFiniteLossError, match="3 consecutive non-finite steps skipped"):
        train(cfg)
    assert [e["step"] for e in _events(tmp_path, "skipped")] == [1, 2]


# --- --lr and --weight-decay on resume are applied, as the log says ---------------------------


def test_changed_lr_and_weight_decay_apply_on_resume(tmp_path, train_log):
    train(_cfg(tmp_path, steps=3, ckpt_every=3))
    train_log.clear()
    cfg = _cfg(tmp_path, steps=6, ckpt_every=3, lr=1e-3, weight_decay=0.0)
    train(cfg)
    err = "\n".join(train_log)
    assert "lr 0.003 -> 0.001" in err and "weight_decay 0.1 -> 0.0" in err and "steps 3 -> 6" in err
    assert "apply from step 4 on" in err
    lrs = {e["step"]: e["lr"] for e in _events(tmp_path, "step")}
    for s in (4, 5, 6):  # the logged rate is the one for the next step: base lr x schedule
        assert lrs[s] == pytest.approx(1e-3 * lr_multiplier(s, cfg), rel=1e-12)
    final = read_full_state(tmp_path / "checkpoints" / "step_00000006")
    groups = final["optim.param_groups"]
    assert all(g["weight_decay"] == 0.0 and g["initial_lr"] == 1e-3 for g in groups)
    (changed,) = _events(tmp_path, "config_changed")
    assert changed["changed"]["lr"] == [3e-3, 1e-3]


def test_an_unchanged_resume_touches_nothing(tmp_path, train_log):
    """The companion: with the same settings nothing is re-applied and the resumed run ends
    bit for bit where the uninterrupted one does."""
    ref = train(_cfg(tmp_path / "ref", steps=6, ckpt_every=3))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(
        tmp_path / "ref" / "checkpoints" / "step_00000003",
        tmp_path / "run" / "checkpoints" / "step_00000003",
    )
    train_log.clear()
    out = train(_cfg(tmp_path / "run", steps=6, ckpt_every=3))
    assert out["resume"]["from_step"] == 3 and any("resume: loaded" in m for m in train_log)
    assert not any("saved with other settings" in m for m in train_log)
    assert out["loss"] == ref["loss"]
    a = read_full_state(tmp_path / "ref" / "checkpoints" / "step_00000006")
    b = read_full_state(tmp_path / "run" / "checkpoints" / "step_00000006")
    assert not compare_states(a, b)


# --- metrics bind to loopback; the launch script exits 75 on SIGTERM --------------------------


def test_metrics_bind_to_loopback_by_default_and_log_the_real_address(capsys):
    from project03_capstone_infra import health

    assert TrainConfig().metrics_addr == "127.0.0.1"
    server = health.MetricsServer(health.TrainingMetrics(gpu=False), port=0)
    try:
        assert server._server.server_address[0] == "127.0.0.1" and server.exposure == ""
    finally:
        server.close()
    wide = health.MetricsServer(health.TrainingMetrics(gpu=False), port=0, addr="0.0.0.0")
    try:
        assert wide.bound == f"0.0.0.0:{wide.port}" and "no authentication" in wide.exposure
        assert wide.url == f"http://127.0.0.1:{wide.port}/metrics"
    finally:
        wide.close()
    args = ["--serve-port", "0", "--serve-seconds", "0", "--serve-addr", "127.0.0.1"]
    package_main(["health", *args])
    err = capsys.readouterr().err
    assert "listening on 127.0.0.1:" in err and "every interface" not in err


@pytest.mark.slow  # a torchrun launch: ~10 s on 2 cores
def test_launch_script_exits_75_on_sigterm(tmp_path):
    script = runner.REPO_ROOT / "project03_capstone_infra" / "launch" / "torchrun_local.sh"
    args = runner.cli_args(run_dir=str(tmp_path), **{**RUN, "steps": 400, "ckpt_every": 100})
    env = {**runner.child_env(), "PYTHON": sys.executable, "MAX_RESTARTS": "0"}
    proc = subprocess.Popen(
        ["bash", str(script), "2", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        runner.wait_for_step(tmp_path, 2, proc)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # to the script, as a scheduler would
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == EXIT_PREEMPTED, out[-3000:]
    (pre,) = _events(tmp_path, "preempted")[-1:]
    assert verify_checkpoint(tmp_path / "checkpoints" / f"step_{pre['step']:08d}").ok
