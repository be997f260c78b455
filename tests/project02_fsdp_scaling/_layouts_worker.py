"""Run under torchrun by test_parallel_layouts.py: several training jobs of project02's one loop
in sequence, in one process group (starting a group of gloo processes costs seconds; a job
costs less), each with its own `--parallel` layout.

    python -m tests.project02_fsdp_scaling._layouts_worker OUT.pt JOBS_JSON

P02_LAYOUTS_DEVICE=cuda runs the world on GPUs (NCCL), one per rank; the default is the CPU.
JOBS_JSON: a list of {"name": str, "flags": [train flags], "bug": optional planted bug}. Rank 0
writes OUT.pt: {name: {"losses", "grad_norms", "params" (full, canonical names), "state_end"
(model and optimizer state in full), "state_resumed" (the same right after --resume loaded, or
None), "parallel" (the record's layout entry)}}.

Planted bugs, to show that the layout comparison catches one:
- "tp_qkv_unpermuted": the fused qkv weight is split without its per-rank permutation (a rank's
  shard holds the wrong heads' rows);
- "pp_summed_microbatches": the pipeline sums micro-batch gradients instead of averaging them.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from project02_fsdp_scaling.config import TrainConfig
from shared.cli import parse_dataclass
from shared.distributed import cleanup, exit_under_launcher, init_distributed


def _plant(bug: str | None):
    """Patch the library for one job; returns the undo."""
    from project02_fsdp_scaling.parallel import pipeline, tp

    if bug is None:
        return lambda: None
    if bug == "tp_qkv_unpermuted":
        saved = tp.tp_qkv
        tp.tp_qkv = lambda weight, split, degree: weight
        return lambda: setattr(tp, "tp_qkv", saved)
    if bug == "pp_summed_microbatches":
        saved = pipeline.build_schedule

        def summed(*args, **kwargs):
            stages, schedule = saved(*args, **kwargs)
            schedule.scale_grads = False
            return stages, schedule

        pipeline.build_schedule = summed
        return lambda: setattr(pipeline, "build_schedule", saved)
    raise SystemExit(f"unknown planted bug {bug!r}")


def main(argv: list[str]) -> int:
    from project02_fsdp_scaling.parallel.checkpoint import full_state
    from project02_fsdp_scaling.train import run_training

    out, jobs = argv[0], json.loads(argv[1])
    info = init_distributed(device=os.environ.get("P02_LAYOUTS_DEVICE", "cpu"))
    results = {}
    try:
        for job in jobs:
            cfg = parse_dataclass(TrainConfig, job["flags"])
            got: dict = {"state_resumed": None}

            def on_resume(par, opt, got=got):
                got["state_resumed"] = full_state(par, opt)

            def on_end(par, opt, got=got):
                got["state_end"] = full_state(par, opt)
                got["params"] = par.full_params()

            undo = _plant(job.get("bug"))
            try:
                result, _ = run_training(cfg, info, on_resume=on_resume, on_end=on_end)
            finally:
                undo()
            got.update(
                losses=result["losses"],
                grad_norms=result["grad_norms"],
                parallel=result["parallel"],
                world_size=result["world_size"],
            )
            results[job["name"]] = got
        if info.is_main:
            torch.save(results, out)
    finally:
        cleanup()
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    exit_under_launcher(code)
    sys.exit(code)
