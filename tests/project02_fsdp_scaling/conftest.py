"""Helpers for project02's tests: torchrun jobs of the package's entry points on CPU (gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_torchrun(nproc: int, module: str, *args: str, timeout: float = 300) -> str:
    """Run `torchrun --standalone --nproc-per-node nproc -m module args` on CPU; return its
    output, failing the test with the output when the job fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU tier: gloo, even on a GPU machine
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd = [*torchrun, "--nproc-per-node", str(nproc), "-m", module, *args]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd[2:])} exited {proc.returncode}:\n{out[-4000:]}")
    return out


@pytest.fixture
def torchrun():
    return run_torchrun


def run_ranks(nproc: int, module: str, *args: str, timeout: float = 300, gpu: bool = False) -> None:
    """Start `nproc` CPU processes of `python -m module args` as one gloo world, the variables
    torchrun would set given directly (no launcher process: a second saved per import of
    torch); `gpu`: one GPU per rank, else the CPU; fail the test with their output when one fails or the world outlives `timeout`."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU tier: gloo, even on a GPU machine
    env.update(
        OMP_NUM_THREADS="1",
        WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        # as under torchrun: leave without the interpreter's teardown (shared.distributed)
        TORCHELASTIC_RUN_ID="tests",
    )
    cmd = [sys.executable, "-m", module, *args]
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(nproc)
    ]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{' '.join(cmd[1:])}: {nproc} ranks ran past {timeout} s")
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if failed:
        r = failed[0][0]
        pytest.fail(f"{' '.join(cmd[1:])}: rank {r} exited {failed[0][1]}:\n{outs[r][-4000:]}")
