"""One-GPU sweep: which training configuration gives the highest MFU on this GPU.

    python -m project02_fsdp_scaling sweep --preset 1b --variants eager,compile,compile+ac

Every variant is the same FSDP2 job in a world of one (bf16 parameters, fp32 reduction, fused
AdamW, clipping), differing only in how it runs: eager or `torch.compile` per block, with or
without activation checkpointing (`+ac`), with SDPA's backend forced (`+cudnn`, `+flash`), with
parameters kept gathered between forward and backward (`+noreshard`). One process runs them all
from one initialised model (compile caches are reset between variants); the eager variant is the
baseline. Writes <reports-dir>/project02_fsdp_scaling/sweep_<tier>.json and .md.
"""

from __future__ import annotations

import gc
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from project02_fsdp_scaling import PROJECT
from project02_fsdp_scaling.config import (
    Train,
    TrainConfig,
    check_name,
    check_preset,
    check_reports_dir,
    portable,
    set_by_harness,
)
from shared.cli import writable_dir
from shared.progress import human_seconds
from shared.results import output_root

_MODIFIERS = {
    "ac": {"activation_checkpointing": True},
    "cudnn": {"attention": "cudnn"},
    "flash": {"attention": "flash"},
    "noreshard": {"reshard_after_forward": False},
    "fp32": {"precision": "fp32"},  # no mixed precision: the bf16 speed-up's baseline
}
# The TrainConfig fields a variant sets (see parse_variant).
SWEPT = ("compile", "activation_checkpointing", "attention", "reshard_after_forward", "precision")


def parse_variant(name: str) -> dict:
    """'compile+ac' -> TrainConfig overrides. The first part is eager or compile."""
    parts = [p.strip() for p in str(name).split("+")]
    if parts[0] not in ("eager", "compile"):
        raise ValueError(f"variant {name!r} must start with 'eager' or 'compile'")
    out = {
        "compile": parts[0] == "compile",
        "activation_checkpointing": False,
        "attention": "sdpa",
        "reshard_after_forward": True,
        "precision": "bf16",
    }
    for p in parts[1:]:
        if p not in _MODIFIERS:
            raise ValueError(
                f"variant {name!r}: unknown modifier {p!r}; expected one of {sorted(_MODIFIERS)}"
            )
        out.update(_MODIFIERS[p])
    return out


@dataclass
class SweepConfig:
    """Sweep one-GPU training variants of FSDP2 (world of one) and pick the best by MFU. Each
    variant sets compile, activation checkpointing, the attention backend, resharding and the
    parameter dtype; the other training flags are the same for all."""

    variants: str = "eager,eager+ac,compile,compile+ac,compile+cudnn"
    """comma-separated: eager|compile, then +ac, +cudnn, +flash, +noreshard, +fp32"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: a new runs/<UTC time>/; reports/ only when named)"""
    name: str = ""
    """result file stem; default sweep_gpu or sweep_cpu"""
    max_seconds: int = 0
    """start no new variant after this many seconds (0: no limit); the rest are marked not run"""
    train: Train = field(
        default_factory=lambda: TrainConfig(preset="1b", global_batch=32, micro_batch=8, steps=3)
    )

    def validate(self) -> SweepConfig:
        check_preset(self.train.preset)
        check_name(self.name)
        for name in ("global_batch", "micro_batch", "steps"):
            if getattr(self.train, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self.train, name)}")
        for name in ("seq_len", "warmup_steps"):
            if getattr(self.train, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self.train, name)}")
        if self.max_seconds < 0:
            raise ValueError(f"max_seconds must be >= 0, got {self.max_seconds}")
        set_by_harness(
            self.train,
            "the sweep",
            (*SWEPT, "profile", "device", "out", "save_params", "trace_dir"),
            "the variants set compile, activation checkpointing, attention, resharding and the "
            "parameter dtype; steps are timed without the profiler, on the GPU when visible, "
            "into the sweep's own record",
        )
        check_reports_dir(self.reports_dir)
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


def run(cfg: SweepConfig) -> Path:
    """`sweep`: run every variant in this process; the record is rewritten after each variant,
    so a run cut short still leaves what it measured. Returns the JSON path."""
    from project02_fsdp_scaling.train import build_cpu_model, log, run_training
    from shared.distributed import cleanup, init_distributed

    names = cfg.validate().variant_list()
    cfg = replace(cfg, reports_dir=str(output_root(cfg.reports_dir)))  # one folder for every save
    on_gpu = torch.cuda.is_available()
    base = replace(cfg.train, device="cuda" if on_gpu else "cpu")
    for v in names:
        replace(base, **parse_variant(v)).validate(1)
    writable_dir("--reports-dir", Path(cfg.reports_dir) / PROJECT)
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
                variants.append(
                    {
                        "variant": v,
                        "status": "not run",
                        "error": f"time budget of {cfg.max_seconds} s spent",
                    }
                )
                continue
            log.info(
                "=== variant %s (%d of %d, %s so far)", v, i, len(names), human_seconds(elapsed)
            )
            tc = replace(base, **parse_variant(v))
            try:
                result, _ = run_training(tc, info, template=template)
                variants.append(_variant_summary(v, result))
                meta = {
                    "seq_len": result["seq_len"],
                    "flops_per_token": result["flops_per_token"],
                }
            except Exception as e:  # one failing variant (OOM, backend) must not end the sweep
                log.warning("variant %s failed: %s", v, e)
                variants.append(
                    {
                        "variant": v,
                        "status": "failed",
                        "error": repr(e)[:500],
                        "traceback": traceback.format_exc()[-2000:],
                    }
                )
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
    from shared.results import atomic_write_text, environment, load_result, save_result

    ok = [v for v in variants if v["status"] == "ok"]
    eager = next((v for v in ok if v["variant"] == "eager"), None)
    for v in ok:
        v["speedup_vs_eager"] = v["tokens_per_s"] / eager["tokens_per_s"] if eager else None
    best = pick_best(ok)
    results = {
        "tier": "gpu" if on_gpu else "cpu",
        "preset": base.preset,
        "world_size": 1,
        "global_batch": base.global_batch,
        "micro_batch": base.micro_batch,
        "steps": base.steps,
        "warmup_steps": base.warmup_steps,
        "grad_clip": base.grad_clip,
        **meta,
        "variants": variants,
        "best": {k: best[k] for k in ("variant", "overrides", "mfu", "tokens_per_s")}
        if best
        else None,
    }
    root = Path(cfg.reports_dir)  # resolved once by run()
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


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["sweep", *sys.argv[1:]]))
