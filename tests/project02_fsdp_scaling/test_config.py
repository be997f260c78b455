"""Bad configurations fail early with an error that names the field and what was expected."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from project02_fsdp_scaling.compare import CompareConfig
from project02_fsdp_scaling.config import DeepSpeedConfig, TrainConfig, cli_flags
from project02_fsdp_scaling.scaling import ScalingConfig, make_plan, parse_cost_configs
from project02_fsdp_scaling.sweep import SweepConfig, parse_variant
from shared.cli import parse_dataclass

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
        ({"precision": "float16"}, 1, r"precision must be one of"),
        (
            {"precision": "bf16", "loss_scaling": False},
            1,
            r"--no-loss-scaling is for precision fp16",
        ),
        (
            {"precision": "fp16", "fused_loss": True},
            1,
            r"--fused-loss forms the loss gradients before fp16 loss scaling",
        ),
        (
            {"precision": "fp64", "reduce_dtype": "bfloat16"},
            1,
            r"reduce_dtype 'bfloat16' cannot go with precision 'fp64'",
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
        make_plan(ScalingConfig(gpus="1,3", reports_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="unknown preset"):
        make_plan(ScalingConfig(train=TrainConfig(preset="huge"), reports_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="comma-separated positive integers"):
        make_plan(ScalingConfig(gpus="1,two", reports_dir=str(tmp_path)))
    assert not any(tmp_path.iterdir())


def test_cost_config_errors():
    assert parse_cost_configs("h200-sxm:1,h100-sxm:8") == [("h200-sxm", 1), ("h100-sxm", 8)]
    with pytest.raises(ValueError, match="unknown GPU 'tpu'"):
        parse_cost_configs("tpu:4")
    with pytest.raises(ValueError, match="key:count"):
        parse_cost_configs("h200-sxm:many")


def test_sweep_variants():
    plain = parse_variant("compile")
    assert plain["compile"] is True and not plain["activation_checkpointing"]
    assert parse_variant("compile+ac+cudnn") == {
        **plain,
        "activation_checkpointing": True,
        "attention": "cudnn",
    }
    assert parse_variant("compile+cudnn+fp32")["precision"] == "fp32"
    # the levers of the bf16 profile, each one field; +mbN the micro-batch
    assert parse_variant("compile+noreshard+cdt+autotune+syncmb+fusedloss+mb32") == {
        "compile": True,
        "activation_checkpointing": False,
        "attention": "sdpa",
        "reshard_after_forward": False,
        "precision": "bf16",
        "coordinate_descent_tuning": True,
        "compile_mode": "max-autotune-no-cudagraphs",
        "sync_every_microbatch": True,
        "fused_loss": True,
        "micro_batch": 32,
    }
    assert "micro_batch" not in parse_variant("compile")  # the sweep's --train.micro-batch
    with pytest.raises(ValueError, match="must start with 'eager' or 'compile'"):
        parse_variant("fast")
    with pytest.raises(ValueError, match="unknown modifier 'fp8'"):
        parse_variant("compile+fp8")
    for bad in ("mb0", "mb", "mb-2", "mbx"):
        with pytest.raises(ValueError, match=f"unknown modifier '{bad}'.*mbN"):
            parse_variant(f"compile+{bad}")


def test_compile_tuning_needs_compile():
    """--compile-mode and --coordinate-descent-tuning tune compiled kernels: refused without
    --compile (so an eager+cdt sweep variant fails before any variant runs), and the mode is
    one torch.compile knows here."""
    ok = TrainConfig(preset="tiny", global_batch=4, compile=True, coordinate_descent_tuning=True)
    assert ok.validate() is ok
    TrainConfig(preset="tiny", compile=True, compile_mode="max-autotune-no-cudagraphs").validate()
    for bad in (
        {"coordinate_descent_tuning": True},
        {"compile_mode": "max-autotune-no-cudagraphs"},
    ):
        with pytest.raises(ValueError, match="need --compile"):
            TrainConfig(preset="tiny", compile=False, **bad).validate()
    with pytest.raises(ValueError, match="compile_mode"):
        TrainConfig(preset="tiny", compile=True, compile_mode="reduce-overhead").validate()
    with pytest.raises(ValueError, match="need --compile"):
        replace(TrainConfig(preset="tiny"), **parse_variant("eager+cdt")).validate()


def test_coordinate_descent_tuning_is_set_for_the_run_only():
    import torch._inductor.config as inductor_config

    from project02_fsdp_scaling.train import inductor_options

    before = inductor_config.coordinate_descent_tuning
    with inductor_options(TrainConfig(preset="tiny", compile=True)):
        assert inductor_config.coordinate_descent_tuning == before
    with inductor_options(TrainConfig(preset="tiny", compile=True, coordinate_descent_tuning=True)):
        assert inductor_config.coordinate_descent_tuning is True
    assert inductor_config.coordinate_descent_tuning == before


def test_cli_flags_round_trip_through_tyro():
    cfg = TrainConfig(preset="tiny", global_batch=4, compile=True, attention="cudnn", out="x.json")
    flags = cli_flags(cfg)
    assert "--compile" in flags and "--no-activation-checkpointing" in flags
    assert parse_dataclass(TrainConfig, flags) == cfg


def test_harness_configs_nest_a_train_config_under_its_own_flag_names():
    """scaling, sweep and compare hold a TrainConfig whose flags keep their names (--preset,
    not --train.preset): what a harness is given is what its child jobs are given."""
    sweep = SweepConfig(variants="eager", name="s", train=TrainConfig(preset="tiny", steps=2))
    flags = cli_flags(sweep)
    assert "--preset" in flags and not any(f.startswith("--train.") for f in flags)
    assert parse_dataclass(SweepConfig, flags) == sweep
    scaling = parse_dataclass(ScalingConfig, ["--gpus", "1,2", "--preset", "tiny", "--lr", "1e-3"])
    assert (scaling.gpus, scaling.train.preset, scaling.train.lr) == ("1,2", "tiny", 1e-3)
    # each harness keeps its own defaults for the training flags
    assert (scaling.train.compile, scaling.train.profile, scaling.train.steps) == (True, True, 0)
    assert CompareConfig().precisions == ("bf16", "fp32")  # the harness sets the dtype
    assert CompareConfig().train.steps == 6
    assert SweepConfig().train.preset == "1b"


def test_deepspeed_config_is_the_shared_part_of_the_fsdp_job():
    train = TrainConfig(preset="tiny", global_batch=4, lr=1e-3, precision="fp32", out="o")
    ds = DeepSpeedConfig.from_train(train)
    assert (ds.preset, ds.global_batch, ds.lr, ds.precision, ds.out) == (
        "tiny",
        4,
        1e-3,
        "fp32",
        "o",
    )
    assert not hasattr(ds, "compile") and not hasattr(ds, "profile")
    for fsdp_only in (
        {"compile": True},
        {"attention": "cudnn"},
        {"profile": True},
        {"activation_checkpointing": True},
    ):
        with pytest.raises(ValueError, match="FSDP path only|eager with SDPA"):
            DeepSpeedConfig.from_train(TrainConfig(**fsdp_only))
    for precision in ("fp64", "fp16", "fp8-rowwise"):
        with pytest.raises(ValueError, match=f"precision '{precision}' is for the FSDP path only"):
            DeepSpeedConfig.from_train(TrainConfig(precision=precision))
    with pytest.raises(ValueError, match="precision 'fp64' is for the FSDP path only"):
        DeepSpeedConfig(precision="fp64").validate()


def test_train_entry_point_rejects_bad_batch_before_starting():
    env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "project02_fsdp_scaling", "train", "--global-batch", "3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "global_batch (3) must be divisible by the world size (2)" in proc.stderr
