"""project03: a fault-tolerant training stack (see README.md).

Entry points (`python -m project03_capstone_infra` lists them): `train` (torchrun target and
`train(cfg, report_fn)` for Ray Tune), `ckpt`, `chaos`, `health`, `bench_checkpoint`, `tune`,
`cost`, `data_pipeline`. Modules are imported on use: importing the package loads nothing heavy.
"""
