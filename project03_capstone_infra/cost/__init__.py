"""What a training job costs on on-demand vs spot GPUs, in fp32 vs bf16 (and fp16 and the fp8
recipes where project02's `precision` harness measured them), with the checkpoint interval
chosen by the Young/Daly formula; an analytic model checked by Monte Carlo.

    python -m project03_capstone_infra cost --gpu h200-sxm --n-gpus 8 --total-tokens 2e10
    python -m project03_capstone_infra.cost ...        # the same

- `model`: the expected wall time of a job under Poisson interruptions (Daly 2006), Young's
  interval and the numerical optimum, and the Monte Carlo of the same process;
- `inputs`: throughput, bf16/fp32 speed ratio, fp16/fp8 vs bf16 ratios (measured only: a
  precision no record measured is not priced), checkpoint save and restart times, each with its
  source (a report file, or a labelled assumption), and interruption traces;
- `plan`: `CostConfig`, the plans (market x precision x interval) and their evaluation;
  `run(cfg)` returns the record's results.
The report (charts, Markdown) is rendered from the JSON record by `report/cost.py`.
"""
