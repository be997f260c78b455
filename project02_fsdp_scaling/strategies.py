"""Every parallel strategy on the same model and global batch, side by side: tokens/s, MFU
(GPUs), peak memory, the model state's bytes per rank against each strategy's formula, exposed
communication (torch.profiler) and, for pipelines, the idle share against the bubble formula.

    python -m project02_fsdp_scaling strategies                      # CPU: tiny, 2 and 4 ranks
    python -m project02_fsdp_scaling strategies --world-sizes 8      # 8 GPUs: 1b, bf16

One torchrun job per world size runs every strategy that fits it, one after another in one
process group (`train`'s loop, `run_training`). 2-D strategies (fsdp-tp, pp-fsdp) need 4 ranks.

The memory formulas count the training state per rank, in bytes, for P parameters: a float32
parameter (4), its float32 gradient (4) and AdamW's two float32 moments (8): 16 P for DDP (every
rank holds everything), 16 P / N for FSDP2 (ZeRO-3: all three sharded over N ranks), 16 (P_split
/ t + P_norms) for TP (every matrix split over t ranks; the norm weights replicated), 16 P_rank
for a pipeline (the parameters of the rank's own stages), and those divided by the
data-parallel degree for the 2-D layouts. The measured figure sums the bytes of this rank's
parameter shards and optimizer state (the gradients are the parameters' size) and takes the
largest rank; activations and the buffers of communication come on top of it, which the peak
memory on a GPU shows.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from project02_fsdp_scaling import PROJECT
from project02_fsdp_scaling.config import Train, TrainConfig, check_name, check_preset, cli_flags

# name -> the `train` flags of its layout
STRATEGIES: dict[str, list[str]] = {
    "ddp": ["--parallel", "ddp"],
    "fsdp": ["--parallel", "fsdp"],
    "tp": ["--parallel", "tp"],
    "pp-gpipe": ["--parallel", "pp", "--pp-schedule", "gpipe"],
    "pp-1f1b": ["--parallel", "pp", "--pp-schedule", "1f1b"],
    "pp-interleaved-1f1b": ["--parallel", "pp", "--pp-schedule", "interleaved-1f1b"],
    "fsdp-tp": ["--parallel", "fsdp-tp", "--tp", "2"],
    "pp-fsdp": ["--parallel", "pp-fsdp", "--pp", "2"],
}
TWO_D = ("fsdp-tp", "pp-fsdp")
STRATEGIES_TRAIN = TrainConfig(preset="auto", global_batch=0, steps=6, warmup_steps=2, n_layers=0)


@dataclass
class StrategiesConfig:
    """DDP, FSDP2, TP, the pipeline schedules and the 2-D layouts on one model and global batch:
    throughput, memory against each strategy's formula, exposed communication and the pipeline
    bubble. Preset auto: tiny (8 blocks) on CPU, 1b on GPUs; global batch 0: 8 on CPU, 16 on
    GPUs; precision bf16 on GPUs, fp32 on CPU."""

    world_sizes: tuple[int, ...] = ()
    """one torchrun job per entry; () = 2 and 4 CPU processes, or every visible GPU"""
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    """which strategies, in this order (2-D ones only where the world size is >= 4)"""
    measure_comm: bool = True
    """profile one step of each non-pipeline strategy for its exposed communication"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: a new runs/<UTC time>/;
    reports/ only when named)"""
    name: str = ""
    """result file stem; default parallel_gpu or parallel_cpu"""
    timeout_s: int = 3600
    """wall-clock limit of each torchrun job"""
    train: Train = field(default_factory=lambda: replace(STRATEGIES_TRAIN))

    def validate(self) -> StrategiesConfig:
        check_preset(self.train.preset, allow_auto=True)
        check_name(self.name)
        for s in self.strategies:
            if s not in STRATEGIES:
                raise ValueError(f"strategies: {s!r} is not one of {tuple(STRATEGIES)}")
        if any(n < 2 for n in self.world_sizes):
            raise ValueError(f"world_sizes must be >= 2 each, got {self.world_sizes}")
        if self.timeout_s < 1:
            raise ValueError(f"timeout_s must be >= 1, got {self.timeout_s}")
        if self.train.layout.parallel != "fsdp" or self.train.profile:
            raise ValueError("--parallel and --profile: the comparison sets them for every job")
        return self


# ---- the memory formulas ------------------------------------------------------------------
def _counts(args) -> dict[str, int]:
    d, h = args.dim, args.ffn_hidden
    block_matrices = 2 * d * d + 2 * d * args.kv_dim + 3 * d * h
    return {
        "block_matrices": block_matrices,
        "block_norms": 2 * d,
        "embedding": args.vocab_size * d,
        "head": args.vocab_size * d,
        "final_norm": d,
    }


def state_bytes_formula(name: str, args, degrees: dict, stages_per_rank: int = 1) -> dict:
    """The training state per rank (bytes) of a strategy and the formula it follows: 16 bytes
    a parameter (float32 parameter and gradient, two float32 AdamW moments)."""
    c, L = _counts(args), args.n_layers
    P = L * (c["block_matrices"] + c["block_norms"]) + c["embedding"] + c["head"] + c["final_norm"]
    pp, dp, tp = degrees["pp"], degrees["dp"], degrees["tp"]
    if name in ("ddp",):
        return {"bytes": 16 * P, "formula": "16 P"}
    if name == "fsdp":
        return {"bytes": 16 * P / dp, "formula": "16 P / N"}
    if name in ("tp", "fsdp-tp"):
        norms = L * c["block_norms"] + c["final_norm"]
        per = 16 * ((P - norms) / tp + norms) / dp
        return {"bytes": per, "formula": "16 (P_split / t + P_norms)" + (" / d" if dp > 1 else "")}
    # pipelines: the rank whose stages hold the most
    from project02_fsdp_scaling.parallel.pipeline import split_layers, stage_ids

    parts = split_layers(L, pp * stages_per_rank)
    n = pp * stages_per_rank
    worst = 0
    for rank in range(pp):
        total = 0
        for s in stage_ids(rank, pp, stages_per_rank):
            total += len(parts[s]) * (c["block_matrices"] + c["block_norms"])
            total += c["embedding"] if s == 0 else 0
            total += c["head"] + c["final_norm"] if s == n - 1 else 0
        worst = max(worst, total)
    return {"bytes": 16 * worst / dp, "formula": "16 P_rank" + (" / d" if dp > 1 else "")}


def measured_state_bytes(par, optimizer) -> int:
    """This rank's parameter shards (twice: their gradients are as large) and optimizer state."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = sum(local(p).numel() * p.element_size() for _, p in par.named_parameters())
    state = sum(
        local(v).numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0
    )
    return 2 * params + state


