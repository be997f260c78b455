"""One-GPU sweep: which training configuration gives the highest MFU on this GPU.

    python -m project02_fsdp_scaling.sweep --preset 1b --variants eager,compile,compile+ac

Every variant is the same FSDP2 job in a world of one (bf16 parameters, fp32 reduction, fused
AdamW, clipping), differing only in how it runs: eager or `torch.compile` per block, with or
without activation checkpointing (`+ac`), with SDPA's backend forced (`+cudnn`, `+flash`), with
parameters kept gathered between forward and backward (`+noreshard`). One process runs them all
from one initialised model (compile caches are reset between variants); the eager variant is the
baseline. Writes reports/project02_fsdp_scaling/sweep_<tier>.json and .md.
"""

from __future__ import annotations

import gc
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from project02_fsdp_scaling.config import (
    TrainConfig,
    check_name,
    check_preset,
    parse_cli,
    portable,
)
from shared.cli import main_guard, writable_dir
from shared.progress import human_seconds
from shared.results import REPORTS_DIR

PROJECT = "project02_fsdp_scaling"

_MODIFIERS = {
    "ac": {"activation_checkpointing": True},
    "cudnn": {"attention": "cudnn"},
    "flash": {"attention": "flash"},
    "noreshard": {"reshard_after_forward": False},
    "fp32": {"param_dtype": "float32"},  # no mixed precision: the bf16 speed-up's baseline
}


def parse_variant(name: str) -> dict:
    """'compile+ac' -> TrainConfig overrides. The first part is eager or compile."""
    parts = [p.strip() for p in str(name).split("+")]
    if parts[0] not in ("eager", "compile"):
        raise ValueError(f"variant {name!r} must start with 'eager' or 'compile'")
    out = {"compile": parts[0] == "compile", "activation_checkpointing": False,
           "attention": "sdpa", "reshard_after_forward": True,
           "param_dtype": "bfloat16"}  # fmt: skip
    for p in parts[1:]:
        if p not in _MODIFIERS:
            raise ValueError(
                f"variant {name!r}: unknown modifier {p!r}; expected one of {sorted(_MODIFIERS)}"
            )
        out.update(_MODIFIERS[p])
    return out


