"""GPU tier, two GPUs: with --deterministic, two 2-GPU runs of the same job (FSDP2 over NCCL,
bf16 compute) end with bitwise equal model and optimizer states, and so does a run killed
mid-way and resumed by torchrun. By default they do not: attention's backward, cuBLAS and NCCL
choose reduction orders at run time (measured: up to 0.05 apart in a weight after a few dozen
steps on two H200s)."""

from __future__ import annotations

import pytest
import torch

from project03_capstone_infra import runner
from project03_capstone_infra.checkpoint.compare import compare_states
from project03_capstone_infra.checkpoint.safe_read import read_full_state
from project03_capstone_infra.faults import read_events

# A few dozen steps of the tiny model (its head dim of 16 runs flash attention in bf16), a
# checkpoint every 10. Pre-flight is off: earlier GPU tests of the session may hold cached memory
# in the pytest process, which the "another process holds this GPU" check would count.
RUN = dict(
    preset="tiny",
    steps=30,
    ckpt_every=10,
    keep_last=3,
    log_every=100,
    device="cuda",
    deterministic=True,
    preflight=False,
)


def _two_gpus() -> None:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        pytest.skip(f"needs 2 CUDA GPUs, found {n}: compares two 2-GPU runs bit for bit")


@pytest.fixture(scope="module")
def deterministic_reference(tmp_path_factory):
    _two_gpus()
    run_dir = tmp_path_factory.mktemp("gpu_det_reference")
    done = runner.launch(run_dir, nproc=2, **RUN)
    assert done.returncode == 0, done.output[-3000:]
    return run_dir


def _assert_bitwise_equal(a_dir, b_dir) -> None:
    a = read_full_state(runner.final_checkpoint(a_dir))
    b = read_full_state(runner.final_checkpoint(b_dir))
    assert sum(k.startswith("optim.") for k in a) > 10
    diffs = compare_states(a, b)
    assert not diffs, "final states differ:\n" + "\n".join(diffs[:10])
    assert runner.loss_curve(a_dir) == runner.loss_curve(b_dir)


@pytest.mark.gpu
def test_two_deterministic_2gpu_runs_are_bitwise_equal(deterministic_reference, tmp_path):
    done = runner.launch(tmp_path, nproc=2, **RUN)
    assert done.returncode == 0, done.output[-3000:]
    starts = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "start"]
    assert sorted(e["device"] for e in starts) == ["cuda:0", "cuda:1"]
    assert all(e["deterministic"] and e["dtype"] == "bfloat16" for e in starts)
    assert all(not e["determinism"]["env_set_in_process"] for e in starts)  # from the launcher
    _assert_bitwise_equal(deterministic_reference, tmp_path)


@pytest.mark.gpu
def test_deterministic_kill_and_resume_on_2gpus_is_bitwise_equal(deterministic_reference, tmp_path):
    # kill -9 of rank 1 before step 17: torchrun restarts both ranks, which resume from step 10
    # (NCCL communicators, cuBLAS handles and the attention kernels all made anew). Rank 0 is
    # then waiting on a collective its dead peer never joins; torchrun's SIGTERM starts its
    # preemption deadline (5 s here), which ends it.
    faults = [{"kind": "kill", "step": 17, "rank": 1, "attempt": 0}]
    done = runner.launch(
        tmp_path, nproc=2, max_restarts=1, faults=faults, sigterm_deadline_s=5, **RUN
    )
    assert done.returncode == 0, done.output[-3000:]
    resumes = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "resume"]
    assert [e["from_step"] for e in resumes] == [10]
    _assert_bitwise_equal(deterministic_reference, tmp_path)
