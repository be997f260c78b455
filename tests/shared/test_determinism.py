"""shared.determinism: what enable_determinism sets, what it refuses, and that restore() puts the
process back as it was (these are process-wide flags: a test must not leak them)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from shared.determinism import (
    check_env,
    deterministic_env,
    enable_determinism,
    sdpa_backends,
)


@pytest.fixture
def clean_env(monkeypatch):
    """No deterministic-mode variable in the environment; flags and variables restored after."""
    for name in deterministic_env():
        monkeypatch.delenv(name, raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        sdpa_backends(),
    )
    yield
    after = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        sdpa_backends(),
    )
    if after != before:  # a failed test must not leave the rest of the session deterministic
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:3]
        for name, on in before[3].items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)
        pytest.fail(f"global determinism flags leaked: {before} -> {after}")


def test_the_env_pins_cublas_and_nccl_and_never_enables_nvlink_multicast():
    env = deterministic_env()
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_PROTO"] == "Simple"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["PYTHONHASHSEED"] == "0"
    assert all(isinstance(v, str) for v in env.values())
    env["NCCL_ALGO"] = "Tree"
    assert deterministic_env()["NCCL_ALGO"] == "Ring"  # a fresh dict every call


def test_enable_sets_every_flag_and_restore_puts_them_back(clean_env):
    state = enable_determinism(7, 1, device_type="cpu")
    try:
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert sdpa_backends() == {
            "flash": True,
            "mem_efficient": False,
            "math": True,
            "cudnn": False,
        }
        # the variables a launcher should have set are set in-process, except the one Python
        # reads only at start-up, which is named in a note instead
        for name in ("CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE"):
            assert os.environ[name] == deterministic_env()[name]
        assert "PYTHONHASHSEED" not in os.environ
        assert any("PYTHONHASHSEED" in n for n in state.notes)
        assert sorted(state.env_set_here) == sorted(
            ["CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE"]
        )
        # seeds: seed + rank for Python, NumPy and torch
        assert torch.initial_seed() == 8
        a = (random.random(), np.random.rand(), torch.rand(1).item())
        random.seed(8)
        np.random.seed(8)
        torch.manual_seed(8)
        assert a == (random.random(), np.random.rand(), torch.rand(1).item())
        rec = state.record()
        assert rec["enabled"] and rec["seed"] == 8 and rec["deterministic_algorithms"]
        assert rec["env_at_start"]["NCCL_ALGO"] is None
    finally:
        state.restore()
    assert not torch.are_deterministic_algorithms_enabled()
    assert sdpa_backends() == {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}
    assert not any(name in os.environ for name in deterministic_env())
    state.restore()  # twice is harmless


def test_a_launcher_set_environment_is_kept_and_not_removed_by_restore(clean_env, monkeypatch):
    for name, value in deterministic_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other documented setting
    monkeypatch.setenv("NCCL_ALGO", "ring")  # NCCL reads names case-insensitively
    state = enable_determinism(0, 0)
    state.restore()
    assert state.env_set_here == [] and state.notes == []
    assert state.env_at_start["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["NCCL_ALGO"] == "ring" and os.environ["PYTHONHASHSEED"] == "0"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NCCL_ALGO", "Tree"),
        ("NCCL_PROTO", "LL128"),
        ("NCCL_NVLS_ENABLE", "1"),
        ("CUBLAS_WORKSPACE_CONFIG", ":0:0"),
        ("PYTHONHASHSEED", "random"),
    ],
)
def test_a_conflicting_variable_is_refused_by_name(clean_env, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        enable_determinism(0, 0)
    assert not torch.are_deterministic_algorithms_enabled()  # refused before changing anything
    with pytest.raises(ValueError, match=name):
        check_env({name: value})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seed": -1, "rank": 0},
        {"seed": 0, "rank": -1},
        {"seed": 1.5, "rank": 0},
        {"seed": True, "rank": 0},
        {"seed": 0, "rank": 0, "device_type": "tpu"},
    ],
)
def test_bad_arguments_are_refused(clean_env, kwargs):
    with pytest.raises(ValueError):
        enable_determinism(**kwargs)
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_mode_changes_what_torch_does(clean_env):
    """The flag is PyTorch's own, not a copy of it: with it on, memory from torch.empty is filled
    with NaN (so a kernel reading uninitialised memory cannot go unseen)."""
    state = enable_determinism(0, 0)
    try:
        assert torch.empty(64).isnan().all()
    finally:
        state.restore()
