"""Launching the trainer under torchrun from Python, and reading a run back.

Used by the chaos demonstration and the tests: real processes (torchrun's elastic agent, which
restarts the worker group after a failure, up to --max-restarts), real signals, real files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from .checkpoint.layout import list_checkpoints
from .faults import FAULTS_ENV, read_events

REPO_ROOT = Path(__file__).resolve().parent.parent


def cli_args(**overrides) -> list[str]:
    """TrainConfig overrides as command-line flags (tyro spelling: --ckpt-every 3)."""
    out = []
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


def torchrun_cmd(nproc: int, train_args: list[str], *, max_restarts: int = 0) -> list[str]:
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.1",
        "-m",
        "project03_capstone_infra.train",
        *train_args,
    ]


# NCCL's watchdog, on a collective past the process-group timeout: tear the process down (3,
# PyTorch's default; 0 would leave a hung peer waiting forever) after a pause for its flight
# recorder to dump traces, which is 4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: a minute at the
# default 15 s, 4 s here. Defaults only: a value in the caller's environment wins.
NCCL_FAILURE_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "1000",
}


def child_env(
    faults: list[dict] | None = None, extra: dict | None = None, *, deterministic: bool = False
) -> dict:
    """The environment of torchrun and its workers: this process's, plus the repository on
    PYTHONPATH, the fault plan (`faults`), NCCL's failure handling (`NCCL_FAILURE_ENV`), with
    `deterministic` the variables of `shared.determinism.deterministic_env()` (they override
    the caller's: a worker must start with them), and `extra` last."""
    import json

    from shared.determinism import deterministic_env

    env = dict(os.environ)
    # a launcher sets a worker's rank and rendezvous (torchrun does); inherited ones would make a
    # one-process run join a world that is not there, on a port that may be taken by now
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # small CPU runs: threads only contend
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in NCCL_FAILURE_ENV.items():
        env.setdefault(name, value)
    if deterministic:
        env.update(deterministic_env())
    env.pop(FAULTS_ENV, None)
    if faults:
        env[FAULTS_ENV] = json.dumps(faults)
    env.update(extra or {})
    return env


_STARTED: list[subprocess.Popen] = []  # every torchrun job `start` made, for `stop_started`


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL a torchrun job started by `start`, its workers included, and reap it.

    The job runs in a session of its own (so that a signal reaches only it), and torchrun in
    turn starts every worker in a session of its own: a signal to torchrun's process group
    never reaches them, and a SIGKILLed torchrun cannot pass one on, so its workers would run
    on, orphaned. torchrun is first stopped (SIGSTOP: it starts no worker while they are
    listed), its descendants are listed, then all are killed."""
    import psutil

    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGSTOP)
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in below:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait()


def stop_started() -> None:
    """SIGKILL every torchrun job this process started that still runs, workers included
    (`kill_job`): they would outlive us."""
    for proc in _STARTED:
        if proc.poll() is None:
            kill_job(proc)
    _STARTED.clear()


@contextmanager
def jobs_end_with_this_process():
    """For the demos' entry points: SIGTERM to this process (a `timeout`, a scheduler) first
    ends the torchrun jobs it started, then exits 143; leaving the block by any road stops
    those still running. The handler is installed on the main thread only."""
    old = None
    if threading.current_thread() is threading.main_thread():

        def on_term(signum, frame):
            stop_started()
            raise SystemExit(128 + signum)

        old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        stop_started()
        if old is not None:
            signal.signal(signal.SIGTERM, old)


@dataclass
class Finished:
    returncode: int
    seconds: float
    output: str


def start(
    run_dir: str | Path,
    *,
    nproc: int = 2,
    max_restarts: int = 0,
    faults: list[dict] | None = None,
    env: dict | None = None,
    **overrides,
) -> subprocess.Popen:
    """Start torchrun on the trainer (its own process group, so a signal reaches only it).
    `faults` are injected: they go into P03_FAULTS together with --fault-injection.
    `deterministic=True` among the overrides also puts deterministic mode's variables into
    the workers' environment (`child_env`)."""
    if faults:
        overrides.setdefault("fault_injection", True)
    args = cli_args(run_dir=str(run_dir), **overrides)
    proc = subprocess.Popen(
        torchrun_cmd(nproc, args, max_restarts=max_restarts),
        cwd=REPO_ROOT,
        env=child_env(faults, env, deterministic=bool(overrides.get("deterministic"))),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _STARTED[:] = [p for p in _STARTED if p.poll() is None] + [proc]
    return proc


def finish(proc: subprocess.Popen, t0: float, timeout: float) -> Finished:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc)
        out, _ = proc.communicate()
        raise TimeoutError(
            f"torchrun did not finish within {timeout:.0f} s; output:\n{out[-4000:]}"
        ) from None
    return Finished(proc.returncode, time.time() - t0, out)


def launch(run_dir: str | Path, *, timeout: float = 300, **kwargs) -> Finished:
    """Run torchrun to completion (see `start` for the arguments)."""
    t0 = time.time()
    return finish(start(run_dir, **kwargs), t0, timeout)


def wait_for_step(
    run_dir: str | Path, step: int, proc: subprocess.Popen, timeout: float = 120
) -> None:
    """Poll the event log until rank 0 reports `step` done (or the run ends)."""
    deadline = time.time() + timeout
    events = Path(run_dir) / "events.jsonl"
    while time.time() < deadline:
        if any(e["event"] == "step" and e["step"] >= step for e in read_events(events)):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (rc {proc.returncode}) before step {step}")
        time.sleep(0.05)
    raise TimeoutError(f"step {step} not reached within {timeout:.0f} s")


def loss_curve(run_dir: str | Path) -> dict[int, float]:
    """step -> loss of the run's final trajectory (a replayed step keeps its last value)."""
    curve: dict[int, float] = {}
    for e in read_events(Path(run_dir) / "events.jsonl"):
        if e["event"] == "step":
            curve[e["step"]] = e["loss"]
    return dict(sorted(curve.items()))


def replay_mismatches(run_dir: str | Path) -> list[str]:
    """Steps run more than once (after a resume or rollback) whose losses differ: should be none."""
    seen: dict[int, float] = {}
    bad = []
    for e in read_events(Path(run_dir) / "events.jsonl"):
        if e["event"] != "step":
            continue
        s, loss = e["step"], e["loss"]
        if s in seen and seen[s] != loss:
            bad.append(f"step {s}: {seen[s]!r} then {loss!r}")
        seen[s] = loss
    return bad


def final_checkpoint(run_dir: str | Path) -> Path:
    dirs = list_checkpoints(Path(run_dir) / "checkpoints")
    if not dirs:
        raise FileNotFoundError(f"no checkpoint under {run_dir}/checkpoints")
    return dirs[-1]


def log(tag: str, msg: str) -> None:
    """A demo's progress line on stderr: `[tag HH:MM:SS] msg`."""
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
