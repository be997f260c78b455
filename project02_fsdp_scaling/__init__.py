"""project02: FSDP2 training of the shared ~1B transformer and its strong-scaling benchmark, and
every other parallelism on the same model: DDP, tensor and sequence parallel, pipeline schedules
and 2-D layouts (`parallel/`), with a collective-communication benchmark.

One command line, `python -m project02_fsdp_scaling <command> --help`: `train` (under torchrun;
`--parallel fsdp|ddp|tp|fsdp-tp|pp|pp-fsdp`), `scaling`, `sweep`, `compare`, `deepspeed` (under
torchrun), `strategies`, `collectives`, `report`, `comm-analysis`. See README.md, the project's
report.
"""

from project02_fsdp_scaling.config import TrainConfig

PROJECT = __name__  # the results folder: reports/<PROJECT>/

__all__ = ["TrainConfig"]
