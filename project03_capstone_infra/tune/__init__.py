"""Distributed hyperparameter search with Ray Tune over the project's fault-tolerant trainer.

    python -m project03_capstone_infra tune                      # local Ray, CPU, tiny preset
    python -m project03_capstone_infra tune --address auto --gpus-per-trial 0.5 --preset 125m
    python -m project03_capstone_infra tune --resume             # after the driver was killed
    python -m project03_capstone_infra.tune ...                  # the same

- `trial`: one trial, the trainer as Tune's trainable (reports, checkpoints, restore);
- `experiment`: `TuneRunConfig`, search space, scheduler, `Tuner`, Ray, the `tune` command;
- `analysis`: per-trial records, the best configuration, ASHA against random search.
The report (charts, Markdown) is rendered from the JSON record by `report/tune.py`.
"""