# ---- one rank ---------------------------------------------------------------------------------
def _rank_main(spec: dict) -> int:
    import torch.distributed as dist

    from project02_fsdp_scaling.train import run_training
    from shared.cli import parse_dataclass
    from shared.distributed import cleanup, init_distributed

    info = init_distributed()
    runs = []
    try:
        for job in spec["jobs"]:
            cfg = parse_dataclass(TrainConfig, job["flags"])
            box = {}

            def on_end(par, opt, box=box):
                t = torch.tensor([measured_state_bytes(par, opt)], dtype=torch.float64)
                t = t.to(info.device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                box["state"] = float(t.item())

            result, _ = run_training(cfg, info, on_end=on_end)
            formula = state_bytes_formula(
                cfg.layout.parallel,
                cfg.model_args(),
                result["parallel"]["degrees"],
                cfg.layout.resolved_stages_per_rank(),
            )
            prof = (result.get("profile") or {}).get("rank0") or {}
            runs.append(
                {
                    "name": job["name"],
                    "world_size": info.world_size,
                    "degrees": result["parallel"]["degrees"],
                    "bubble": result["parallel"]["bubble"],
                    "tokens_per_s": result["tokens_per_s"],
                    "step_time_s": result["step_time_s"]["median"],
                    "mfu": result["mfu"],
                    "peak_memory_gib": result["peak_memory_gib"]
                    if info.device.type == "cuda"
                    else None,
                    "state_bytes_measured": box["state"],
                    "state_bytes_formula": formula["bytes"],
                    "state_formula": formula["formula"],
                    "exposed_comm_ms": prof.get("exposed_comm_ms"),
                    "comm_ms": prof.get("comm_ms"),
                    "profiled_step_ms": prof.get("step_ms"),
                    "losses": result["losses"],
                    "compute_dtype": result["compute_dtype"],
                }
            )
            del result
            if info.device.type == "cuda":  # the next strategy's peak starts from nothing
                import gc

                gc.collect()
                torch.cuda.empty_cache()
        if info.is_main:
            Path(spec["out"]).write_text(json.dumps(runs))
    finally:
        cleanup()
    return 0


# ---- the harness -----------------------------------------------------------------------------
def _plan(cfg: StrategiesConfig, on_gpu: bool) -> tuple[TrainConfig, list[int]]:
    given = cfg.train
    train = replace(
        given,
        preset=given.preset if given.preset != "auto" else ("1b" if on_gpu else "tiny"),
        # tiny's 2 blocks cannot make 4 ranks x 2 interleaved stages: 8 blocks on the CPU
        n_layers=given.n_layers or (0 if on_gpu or given.preset != "auto" else 8),
        global_batch=given.global_batch or (16 if on_gpu else 8),
        precision=given.precision if given.precision != "bf16" or on_gpu else "fp32",
        device="cuda" if on_gpu else "cpu",
        log_every=given.log_every if on_gpu else 0,
    )
    sizes = list(cfg.world_sizes) or ([torch.cuda.device_count()] if on_gpu else [2, 4])
    return train, sizes


def _jobs(cfg: StrategiesConfig, train: TrainConfig, ws: int, trace_dir: str) -> list[dict]:
    """The `train` flags of every strategy that fits `ws` ranks (its layout's flags last: they
    win over the defaults that `cli_flags` wrote)."""
    jobs = []
    for name in cfg.strategies:
        if name in TWO_D and ws < 4:
            continue
        flags = cli_flags(train) + STRATEGIES[name]
        if name.startswith("pp-") and name != "pp-fsdp":
            # every rank a stage: at least one micro-batch per rank, a multiple of the ranks
            # (what interleaving needs), so the bubble formula compares like with like
            m = train.layout.pp_microbatches
            flags += ["--pp-microbatches", str(-(-m // ws) * ws)]
        if cfg.measure_comm and not name.startswith("pp"):
            flags += ["--profile", "--trace-dir", trace_dir]
        jobs.append({"name": name, "flags": flags})
    return jobs


def run(cfg: StrategiesConfig) -> Path | int:
    """`strategies`: one torchrun job per world size; the record, its Markdown and chart."""
    from project02_fsdp_scaling.config import check_reports_dir
    from project02_fsdp_scaling.scaling import launch
    from project02_fsdp_scaling.strategies_report import render
    from shared.cli import parse_dataclass
    from shared.results import load_result, output_root, save_result

    spec_env = os.environ.get("P02_STRATEGIES_SPEC")
    if spec_env:  # a rank of the job below
        return _rank_main(json.loads(Path(spec_env).read_text()))
    cfg.validate()
    check_reports_dir(cfg.reports_dir)
    on_gpu = torch.cuda.is_available()
    train, sizes = _plan(cfg, on_gpu)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        specs = {ws: _jobs(cfg, train, ws, tmp) for ws in sizes}
        for ws, jobs in specs.items():  # every bad combination before the first launch
            for job in jobs:
                parse_dataclass(TrainConfig, job["flags"]).validate(ws)
        for ws, jobs in specs.items():
            spec_path, out = Path(tmp) / f"spec_{ws}.json", Path(tmp) / f"runs_{ws}.json"
            spec_path.write_text(json.dumps({"out": str(out), "jobs": jobs}))
            os.environ["P02_STRATEGIES_SPEC"] = str(spec_path)
            try:
                rc, tail = launch(ws, "strategies", [], on_gpu=on_gpu, timeout_s=cfg.timeout_s)
            finally:
                del os.environ["P02_STRATEGIES_SPEC"]
            if rc != 0:
                raise RuntimeError(f"the strategies job at world size {ws} exited {rc}:\n{tail}")
            runs += json.loads(out.read_text())
    name = cfg.name or ("parallel_gpu" if on_gpu else "parallel_cpu")
    args = train.model_args()
    results = {
        "preset": train.preset,
        "model": {"args": args.to_dict(), "n_params": args.num_params()},
        "global_batch": train.global_batch,
        "seq_len": train.resolved_seq_len(),
        "precision": train.precision,
        "device": "cuda" if on_gpu else "cpu",
        "runs": runs,
    }
    config = {"world_sizes": sizes, "strategies": list(cfg.strategies), "train": train.to_dict()}
    path = save_result(
        PROJECT, name, results, config=config, reports_dir=output_root(cfg.reports_dir)
    )
    render(load_result(path), path.parent, path.stem)
    print(f"wrote {path}")
    return path
