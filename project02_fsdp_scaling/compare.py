"""FSDP2 vs DeepSpeed ZeRO-3, side by side at one world size: throughput, memory, loss parity.

    python -m project02_fsdp_scaling compare --world-size 2          # CPU: tiny, fp32, gloo
    python -m project02_fsdp_scaling compare --world-size 8 --preset 1b

Both jobs get the same flags (model, seed, data, global batch, micro-batch, AdamW, clipping) and
run as `torchrun` jobs one after the other; each saves its final full parameters, so parity is
checked on the weights as well as on the per-step loss. Without deepspeed installed the record
says so and holds the FSDP side only. Writes <reports-dir>/project02_fsdp_scaling/
compare_<tier>.json, .md and a loss-curve chart.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from project02_fsdp_scaling.config import (
    DeepSpeedConfig,
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
from project02_fsdp_scaling.scaling import PROJECT, launch
from shared.cli import writable_dir

# The comparison's own training defaults: float32 checks parity to rounding (bfloat16 compares
# the mixed-precision paths); preset auto and global batch 0 take the tier's value.
COMPARE_TRAIN = TrainConfig(
    preset="auto", param_dtype="float32", global_batch=0, steps=6, warmup_steps=1, lr=1e-3
)


@dataclass
class CompareConfig:
    """Run the same training job through FSDP2 and DeepSpeed ZeRO-3 and compare throughput,
    memory and loss parity. Preset auto: tiny on CPU, 1b on GPUs; global batch 0: 8 on CPU, 16
    on GPUs. The job runs eager with SDPA (what the DeepSpeed path runs), gradient clipping set
    explicitly in both paths; each job's device and output files are the comparison's."""

    world_size: int = 2
    """processes (GPUs, or CPU processes over gloo)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: the repository's reports/)"""
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
        DeepSpeedConfig.from_train(self.train)  # what DeepSpeed cannot run, named before any job
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


def run(cfg: CompareConfig) -> Path:
    """`compare`: the FSDP2 job, then the DeepSpeed job, as torchrun jobs; the JSON record,
    Markdown and loss chart. Returns the JSON path."""
    from shared.results import (
        REPORTS_DIR,
        atomic_write_text,
        environment,
        load_result,
        save_result,
    )

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
    root = Path(cfg.reports_dir) if cfg.reports_dir is not None else Path(REPORTS_DIR)
    name = cfg.name or f"compare_{tier}"
    out_dir = writable_dir("--reports-dir", root / PROJECT)  # before the runs, not after
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "tier": tier,
        "preset": train.preset,
        "world_size": cfg.world_size,
        "param_dtype": train.param_dtype,
        "steps_total": train.warmup_steps + train.steps,
        "grad_clip": train.grad_clip,
        "note": None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        params = {}
        for key, command, job in (
            ("fsdp", "train", train),
            ("deepspeed", "deepspeed", DeepSpeedConfig.from_train(train)),
        ):
            if key == "deepspeed":
                ok, why = deepspeed_available()
                if not ok:
                    results[key] = {"status": "skipped", "note": why}
                    results["note"] = f"DeepSpeed side not run: {why}."
                    continue
            job = replace(job, out=f"{tmp}/{key}.json", save_params=f"{tmp}/{key}.pt")
            rc, tail = launch(
                cfg.world_size, command, cli_flags(job), on_gpu=on_gpu, timeout_s=cfg.timeout_s
            )
            if rc != 0 or not Path(job.out).is_file():
                results[key] = {"status": "failed", "returncode": rc, "note": tail[-2000:]}
                continue
            results[key] = _summary(json.loads(Path(job.out).read_text()))
            params[key] = torch.load(job.save_params)
        if len(params) == 2:
            fs, ds = results["fsdp"]["losses"], results["deepspeed"]["losses"]
            results["parity"] = {
                "max_loss_diff": max(abs(a - b) for a, b in zip(fs, ds)),
                **param_parity(params["fsdp"], params["deepspeed"]),
            }
    path = save_result(
        PROJECT,
        name,
        results,
        config={"compare": portable(asdict(cfg)), "train": portable(asdict(train))},
        reports_dir=root,
        env=environment(),
    )
    rec = load_result(path)
    from project02_fsdp_scaling.report import compare_chart, compare_markdown

    compare_chart(rec, out_dir, name)

    md = compare_markdown(rec, name=name)
    atomic_write_text(path.with_suffix(".md"), md)
    print(md, flush=True)
    failed = [k for k in ("fsdp", "deepspeed") if results.get(k, {}).get("status") == "failed"]
    if failed:
        raise RuntimeError(f"{failed} failed; see {path}")
    return path


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["compare", *sys.argv[1:]]))
