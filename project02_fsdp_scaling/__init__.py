"""project02: FSDP2 training of the shared ~1B transformer and its strong-scaling benchmark.

One command line, `python -m project02_fsdp_scaling <command> --help`: `train` (under torchrun),
`scaling`, `sweep`, `compare`, `deepspeed` (under torchrun), `report`, `comm-analysis`. See
README.md, the project's report.
"""

from project02_fsdp_scaling.config import TrainConfig

PROJECT = __name__  # the results folder: reports/<PROJECT>/

__all__ = ["TrainConfig"]
