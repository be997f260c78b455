"""project02: FSDP2 training of the shared ~1B transformer and its strong-scaling benchmark.

Entry points (`python -m project02_fsdp_scaling.<name> --help`): `train` (torchrun), `scaling`,
`sweep`, `compare`, `deepspeed_zero3`, `report`. See README.md, the project's report.
"""

from project02_fsdp_scaling.config import TrainConfig

__all__ = ["TrainConfig"]
