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
