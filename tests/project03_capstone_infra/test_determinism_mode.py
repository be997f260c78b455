"""Deterministic mode's plumbing on CPU: the flags parse, the launcher gives the workers the
environment the mode needs (seen from inside the rank processes), the trainer turns the mode on
before any CUDA or NCCL work and says so in its records, and in-process callers get the
process's global state back. `--stop-after` (how the resharding demo stops a run) is here too."""

from __future__ import annotations

import json
import os

import pytest
import torch

from project03_capstone_infra import runner
from project03_capstone_infra.chaos import ChaosConfig, report_name
from project03_capstone_infra.checkpoint.compare import compare_states
from project03_capstone_infra.checkpoint.layout import list_checkpoints
from project03_capstone_infra.checkpoint.safe_read import read_full_state
from project03_capstone_infra.config import TrainConfig
from project03_capstone_infra.determinism_cost import DeterminismCostConfig
from project03_capstone_infra.faults import FAULTS_ENV, read_events
from project03_capstone_infra.reshard import ReshardConfig
from project03_capstone_infra.train import train
from shared.cli import parse_dataclass
from shared.determinism import deterministic_env, sdpa_backends

from .conftest import RUN


def _events(run_dir, kind):
    return [e for e in read_events(run_dir / "events.jsonl") if e["event"] == kind]


@pytest.mark.parametrize("cls", [TrainConfig, ChaosConfig, ReshardConfig])
def test_the_flag_parses_and_is_off_by_default(cls):
    assert parse_dataclass(cls, ["--deterministic"]).deterministic is True
    assert parse_dataclass(cls, []).deterministic is False
    assert parse_dataclass(cls, ["--no-deterministic"]).deterministic is False


def test_chaos_report_names_keep_the_cpu_report():
    cfg = ChaosConfig()
    assert report_name(cfg, cuda=False) == "chaos"
    assert report_name(cfg, cuda=True) == "chaos_gpu"
    named = parse_dataclass(ChaosConfig, ["--report-name", "chaos_h200"]).validate()
    assert report_name(named, cuda=True) == "chaos_h200"
    for bad in ("../chaos", "a/b", ".hidden", "chaos gpu"):
        with pytest.raises(ValueError, match="report_name"):
            ChaosConfig(report_name=bad).validate()


def test_the_launch_env_carries_the_mode_and_overrides_a_conflicting_one(monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # would break the mode: the launcher's value wins
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    env = runner.child_env(deterministic=True)
    for name, value in deterministic_env().items():
        assert env[name] == value
    plain = runner.child_env()
    assert plain["NCCL_ALGO"] == "Tree" and "CUBLAS_WORKSPACE_CONFIG" not in plain


def test_the_launch_env_lets_a_hung_nccl_peer_end_and_keeps_a_callers_choice(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.setenv("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "5000")
    env = runner.child_env()
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"  # tear down on a timeout, never 0
    assert env["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] == "5000"  # the caller's value
    assert runner.NCCL_FAILURE_ENV["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"] == "1000"


def test_in_process_run_records_the_mode_and_restores_global_state(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    for name in deterministic_env():
        monkeypatch.delenv(name, raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), sdpa_backends())
    out = train(TrainConfig(run_dir=str(tmp_path), deterministic=True, **RUN))
    assert out["status"] == "completed" and out["deterministic"] is True
    rec = out["determinism"]
    assert rec["deterministic_algorithms"] and rec["sdpa_backends"]["mem_efficient"] is False
    (start,) = _events(tmp_path, "start")
    assert start["deterministic"] is True and start["determinism"]["seed"] == 0
    # the checkpoint's manifest carries the run's configuration, the mode included
    manifest = json.loads(
        (list_checkpoints(tmp_path / "checkpoints")[-1] / "manifest.json").read_text()
    )
    assert manifest["config"]["deterministic"] is True
    # process-wide flags and the variables the trainer set are put back for the next caller
    assert (torch.are_deterministic_algorithms_enabled(), sdpa_backends()) == before
    assert not any(name in os.environ for name in deterministic_env())


def test_a_default_run_records_the_mode_as_off(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    out = train(TrainConfig(run_dir=str(tmp_path), **{**RUN, "steps": 3}))
    assert out["deterministic"] is False and out["determinism"] is None
    (start,) = _events(tmp_path, "start")
    assert start["deterministic"] is False and start["determinism"] is None


@pytest.mark.slow  # one 2-rank torchrun launch: ~10 s on 2 cores
def test_the_ranks_start_with_the_env_and_cpu_results_do_not_change(
    tmp_path, reference_run, monkeypatch
):
    # Through the real launcher: the variables must be in each rank's environment when the
    # process starts (PYTHONHASHSEED cannot be set later), so the trainer sets none itself.
    for name in deterministic_env():
        monkeypatch.delenv(name, raising=False)
    done = runner.launch(tmp_path, nproc=2, deterministic=True, **RUN)
    assert done.returncode == 0, done.output[-3000:]
    starts = _events(tmp_path, "start")
    assert sorted(e["rank"] for e in starts) == [0, 1]
    for e in starts:
        assert e["deterministic"] is True
        assert e["determinism"]["env_at_start"] == deterministic_env(), e["rank"]
        assert e["determinism"]["env_set_in_process"] == [] and e["determinism"]["notes"] == []
        assert e["determinism"]["seed"] == e["rank"]  # seed 0 + rank
    # On CPU the kernels were deterministic already: the mode changes no bit of the result.
    a = read_full_state(runner.final_checkpoint(reference_run))
    b = read_full_state(runner.final_checkpoint(tmp_path))
    assert not compare_states(a, b)
    assert runner.loss_curve(tmp_path) == runner.loss_curve(reference_run)


def test_stop_after_ends_the_launch_saved_and_the_next_continues_bitwise(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    ref = train(TrainConfig(run_dir=str(tmp_path / "ref"), **RUN))
    cfg = TrainConfig(run_dir=str(tmp_path / "run"), stop_after=5, **RUN)
    first = train(cfg)
    assert first["status"] == "stopped" and first["step"] == 5
    assert list_checkpoints(tmp_path / "run" / "checkpoints")[-1].name == "step_00000005"
    assert [e["step"] for e in _events(tmp_path / "run", "stopped")] == [5]
    again = train(cfg)  # resumed at the stop: nothing left to do in this launch
    assert again["status"] == "stopped" and again["step"] == 5 and not again["losses"]
    last = train(TrainConfig(run_dir=str(tmp_path / "run"), **RUN))
    assert last["status"] == "completed" and last["resume"]["from_step"] == 5
    a = read_full_state(runner.final_checkpoint(tmp_path / "ref"))
    b = read_full_state(runner.final_checkpoint(tmp_path / "run"))
    assert not compare_states(a, b)  # the schedule spanned --steps throughout
    assert runner.loss_curve(tmp_path / "run") == ref["losses"]


def test_the_cost_and_reshard_configs_refuse_nonsense():
    with pytest.raises(ValueError, match="warmup"):
        DeterminismCostConfig(steps=5, warmup=4).validate()
    with pytest.raises(ValueError, match="directions"):
        ReshardConfig(directions=("2-2",)).validate()
    with pytest.raises(ValueError, match="global_batch"):
        ReshardConfig(directions=("3-1",), global_batch=8).validate()
    with pytest.raises(ValueError, match="switch_after"):
        ReshardConfig(steps=10, switch_after=10).validate()
    assert ReshardConfig().pairs() == [(2, 1), (1, 2)]
