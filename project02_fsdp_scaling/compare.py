"""FSDP2 vs DeepSpeed ZeRO-3, side by side at one world size: throughput, memory, loss parity.

    python -m project02_fsdp_scaling.compare --world-size 2          # CPU: tiny, fp32, gloo
    python -m project02_fsdp_scaling.compare --world-size 8 --preset 1b

Both jobs get the same flags (model, seed, data, global batch, micro-batch, AdamW, clipping) and
run as `torchrun` jobs one after the other; each saves its final full parameters, so parity is
checked on the weights as well as on the per-step loss. Without deepspeed installed the record
says so and holds the FSDP side only. Writes reports/project02_fsdp_scaling/compare_<tier>.json,
.md and a loss-curve chart.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from project02_fsdp_scaling.config import (
    DTypeName,
    TrainConfig,
    check_name,
    check_preset,
    cli_flags,
    parse_cli,
    portable,
)
from project02_fsdp_scaling.deepspeed_zero3 import deepspeed_available
from project02_fsdp_scaling.scaling import PROJECT, launch
from shared.cli import main_guard, writable_dir


@dataclass
class CompareConfig:
    """Run the same training job through FSDP2 and DeepSpeed ZeRO-3 and compare them."""

    world_size: int = 2
    """processes (GPUs, or CPU processes over gloo)"""
    preset: str = "auto"
    """model preset; auto = tiny on CPU, 1b on GPUs"""
    param_dtype: DTypeName = "float32"
    """float32 checks parity to rounding; bfloat16 compares the mixed-precision paths"""
    global_batch: int = 0
    """0 = 8 on CPU, 16 on GPUs"""
    micro_batch: int = 0
    """0 = the whole local batch"""
    steps: int = 6
    warmup_steps: int = 1
    lr: float = 1e-3
    grad_clip: float = 1.0
    """set explicitly in both paths"""
    reports_root: str = ""
    name: str = ""
    """default compare_gpu or compare_cpu"""
    timeout_s: int = 1800

    def validate(self) -> CompareConfig:
        check_preset(self.preset, allow_auto=True)
        check_name(self.name)
        for name in ("world_size", "steps", "timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("global_batch", "micro_batch", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "grad_clip"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if self.reports_root:
            writable_dir("--reports-root", self.reports_root)
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


def run_compare(cfg: CompareConfig) -> Path:
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
    train = TrainConfig(
        preset=cfg.preset if cfg.preset != "auto" else ("1b" if on_gpu else "tiny"),
        global_batch=cfg.global_batch or (16 if on_gpu else 8),
        micro_batch=cfg.micro_batch,
        steps=cfg.steps,
        warmup_steps=cfg.warmup_steps,
        lr=cfg.lr,
        grad_clip=cfg.grad_clip,
        param_dtype=cfg.param_dtype,
        device="cuda" if on_gpu else "cpu",
    ).validate(cfg.world_size)
    tier = "gpu" if on_gpu else "cpu"
    root = Path(cfg.reports_root) if cfg.reports_root else Path(REPORTS_DIR)
    name = cfg.name or f"compare_{tier}"
    out_dir = writable_dir("--reports-root", root / PROJECT)  # before the runs, not after
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "tier": tier,
        "preset": train.preset,
        "world_size": cfg.world_size,
        "param_dtype": cfg.param_dtype,
        "steps_total": train.warmup_steps + train.steps,
        "grad_clip": cfg.grad_clip,
        "note": None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        params = {}
        for key, module in (
            ("fsdp", f"{PROJECT}.train"),
            ("deepspeed", f"{PROJECT}.deepspeed_zero3"),
        ):
            if key == "deepspeed":
                ok, why = deepspeed_available()
                if not ok:
                    results[key] = {"status": "skipped", "note": why}
                    results["note"] = f"DeepSpeed side not run: {why}."
                    continue
            run = TrainConfig(**{**asdict(train), "out": f"{tmp}/{key}.json",
                                 "save_params": f"{tmp}/{key}.pt"})  # fmt: skip
            rc, tail = launch(
                cfg.world_size, module, cli_flags(run), on_gpu=on_gpu, timeout_s=cfg.timeout_s
            )
            if rc != 0 or not Path(run.out).is_file():
                results[key] = {"status": "failed", "returncode": rc, "note": tail[-2000:]}
                continue
            results[key] = _summary(json.loads(Path(run.out).read_text()))
            params[key] = torch.load(run.save_params)
        if len(params) == 2:
            fs, ds = results["fsdp"]["losses"], results["deepspeed"]["losses"]
            results["parity"] = {
                "max_loss_diff": max(abs(a - b) for a, b in zip(fs, ds)),
                **param_parity(params["fsdp"], params["deepspeed"]),
            }
    path = save_result(
        PROJECT, name, results, config={"compare": portable(asdict(cfg)),
                                        "train": portable(asdict(train))},
        reports_dir=root, env=environment(),
    )  # fmt: skip
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


@main_guard
def main(argv: list[str] | None = None) -> int:
    run_compare(parse_cli(CompareConfig, argv, prog=f"python -m {PROJECT}.compare"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
