"""Shared settings of project03's tests: the tiny run every process test uses."""

from __future__ import annotations

import pytest

# 12 steps of the tiny model, a checkpoint every 3 (async, the default): small enough that a
# torchrun launch is dominated by interpreter start-up, long enough to lose and replay steps.
RUN = dict(preset="tiny", steps=12, ckpt_every=3, keep_last=3, log_every=100)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """The uninterrupted 2-rank run every faulted run must reproduce bit for bit."""
    from project03_capstone_infra import runner

    run_dir = tmp_path_factory.mktemp("reference")
    done = runner.launch(run_dir, nproc=2, **RUN)
    assert done.returncode == 0, done.output[-3000:]
    return run_dir
