"""`python -m project02_fsdp_scaling <command> --help`: train, benchmark, compare, report.

python -m project02_fsdp_scaling scaling --gpus 1,2,4,8      # strong scaling, torchrun per world size
python -m project02_fsdp_scaling scaling                     # CPU: tiny, 1 and 2 gloo processes
python -m project02_fsdp_scaling sweep --preset 1b           # one-GPU variants, best by MFU
python -m project02_fsdp_scaling compare --world-size 2      # FSDP2 vs DeepSpeed ZeRO-3
python -m project02_fsdp_scaling precision                   # bf16 vs fp8 vs fp16: parity, speed
python -m project02_fsdp_scaling report --reports-dir runs/<time> --no-readme
torchrun --nproc-per-node 8 -m project02_fsdp_scaling train --preset 1b --compile
torchrun --nproc-per-node 2 -m project02_fsdp_scaling deepspeed --preset tiny
python -m project02_fsdp_scaling comm-analysis trace.json.gz
python -m project02_fsdp_scaling collectives --world-size 8  # nccl-tests-style bus bandwidth
python -m project02_fsdp_scaling strategies                  # DDP, FSDP2, TP, PP, 2-D side by side
torchrun --nproc-per-node 8 -m project02_fsdp_scaling train --parallel fsdp-tp --tp 2
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from shared.cli import main_guard, run_subcommand

PROG = "python -m project02_fsdp_scaling"
DESCRIPTION = (
    "FSDP2 training of the shared ~1B transformer, its strong-scaling benchmark "
    "and the comparison with DeepSpeed ZeRO-3."
)


def commands() -> dict[str, tuple[type, Callable]]:
    """Command name -> (its config class, the function that runs it)."""
    from . import (
        collectives,
        comm_analysis,
        compare,
        deepspeed_zero3,
        precision,
        report,
        scaling,
        strategies,
        sweep,
        train,
    )
    from .config import DeepSpeedConfig, TrainConfig

    return {
        "train": (TrainConfig, train.run),
        "scaling": (scaling.ScalingConfig, scaling.run),
        "sweep": (sweep.SweepConfig, sweep.run),
        "compare": (compare.CompareConfig, compare.run),
        "precision": (precision.PrecisionConfig, precision.run),
        "deepspeed": (DeepSpeedConfig, deepspeed_zero3.run),
        "report": (report.ReportConfig, report.run),
        "comm-analysis": (comm_analysis.CommAnalysisConfig, comm_analysis.run),
        "collectives": (collectives.CollectivesConfig, collectives.run),
        "strategies": (strategies.StrategiesConfig, strategies.run),
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
