"""FSDP2 vs DeepSpeed ZeRO-3, side by side at one world size: throughput, memory, loss parity,
in bf16 mixed precision and in float32.

    python -m project02_fsdp_scaling compare --world-size 2          # CPU: tiny, gloo
    python -m project02_fsdp_scaling compare --world-size 2 --preset 1b --precisions bf16

For each precision both jobs get the same flags (model, seed, data, global batch, micro-batch,
AdamW, clipping) and run as `torchrun` jobs one after the other; each saves its final full
parameters, so parity is checked on the weights as well as on the per-step loss. In bf16 both
start from the bf16 image of the initial weights (where DeepSpeed's master copy starts anyway;
`--no-equal-start` leaves FSDP2 at the float32 weights). The loss gaps are judged against the
bf16-vs-float32 gap of FSDP2 itself (`parity`). Without deepspeed installed the record says so
and holds the FSDP side only. Writes <reports-dir>/project02_fsdp_scaling/compare_<tier>.json,
.md and a loss-curve chart, again after each precision (a run cut short keeps what finished).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import get_args

import torch

from project02_fsdp_scaling import PROJECT
from project02_fsdp_scaling.config import (
    DeepSpeedConfig,
    DeepSpeedPrecisionName,
    Train,
    TrainConfig,
    check_name,
    check_preset,
    check_reports_dir,
    cli_flags,
    portable,
    set_by_harness,
)
from project02_fsdp_scaling.deepspeed_zero3 import deepspeed_available
from project02_fsdp_scaling.parity import judge, pair_parity
from project02_fsdp_scaling.scaling import launch
from shared.cli import writable_dir

# The comparison's own training defaults; preset auto and global batch 0 take the tier's value.
# The precision is the harness's (--precisions), one pair of jobs per entry.
COMPARE_TRAIN = TrainConfig(preset="auto", global_batch=0, steps=6, warmup_steps=1, lr=1e-3)


@dataclass
class CompareConfig:
    """Run the same training job through FSDP2 and DeepSpeed ZeRO-3, in bf16 mixed precision and
    in float32, and compare throughput, memory and loss parity. Preset auto: tiny on CPU, 1b on
    GPUs; global batch 0: 8 on CPU, 16 on GPUs. The job runs eager with SDPA (what the DeepSpeed
    path runs), gradient clipping set explicitly in both paths; each job's device, precision and
    output files are the comparison's."""

    world_size: int = 2
    """processes (GPUs, or CPU processes over gloo)"""
    precisions: tuple[DeepSpeedPrecisionName, ...] = ("bf16", "fp32")
    """one FSDP2 / DeepSpeed pair of jobs per entry, in this order. bf16: FSDP2
    MixedPrecisionPolicy(param bf16, reduce fp32) against DeepSpeed bf16 (fp32 master weights
    and gradient communication); fp32: neither mixed. Loss parity is judged only when both
    are run (the tolerance is FSDP2's own bf16-vs-float32 gap)"""
    equal_start: bool = True
    """bf16 pairs: both start from the bf16 image of the initial weights (DeepSpeed's master
    weights start there anyway); --no-equal-start leaves FSDP2 at the float32 weights"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: a new runs/<UTC time>/; reports/ only when named)"""
    name: str = ""
    """result file stem; default compare_gpu or compare_cpu"""
    timeout_s: int = 1800
    """wall-clock limit of each job"""
    train: Train = field(default_factory=lambda: replace(COMPARE_TRAIN))

    def validate(self) -> CompareConfig:
        check_preset(self.train.preset, allow_auto=True)
        check_name(self.name)
        for name in ("world_size", "timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        allowed = get_args(DeepSpeedPrecisionName)
        if not self.precisions or any(p not in allowed for p in self.precisions):
            raise ValueError(
                f"precisions must name one or more of {allowed}, got {list(self.precisions)}"
            )
        if len(set(self.precisions)) != len(self.precisions):
            raise ValueError(f"precisions names one twice: {list(self.precisions)}")
        if self.train.global_batch < 0:
            raise ValueError(
                f"global_batch must be >= 0 (0 = the tier's default), got {self.train.global_batch}"
            )
        set_by_harness(
            self.train,
            "compare",
            ("device", "out", "save_params", "trace_dir"),
            "GPUs when visible, else CPU; records and parameters in temporary files",
        )
        set_by_harness(
            self.train,
            "compare",
            ("precision", "bf16_rounded_init"),
            "one pair of jobs per --precisions entry, started as --equal-start says",
        )
        for p in self.precisions:  # what DeepSpeed cannot run, named before any job
            DeepSpeedConfig.from_train(replace(self.train, precision=p))
        check_reports_dir(self.reports_dir)
        return self


def _summary(rec: dict) -> dict:
    return {
        "status": "ok",
        "tokens_per_s": rec["tokens_per_s"],
        "step_time_s": rec["step_time_s"]["median"],
        "peak_memory_gib": rec["peak_memory_gib"],
        "memory_kind": rec["memory_kind"],
        "compute_dtype": rec.get("compute_dtype"),
        "losses": rec["losses"],
        "last_loss": rec["losses"][-1],
        "grad_norms": rec["grad_norms"],
    }


def param_parity(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    if set(a) != set(b):
        raise ValueError(f"parameter names differ: {sorted(set(a) ^ set(b))[:6]}")
    max_abs = max(float((a[k] - b[k]).abs().max()) for k in a)
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a)
    den = sum(float(a[k].pow(2).sum()) for k in a)
    return {"max_param_abs_diff": max_abs, "param_rel_l2": (num / den) ** 0.5}


def _pair(train: TrainConfig, cfg: CompareConfig, on_gpu: bool, tmp: str) -> dict:
    """One precision: the FSDP2 job, then the DeepSpeed job; their summaries and parity."""
    key_of = {"fsdp": "train", "deepspeed": "deepspeed"}
    run: dict = {"precision": train.precision, "bf16_rounded_init": train.bf16_rounded_init}
    params = {}
    for key, job in (("fsdp", train), ("deepspeed", DeepSpeedConfig.from_train(train))):
        if key == "deepspeed":
            ok, why = deepspeed_available()
            if not ok:
                run[key] = {"status": "skipped", "note": why}
                run["note"] = f"DeepSpeed side not run: {why}."
                continue
        stem = f"{tmp}/{key}_{train.precision}"
        job = replace(job, out=f"{stem}.json", save_params=f"{stem}.pt")
        rc, tail = launch(
            cfg.world_size, key_of[key], cli_flags(job), on_gpu=on_gpu, timeout_s=cfg.timeout_s
        )
        if rc != 0 or not Path(job.out).is_file():
            run[key] = {"status": "failed", "returncode": rc, "note": tail[-2000:]}
            continue
        run[key] = _summary(json.loads(Path(job.out).read_text()))
        params[key] = torch.load(job.save_params)
        Path(job.save_params).unlink()  # 4.4 GB at 1b: one pair's on disk at a time
    parity = pair_parity(run)
    if parity is not None:
        run["parity"] = {**parity, **param_parity(params["fsdp"], params["deepspeed"])}
    return run


def run(cfg: CompareConfig) -> Path:
    """`compare`: for each precision the FSDP2 job, then the DeepSpeed job, as torchrun jobs;
    the JSON record, Markdown and loss chart, rewritten after each precision. Returns the JSON
    path."""
    from shared.results import environment, output_root

    cfg.validate()
    on_gpu = torch.cuda.is_available()
    available = torch.cuda.device_count() if on_gpu else 2**31
    if cfg.world_size > available:
        raise ValueError(f"world_size {cfg.world_size} needs that many GPUs; {available} visible")
    given = cfg.train
    train = replace(
        given,
        preset=given.preset if given.preset != "auto" else ("1b" if on_gpu else "tiny"),
        global_batch=given.global_batch or (16 if on_gpu else 8),
        device="cuda" if on_gpu else "cpu",
    ).validate(cfg.world_size)
    tier = "gpu" if on_gpu else "cpu"
    root = output_root(cfg.reports_dir)
    name = cfg.name or f"compare_{tier}"
    out_dir = writable_dir("--reports-dir", root / PROJECT)  # before the runs
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "tier": tier,
        "preset": train.preset,
        "world_size": cfg.world_size,
        "precisions": list(cfg.precisions),
        "equal_start": cfg.equal_start,
        "steps_total": train.warmup_steps + train.steps,
        "warmup_steps": train.warmup_steps,
        "global_batch": train.global_batch,
        "seq_len": train.resolved_seq_len(),
        "grad_clip": train.grad_clip,
        "runs": [],
        "tolerance": None,
    }
    per_run = {"precision": None, "bf16_rounded_init": None}  # set per run: see "runs"
    config = {"compare": portable(asdict(cfg)), "train": portable({**asdict(train), **per_run})}
    env = environment()
    path = None
    with tempfile.TemporaryDirectory() as tmp:
        for precision in cfg.precisions:
            job = replace(
                train,
                precision=precision,
                bf16_rounded_init=cfg.equal_start and precision == "bf16",
            )
            results["runs"].append(_pair(job, cfg, on_gpu, tmp))
            results["tolerance"] = judge(results["runs"])
            path = _publish(results, config, env, root, out_dir, name)
    print(Path(path).with_suffix(".md").read_text(), flush=True)
    failed = [
        f"{k} {r['precision']}"
        for r in results["runs"]
        for k in ("fsdp", "deepspeed")
        if r.get(k, {}).get("status") == "failed"
    ]
    if failed:
        raise RuntimeError(f"{failed} failed; see {path}")
    return path


def _publish(results: dict, config: dict, env: dict, root, out_dir: Path, name: str) -> Path:
    """The record, its Markdown and its loss chart, as they stand."""
    from project02_fsdp_scaling.compare_report import compare_charts, compare_markdown
    from shared.results import atomic_write_text, load_result, save_result

    path = save_result(PROJECT, name, results, config=config, reports_dir=root, env=env)
    rec = load_result(path)
    compare_charts(rec, out_dir, name)
    atomic_write_text(path.with_suffix(".md"), compare_markdown(rec, name=name))
    return path


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["compare", *sys.argv[1:]]))
