"""The Tune driver is killed (SIGKILL) mid-experiment; `--resume` (Tuner.restore) in a fresh
process finishes the experiment without re-running the trials that had finished, and the
interrupted trials continue from their checkpoints. A further `--resume-if-exists` run (what a
platform's driver retry does) changes nothing."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray Tune is not installed (pip install 'ray[tune]')")

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 16


def _checkpoint_step(run: dict) -> int:
    """Step of the newest checkpoint the snapshot's checkpoint manager holds (0: none yet), only
    if its files are on disk: that is what a restore of this snapshot resumes the trial from."""
    blob = (run.get("checkpoint_manager") or {}).get("value")
    if not blob:
        return 0
    try:
        latest = pickle.loads(bytes.fromhex(blob)).latest_checkpoint_result
    except Exception:  # a format this test does not know: treat as no checkpoint
        return 0
    if latest is None or not Path(latest.checkpoint.path).is_dir():
        return 0
    return int(latest.metrics.get("step", 0))


def _tune_state(exp: Path) -> dict[str, tuple[str, int, int]] | None:
    """{trial directory name: (status, step of its last result, step of its newest checkpoint)}
    from Tune's newest experiment-state snapshot: what a restore will start from."""
    snaps = sorted(exp.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not snaps:
        return None
    try:
        state = json.loads(snaps[-1].read_text())
        trials = [(json.loads(t[0]), json.loads(t[1])) for t in state["trial_data"]]
    except (json.JSONDecodeError, KeyError, OSError, IndexError):
        return None  # caught mid-write: look again
    return {
        Path(t["relative_logdir"]).name: (
            t["status"],
            int((run.get("last_result") or {}).get("step", 0)),
            _checkpoint_step(run),
        )
        for t, run in trials
    }


def _rows(trial_dir: Path) -> list[dict]:
    path = trial_dir / "result.json"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            out.append(json.loads(line))
    return out


@pytest.mark.slow
def test_driver_killed_mid_experiment_then_restored(tmp_path):
    storage = tmp_path / "tune"
    exp = storage / "restore"
    argv = [
        sys.executable,
        "-m",
        "project03_capstone_infra.tune",
        "--preset",
        "tiny",
        "--num-samples",
        "4",
        "--max-steps",
        str(MAX_STEPS),
        "--ckpt-every",
        "2",
        "--scheduler",
        "fifo",
        "--max-concurrent",
        "2",
        "--num-cpus",
        "2",
        "--object-store-mb",
        "128",
        "--storage-path",
        str(storage),
        "--name",
        "restore",
        "--no-compare-random",
        "--no-report",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        # Tune snapshots its experiment state every 10 s by default, longer than this whole
        # experiment can take on a fast machine: the window the test waits for (one trial done,
        # another running with a checkpoint) was then never in a snapshot.
        "TUNE_GLOBAL_CHECKPOINT_S": "0.5",
    }
    with open(tmp_path / "driver1.log", "w") as log:
        driver = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finished: dict[str, bytes] = {}
    try:
        deadline = time.monotonic() + 300
        while True:
            assert time.monotonic() < deadline, "no trial finished within 300 s"
            assert driver.poll() is None, (tmp_path / "driver1.log").read_text()[-3000:]
            state = _tune_state(exp) or {}
            done = [n for n, (status, _, _) in state.items() if status == "TERMINATED"]
            # A running trial whose checkpoint the snapshot already holds (the step alone is not
            # enough: a snapshot can record a result before the checkpoint that goes with it).
            running_ckpt = [
                n
                for n, (status, step, ckpt) in state.items()
                if status == "RUNNING" and ckpt > 0 and step < MAX_STEPS
            ]
            if done and running_ckpt:
                finished = {n: (exp / n / "result.json").read_bytes() for n in done}
                break
            time.sleep(0.3)
    finally:
        with contextlib.suppress(ProcessLookupError):  # already gone: keep the real failure
            os.killpg(driver.pid, signal.SIGKILL)  # the driver and every process it started
        driver.wait(timeout=60)
    assert 1 <= len(finished) < 4, (finished.keys(), (tmp_path / "driver1.log").read_text()[-3000:])

    restored = subprocess.run(
        argv + ["--resume"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        start_new_session=True,
    )
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-3000:]
    summary = json.loads((exp / "summary.json").read_text())
    assert len(summary["trials"]) == 4
    assert all(
        t["status"] == "completed" and t["last_step"] == MAX_STEPS for t in summary["trials"]
    )
    # finished trials were not run again: their results are byte for byte what they were
    for name, blob in finished.items():
        assert (exp / name / "result.json").read_bytes() == blob, f"{name} was re-run"
    # an interrupted trial resumed from its Tune checkpoint and replayed identically
    resumed = []
    for trial_dir in (p for p in exp.iterdir() if p.is_dir() and p.name not in finished):
        rows = _rows(trial_dir)
        later = [r for r in rows if r.get("restored_from_step", -1) > 0]
        if later:
            resumed.append(trial_dir.name)
            first = {r["step"]: r["loss"] for r in rows if r["attempt"] == 0}
            for r in later:
                if r["step"] in first:
                    assert r["loss"] == first[r["step"]]
            assert max(r["step"] for r in later) == MAX_STEPS
    assert resumed, "no interrupted trial resumed from a checkpoint"

    # A platform retry of the driver (KubeRay backoffLimit, Slurm requeue) runs the same command
    # with --resume-if-exists: on a finished experiment it trains nothing.
    before = {p.name: (p / "result.json").read_bytes() for p in exp.iterdir() if p.is_dir()}
    again = subprocess.run(
        argv + ["--resume-if-exists"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    after = {p.name: (p / "result.json").read_bytes() for p in exp.iterdir() if p.is_dir()}
    assert after == before