@dataclass
class SweepConfig:
    """Sweep one-GPU training variants of FSDP2 (world of one) and pick the best by MFU."""

    preset: str = "1b"
    variants: str = "eager,eager+ac,compile,compile+ac,compile+cudnn"
    """comma-separated: eager|compile, then +ac, +cudnn, +flash, +noreshard, +fp32"""
    global_batch: int = 32
    micro_batch: int = 8
    seq_len: int = 0
    steps: int = 3
    """timed steps per variant"""
    warmup_steps: int = 2
    reports_root: str = ""
    """reports folder (results go to <root>/project02_fsdp_scaling/); default the repo's reports/"""
    name: str = ""
    """result file stem; default sweep_gpu or sweep_cpu"""
    max_seconds: int = 0
    """start no new variant after this many seconds (0: no limit); the rest are marked not run"""

    def validate(self) -> SweepConfig:
        check_preset(self.preset)
        check_name(self.name)
        for name in ("global_batch", "micro_batch", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("seq_len", "warmup_steps", "max_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.reports_root:
            writable_dir("--reports-root", self.reports_root)
        self.variant_list()
        return self

    def variant_list(self) -> list[str]:
        names = [v.strip() for v in self.variants.split(",") if v.strip()]
        if not names:
            raise ValueError("variants must name at least one variant")
        for v in names:
            parse_variant(v)
        return names


def pick_best(ok: list[dict]) -> dict | None:
    """The variant the scaling run should use: the best MFU among the bf16 variants (an fp32
    variant's MFU is against the much lower fp32 peak, so it is not comparable), by throughput
    where a GPU peak is unknown."""
    if not ok:
        return None
    pool = [v for v in ok if str(v.get("compute_dtype")).endswith("bfloat16")] or ok
    by_mfu = all(v.get("mfu") is not None for v in pool)
    return max(pool, key=lambda v: v["mfu"] if by_mfu else v["tokens_per_s"])


def _variant_summary(variant: str, r: dict) -> dict:
    s = r["step_time_s"]
    return {
        "variant": variant,
        "status": "ok",
        "overrides": parse_variant(variant),
        "step_time_s": s["median"],
        "step_time_p20_s": s["p20"],
        "step_time_p80_s": s["p80"],
        "step_times_s": s["all"],
        "tokens_per_s": r["tokens_per_s"],
        "achieved_tflops_per_device": r["achieved_tflops_per_device"],
        "mfu": r["mfu"],
        "peak_memory_gib": r["peak_memory_gib"],
        "compute_dtype": r["compute_dtype"],
        "first_loss": r["losses"][0],
        "last_loss": r["losses"][-1],
        "losses": r["losses"],
    }


def run_sweep(cfg: SweepConfig) -> Path:
    """Run every variant in this process; the record is rewritten after each variant, so a run
    cut short still leaves what it measured. Returns the JSON path."""
    from project02_fsdp_scaling.train import build_cpu_model, log, run_training
    from shared.distributed import cleanup, init_distributed

    names = cfg.validate().variant_list()
    on_gpu = torch.cuda.is_available()
    base = TrainConfig(
        preset=cfg.preset,
        seq_len=cfg.seq_len,
        global_batch=cfg.global_batch,
        micro_batch=cfg.micro_batch,
        steps=cfg.steps,
        warmup_steps=cfg.warmup_steps,
        device="cuda" if on_gpu else "cpu",
    )
    for v in names:
        TrainConfig(**{**asdict(base), **parse_variant(v)}).validate(1)
    writable_dir("--reports-root", Path(cfg.reports_root or REPORTS_DIR) / PROJECT)
    info = init_distributed(device=base.device)
    if info.world_size != 1:
        raise ValueError(f"the sweep runs in a world of one; got WORLD_SIZE={info.world_size}")
    t_start = time.monotonic()
    variants: list[dict] = []
    meta = {"seq_len": base.resolved_seq_len(), "flops_per_token": None}
    path = None
    try:
        template = build_cpu_model(base.model_args(), base.seed)
        for i, v in enumerate(names, 1):
            elapsed = time.monotonic() - t_start
            if cfg.max_seconds and elapsed > cfg.max_seconds:
                log.warning("variant %s not run: time budget of %d s spent", v, cfg.max_seconds)
                variants.append({"variant": v, "status": "not run",
                                 "error": f"time budget of {cfg.max_seconds} s spent"})  # fmt: skip
                continue
            log.info("=== variant %s (%d of %d, %s so far)", v, i, len(names),
                     human_seconds(elapsed))  # fmt: skip
            tc = TrainConfig(**{**asdict(base), **parse_variant(v)})
            try:
                result, _ = run_training(tc, info, template=template)
                variants.append(_variant_summary(v, result))
                meta = {
                    "seq_len": result["seq_len"],
                    "flops_per_token": result["flops_per_token"],
                }
            except Exception as e:  # one failing variant (OOM, backend) must not end the sweep
                log.warning("variant %s failed: %s", v, e)
                variants.append({"variant": v, "status": "failed", "error": repr(e)[:500],
                                 "traceback": traceback.format_exc()[-2000:]})  # fmt: skip
            torch._dynamo.reset()
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()
            path = _save(cfg, base, on_gpu, variants, meta)
    finally:
        cleanup()
    if path is None:
        path = _save(cfg, base, on_gpu, variants, meta)
    print(Path(path).with_suffix(".md").read_text(), flush=True)
    return path


def _save(cfg: SweepConfig, base: TrainConfig, on_gpu: bool, variants: list[dict], meta) -> Path:
    from project02_fsdp_scaling import report
    from shared.results import REPORTS_DIR, atomic_write_text, environment, load_result, save_result

    ok = [v for v in variants if v["status"] == "ok"]
    eager = next((v for v in ok if v["variant"] == "eager"), None)
    for v in ok:
        v["speedup_vs_eager"] = v["tokens_per_s"] / eager["tokens_per_s"] if eager else None
    best = pick_best(ok)
    results = {
        "tier": "gpu" if on_gpu else "cpu",
        "preset": cfg.preset,
        "world_size": 1,
        "global_batch": cfg.global_batch,
        "micro_batch": cfg.micro_batch,
        "steps": cfg.steps,
        "warmup_steps": cfg.warmup_steps,
        "grad_clip": base.grad_clip,
        **meta,
        "variants": variants,
        "best": {k: best[k] for k in ("variant", "overrides", "mfu", "tokens_per_s")}
        if best
        else None,
    }
    root = Path(cfg.reports_root) if cfg.reports_root else Path(REPORTS_DIR)
    name = cfg.name or ("sweep_gpu" if on_gpu else "sweep_cpu")
    path = save_result(
        PROJECT,
        name,
        results,
        baseline={"variant": "eager", "tokens_per_s": eager["tokens_per_s"]} if eager else None,
        config=portable(asdict(cfg)),
        reports_dir=root,
        env=environment(),
    )
    atomic_write_text(path.with_suffix(".md"), report.sweep_markdown(load_result(path)))
    return path


@main_guard
def main(argv: list[str] | None = None) -> int:
    cfg = parse_cli(SweepConfig, argv, prog=f"python -m {PROJECT}.sweep")
    run_sweep(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
