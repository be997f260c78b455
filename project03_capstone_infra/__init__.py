"""project03: a fault-tolerant training stack (see README.md).

Commands (`python -m project03_capstone_infra --help` lists them): `train` (also
`python -m project03_capstone_infra.train`, torchrun's target; `train(cfg, report_fn)` for Ray
Tune), `chaos`, `reshard`, `determinism-cost`, `health`, `checkpoint`, `bench-checkpoint`,
`tune`, `cost`, `data`, `report`. Packages by role: `checkpoint/`, `tune/`, `cost/`, `data/`,
`report/`. Modules are imported on use: importing the package loads nothing heavy.
"""

PROJECT = __name__  # the results folder: reports/<PROJECT>/
