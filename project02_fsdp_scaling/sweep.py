"""One-GPU sweep: which training configuration gives the highest MFU on this GPU.

    python -m project02_fsdp_scaling sweep --preset 1b --variants eager,compile,compile+ac
    python -m project02_fsdp_scaling sweep --global-batch 64 --micro-batch 16 \
        --variants compile+cudnn+noreshard,compile+cudnn+noreshard+cdt,compile+cudnn+noreshard+mb32 \
        --repeats 3

Every variant is the same FSDP2 job in a world of one (bf16 parameters, fp32 reduction, fused
AdamW, clipping), differing only in how it runs: eager or `torch.compile` per block, with or
without activation checkpointing (`+ac`), with SDPA's backend forced (`+cudnn`, `+flash`), with
parameters kept gathered between forward and backward (`+noreshard`), and the levers tried on
the bf16 profile: Inductor's coordinate-descent kernel tuning (`+cdt`), the max-autotune compile
mode (`+autotune`), a reduce-scatter after every micro-batch (`+syncmb`), the fused output
projection and loss (`+fusedloss`), another micro-batch size (`+mb32`). One process runs them
all from one initialised model (compile caches are reset between variants); the eager variant,
when listed, is the baseline. With --repeats N the list runs N times, the order reversed on
every other pass, and each figure is the median over the passes with its range. Writes
<reports-dir>/project02_fsdp_scaling/sweep_<tier>.json and .md.
"""

from __future__ import annotations

import gc
import re
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
from shared.repeat import merge_runs, repetition_order, row_ratio
from shared.results import output_root

_MODIFIERS = {
    "ac": {"activation_checkpointing": True},
    "cudnn": {"attention": "cudnn"},
    "flash": {"attention": "flash"},
    "noreshard": {"reshard_after_forward": False},
    "fp32": {"precision": "fp32"},  # no mixed precision: the bf16 speed-up's baseline
    "cdt": {"coordinate_descent_tuning": True},
    "autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
    "syncmb": {"sync_every_microbatch": True},
    "fusedloss": {"fused_loss": True},
}
_MICRO_BATCH = re.compile(r"^mb([1-9][0-9]*)$")  # +mb32: micro-batch 32 for this variant
# The TrainConfig fields a variant sets (see parse_variant), with their values when no modifier
# sets them.
_UNMODIFIED = {
    "activation_checkpointing": False,
    "attention": "sdpa",
    "reshard_after_forward": True,
    "precision": "bf16",
    "coordinate_descent_tuning": False,
    "compile_mode": "default",
    "sync_every_microbatch": False,
    "fused_loss": False,
}
SWEPT = ("compile", *_UNMODIFIED)


def parse_variant(name: str) -> dict:
    """'compile+ac' -> TrainConfig overrides. The first part is eager or compile; `+mbN` sets
    the micro-batch (otherwise the sweep's --micro-batch)."""
    parts = [p.strip() for p in str(name).split("+")]
    if parts[0] not in ("eager", "compile"):
        raise ValueError(f"variant {name!r} must start with 'eager' or 'compile'")
    out = {"compile": parts[0] == "compile", **_UNMODIFIED}
    for p in parts[1:]:
        if m := _MICRO_BATCH.match(p):
            out["micro_batch"] = int(m.group(1))
        elif p in _MODIFIERS:
            out.update(_MODIFIERS[p])
        else:
            raise ValueError(
                f"variant {name!r}: unknown modifier {p!r}; expected one of "
                f"{sorted(_MODIFIERS)} or mbN (micro-batch N)"
            )
    return out


