"""A demo killed by a timeout or a scheduler (SIGTERM) must not leave its torchrun jobs running:
they live in sessions of their own and would hold the GPUs of whatever runs next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress

import psutil

from project03_capstone_infra import runner
from project03_capstone_infra.faults import read_events

HELPER = """
import sys, time
from project03_capstone_infra import runner
with runner.jobs_end_with_this_process():
    p = runner.start(sys.argv[1], nproc=1, preset="tiny", steps=100000, ckpt_every=100000,
                     log_every=100000)
    print(p.pid, flush=True)
    time.sleep(600)
"""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_a_demo_ends_the_torchrun_jobs_it_started(tmp_path):
    demo = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(tmp_path)],
        cwd=runner.REPO_ROOT,
        env=runner.child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pgid = int(demo.stdout.readline())
        deadline = time.time() + 120
        while not any(e["event"] == "step" for e in read_events(tmp_path / "events.jsonl")):
            assert time.time() < deadline, "the trainer never reached a step"
            time.sleep(0.1)
        assert _group_alive(pgid)
        # torchrun starts its workers in sessions of their own: killing its group alone
        # would leave them running, orphaned
        workers = psutil.Process(pgid).children(recursive=True)
        assert workers
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.time() + 20
        while _group_alive(pgid) and time.time() < deadline:
            time.sleep(0.1)
        assert not _group_alive(pgid), "torchrun outlived the demo"
        _, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, f"torchrun's workers outlived the demo: {[w.pid for w in alive]}"
    finally:
        if demo.poll() is None:
            demo.kill()
        if "pgid" in locals() and _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
        for w in locals().get("workers", []):
            with suppress(psutil.NoSuchProcess):
                w.kill()
