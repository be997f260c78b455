"""Bad configurations fail early with an error that names the field and what was expected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from project02_fsdp_scaling.config import TrainConfig, _argparse_cli, cli_flags, parse_cli
from project02_fsdp_scaling.scaling import ScalingConfig, make_plan, parse_cost_configs
from project02_fsdp_scaling.sweep import parse_variant

from .conftest import REPO


def test_valid_config_derived_sizes():
    cfg = TrainConfig(preset="tiny", global_batch=8, micro_batch=2).validate(2)
    assert (cfg.local_batch(2), cfg.resolved_micro_batch(2), cfg.grad_accum_steps(2)) == (4, 2, 2)
    assert cfg.resolved_seq_len() == 64
    assert TrainConfig(global_batch=8).grad_accum_steps(4) == 1


@pytest.mark.parametrize(
    ("kwargs", "world", "match"),
    [
        ({"global_batch": 6}, 4, r"global_batch \(6\) must be divisible by the world size \(4\)"),
        ({"preset": "7b"}, 1, r"unknown preset '7b'; expected one of"),
        (
            {"global_batch": 8, "micro_batch": 3},
            2,
            r"micro_batch \(3\) must divide the local batch",
        ),
        ({"seq_len": 65}, 1, r"seq_len must be in 1..64"),
        ({"global_batch": 0}, 1, r"global_batch must be >= 1"),
        ({"steps": 0}, 1, r"steps must be >= 1"),
        ({"lr": 0.0}, 1, r"lr must be > 0"),
        ({"grad_clip": -1.0}, 1, r"grad_clip must be >= 0"),
        ({"param_dtype": "float16"}, 1, r"param_dtype must be one of"),
        (
            {"param_dtype": "float64", "reduce_dtype": "bfloat16"},
            1,
            r"reduce_dtype 'bfloat16' cannot go with param_dtype 'float64'",
        ),
    ],
)
def test_bad_train_config(kwargs, world, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs).validate(world)


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        TrainConfig().validate(0)


def test_scaling_checks_every_world_size_before_launching(tmp_path):
    # 8 sequences cannot be split over 3 processes: refused before any job starts.
    with pytest.raises(ValueError, match=r"divisible by the world size \(3\)"):
        make_plan(ScalingConfig(gpus="1,3", reports_root=str(tmp_path)))
    with pytest.raises(ValueError, match="unknown preset"):
        make_plan(ScalingConfig(preset="huge", reports_root=str(tmp_path)))
    with pytest.raises(ValueError, match="comma-separated positive integers"):
        make_plan(ScalingConfig(gpus="1,two", reports_root=str(tmp_path)))
    assert not any(tmp_path.iterdir())


def test_cost_config_errors():
    assert parse_cost_configs("h200-sxm:1,h100-sxm:8") == [("h200-sxm", 1), ("h100-sxm", 8)]
    with pytest.raises(ValueError, match="unknown GPU 'tpu'"):
        parse_cost_configs("tpu:4")
    with pytest.raises(ValueError, match="key:count"):
        parse_cost_configs("h200-sxm:many")


def test_sweep_variants():
    assert parse_variant("compile+ac+cudnn") == {
        "compile": True, "activation_checkpointing": True, "attention": "cudnn",
        "reshard_after_forward": True, "param_dtype": "bfloat16",
    }  # fmt: skip
    assert parse_variant("compile+cudnn+fp32")["param_dtype"] == "float32"
    with pytest.raises(ValueError, match="must start with 'eager' or 'compile'"):
        parse_variant("fast")
    with pytest.raises(ValueError, match="unknown modifier 'fp8'"):
        parse_variant("compile+fp8")


def test_cli_round_trip_with_and_without_tyro():
    cfg = TrainConfig(preset="tiny", global_batch=4, compile=True, attention="cudnn", out="x.json")
    flags = cli_flags(cfg)
    assert "--compile" in flags and "--no-activation-checkpointing" in flags
    assert parse_cli(TrainConfig, flags) == cfg
    assert _argparse_cli(TrainConfig, flags) == cfg  # the fallback used where tyro is missing


def test_train_entry_point_rejects_bad_batch_before_starting():
    env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "project02_fsdp_scaling.train", "--global-batch", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "global_batch (3) must be divisible by the world size (2)" in proc.stderr