@dataclass
class SweepConfig:
    """Sweep one-GPU training variants of FSDP2 (world of one) and pick the best by MFU. Each
    variant sets compile, activation checkpointing, the attention backend, resharding and the
    parameter dtype; the other training flags are the same for all."""

    variants: str = "eager,eager+ac,compile,compile+ac,compile+cudnn"
    """comma-separated: eager|compile, then any of +ac, +cudnn, +flash, +noreshard, +fp32, and
    (compile only) +cdt, +autotune; +syncmb, +fusedloss, +mbN (micro-batch N)"""
    repeats: int = 1
    """passes over the variant list, the order reversed on every other pass; figures are the
    median over the passes with their range (a lever worth 1% needs 3 or more)"""
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
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        set_by_harness(
            self.train,
            "the sweep",
            (*SWEPT, "profile", "device", "out", "save_params", "trace_dir"),
            "the variants set compile and its tuning, activation checkpointing, attention, "
            "resharding, the gradient sync, the fused loss and the parameter dtype (+fusedloss, "
            "+syncmb, +cdt, ...); steps are timed without the profiler, on the GPU when visible, "
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


# Figures of a variant that are medians over repeated passes (with _min, _max, _reps); the step
# times (median, p20, p80 and every step) stay the first pass's, one consistent set.
RANGED = ("tokens_per_s", "mfu", "achieved_tflops_per_device")


def _variant_summary(variant: str, r: dict) -> dict:
    """One pass of one variant, as the record keeps it."""
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


def _collect(names: list[str], passes: dict, failed: dict, not_run: dict) -> list[dict]:
    """The variants as the record lists them, in the order asked for: the passes of each merged
    (`RANGED` figures their median over the passes with the range, peak memory the largest),
    a failure or a skip where a variant has no pass; variants not reached yet are left out."""
    out = []
    for v in names:
        if passes[v]:
            row = merge_runs(passes[v], RANGED, largest=("peak_memory_gib",))
            row["runs"] = len(passes[v])
            if v in failed:  # it ran, then failed in a later pass (and was not run again)
                row["failed_pass"] = failed[v]["error"]
            out.append(row)
        elif v in failed:
            out.append(failed[v])
        elif v in not_run:
            out.append(not_run[v])
    return out


def run(cfg: SweepConfig) -> Path:
    """`sweep`: run every variant, `repeats` passes, in this process; the record is rewritten
    after each variant, so a run cut short still leaves what it measured. Returns the JSON
    path."""
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
    passes: dict[str, list[dict]] = {v: [] for v in names}
    failed: dict[str, dict] = {}  # a variant that failed is not run again
    not_run: dict[str, dict] = {}
    meta = {"seq_len": base.resolved_seq_len(), "flops_per_token": None}
    path = None
    done, todo = 0, len(names) * cfg.repeats
    try:
        template = build_cpu_model(base.model_args(), base.seed)
        for rep in range(cfg.repeats):
            for v in repetition_order(names, rep):
                done += 1
                if v in failed:
                    continue
                elapsed = time.monotonic() - t_start
                if cfg.max_seconds and elapsed > cfg.max_seconds:
                    log.warning(
                        "variant %s, pass %d not run: time budget of %d s spent",
                        v,
                        rep + 1,
                        cfg.max_seconds,
                    )
                    not_run[v] = {
                        "variant": v,
                        "status": "not run",
                        "error": f"time budget of {cfg.max_seconds} s spent",
                    }
                    continue
                log.info(
                    "=== variant %s, pass %d of %d (%d of %d, %s so far)",
                    v,
                    rep + 1,
                    cfg.repeats,
                    done,
                    todo,
                    human_seconds(elapsed),
                )
                tc = replace(base, **parse_variant(v))
                try:
                    result, _ = run_training(tc, info, template=template)
                    passes[v].append(_variant_summary(v, result))
                    meta = {
                        "seq_len": result["seq_len"],
                        "flops_per_token": result["flops_per_token"],
                    }
                except Exception as e:  # one failing variant (OOM, backend) must not end it
                    log.warning("variant %s failed: %s", v, e)
                    failed[v] = {
                        "variant": v,
                        "status": "failed",
                        "error": repr(e)[:500],
                        "traceback": traceback.format_exc()[-2000:],
                    }
                torch._dynamo.reset()
                gc.collect()
                if on_gpu:
                    torch.cuda.empty_cache()
                variants = _collect(names, passes, failed, not_run)
                path = _save(cfg, base, on_gpu, variants, meta)
    finally:
        cleanup()
    if path is None:
        path = _save(cfg, base, on_gpu, _collect(names, passes, failed, not_run), meta)
    print(Path(path).with_suffix(".md").read_text(), flush=True)
    return path


def _save(cfg: SweepConfig, base: TrainConfig, on_gpu: bool, variants: list[dict], meta) -> Path:
    from project02_fsdp_scaling import report
    from shared.results import atomic_write_text, environment, load_result, save_result

    ok = [v for v in variants if v["status"] == "ok"]
    eager = next((v for v in ok if v["variant"] == "eager"), None)
    for v in ok:  # the median of the per-pass ratios (passes are paired: one list order each)
        speedup = row_ratio(v, eager, "tokens_per_s") if eager else None
        v["speedup_vs_eager"] = speedup.median if speedup else None
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
        "repeats": cfg.repeats,
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
