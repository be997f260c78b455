"""`python -m project03_capstone_infra <command> --help`: train, break, check, tune, cost, report.

python -m project03_capstone_infra chaos                         # CPU: 2 gloo ranks, tiny
python -m project03_capstone_infra chaos --nproc 2 --deterministic      # 2 GPUs: chaos_gpu.*
python -m project03_capstone_infra reshard --deterministic       # 2 -> 1 and 1 -> 2 ranks
python -m project03_capstone_infra determinism-cost --nproc 2    # tokens/s, both modes
python -m project03_capstone_infra checkpoint verify runs/demo/checkpoints
python -m project03_capstone_infra bench-checkpoint --preset 1b --reports-dir runs/<time>
python -m project03_capstone_infra tune --reports-dir runs/<time>
python -m project03_capstone_infra cost --gpu h200-sxm --n-gpus 8 --total-tokens 2e10
python -m project03_capstone_infra report --reports-dir runs/<time>
torchrun --nproc-per-node 2 --max-restarts 3 -m project03_capstone_infra.train --resume auto

Each command is a config dataclass and the function that runs it (`commands()`); the function
returns the exit status. `python -m project03_capstone_infra.<module>` runs that module's
command too (`train`: torchrun's target; `checkpoint`, `tune`, `cost`, `data`, `report`: the
packages).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from shared.cli import main_guard, run_subcommand

PROG = "python -m project03_capstone_infra"
DESCRIPTION = (
    "Fault-tolerant training: versioned DCP checkpoints, automatic resume, "
    "injected failures, GPU health, Ray Tune HPO, and the cost of a job on spot GPUs."
)


def commands() -> dict[str, tuple[type, Callable]]:
    """Command name -> (its config class, the function that runs it)."""
    from . import bench_checkpoint, chaos, determinism_cost, health, reshard, train
    from .checkpoint import __main__ as checkpoint
    from .config import TrainConfig
    from .cost import plan
    from .data import bench
    from .report import render
    from .tune import experiment

    return {
        "train": (TrainConfig, train.command),
        "chaos": (chaos.ChaosConfig, chaos.command),
        "reshard": (reshard.ReshardConfig, reshard.command),
        "determinism-cost": (determinism_cost.DeterminismCostConfig, determinism_cost.command),
        "health": (health.HealthArgs, health.command),
        "checkpoint": (checkpoint.CheckpointCommand, checkpoint.command),
        "bench-checkpoint": (bench_checkpoint.BenchConfig, bench_checkpoint.command),
        "tune": (experiment.TuneRunConfig, experiment.command),
        "cost": (plan.CostConfig, plan.command),
        "data": (bench.DataBenchConfig, bench.command),
        "report": (render.ReportConfig, render.command),
    }


@main_guard
def main(argv: list[str] | None = None) -> int:
    return run_subcommand(commands(), prog=PROG, description=DESCRIPTION, argv=argv)


if __name__ == "__main__":
    from shared.distributed import exit_under_launcher

    code = main()
    # Under torchrun (train, deepspeed): leave without the interpreter's teardown, where a gloo
    # worker thread can abort after the results are written (shared.distributed).
    exit_under_launcher(code)
    sys.exit(code)
