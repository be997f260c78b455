"""Test tiers: `gpu` tests run only where torch sees a CUDA GPU (make gpu-test); `macos` tests
only on macOS. Elsewhere they are skipped with the reason, never counted as passes."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def pytest_configure(config):
    """Under pytest-xdist (`make test` spreads files over the cores), each worker's torch takes
    its share of the cores rather than all of them: two workers of two threads each on two cores
    spend their time switching. Subprocesses a test starts inherit the same share."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        share = str(max(1, (os.cpu_count() or 1) // int(workers)))
        os.environ.setdefault("OMP_NUM_THREADS", share)
        os.environ.setdefault("MKL_NUM_THREADS", share)
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    import torch

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: run the GPU tier (make gpu-test) there")
    no_mac = pytest.mark.skip(reason="needs macOS (Core ML prediction / Metal)")
    has_gpu = torch.cuda.is_available()
    is_mac = platform.system() == "Darwin"
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(no_gpu)
        if "macos" in item.keywords and not is_mac:
            item.add_marker(no_mac)


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
