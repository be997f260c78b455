"""GPU tier (2 or more GPUs, NCCL): the layouts of test_parallel_layouts.py on GPUs, in float64,
equal the CPU's one-process training to the same bound (the bound holds for any order of the
sums, cuBLAS's and NCCL's included); with 4 GPUs the 2-D layouts too."""

from __future__ import annotations

import pytest
import torch

from .test_parallel_layouts import (
    ATOL,
    COMMON,
    FOUR_RANKS,
    REL,
    TWO_RANKS,
    _gaps,
    _launch,
    _one_process,
)

pytestmark = pytest.mark.gpu


def _gpus(n: int) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        pytest.skip(f"needs {n} CUDA GPUs, {have} visible")


def _on_gpu(jobs: list[dict]) -> list[dict]:
    return [{**j, "flags": [*j["flags"], "--device", "cuda"]} for j in jobs if not j["bug"]]


@pytest.mark.parametrize("n, jobs", [(2, TWO_RANKS), (4, FOUR_RANKS)], ids=["2gpus", "4gpus"])
def test_layouts_on_gpus_match_one_cpu_process(tmp_path, n, jobs):
    _gpus(n)
    ref = _one_process(COMMON)
    runs = _launch(tmp_path, n, _on_gpu(jobs), gpu=True)
    for name, run in runs.items():
        weights, loss, norm = _gaps(run, ref)
        assert weights < ATOL and loss < REL and norm < REL, (name, weights, loss, norm)
