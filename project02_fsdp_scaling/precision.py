"""Mixed precision to the frontier: the same FSDP2 training job in bf16, fp8 (torchao, tensorwise
and rowwise scales) and fp16 (dynamic loss scaling), for loss parity and for throughput and cost.

    python -m project02_fsdp_scaling precision                  # CPU: tiny, short runs
    python -m project02_fsdp_scaling precision                  # GPU: 125m parity, 1b throughput
    python -m project02_fsdp_scaling precision --precisions bf16 fp8-rowwise --no-throughput

Two phases, one torchrun job per precision each, every job on the same seed, data and AdamW:

- parity: `--parity-preset` (125m on GPUs, tiny on CPU) for `--parity-steps` steps on the
  synthetic successor stream, which a model can learn (the loss falls well below ln(vocab)).
  Each precision's loss curve against bf16's, and the difference of their final losses (the mean
  of the last tenth of the steps, so that one noisy step does not decide it). fp16 also runs
  without loss scaling (`--no-fp16-unscaled-run` leaves it out), and both fp16 runs measure the share of gradient
  elements that underflow to zero without scaling (`train`'s `fp16_underflow`).
- throughput: `--throughput-preset` (1b / tiny) for a few timed steps: tokens/s, MFU against the
  precision's own dense peak and against the bf16 peak, peak memory, speed-up over bf16, and cost
  per million tokens at this GPU's on-demand and spot prices (`shared.hardware`).

The throughput figures are medians over repetitions (`shared.repeat`): with --repeats N (default 5
on GPUs, 1 on CPU) every recipe's throughput job runs N times, each a fresh torchrun job, the
recipes interleaved and their order reversed on alternate repetitions (bf16 fp8-tensorwise
fp8-rowwise fp16, then fp16 ... bf16), so that a drift of the GPU over the run falls on every
recipe alike. Each figure is stored as its median under its old name with its min, max and every
repetition (`shared.repeat.flat`); the speed-up over bf16 is taken per repetition (repetition i of
a recipe over repetition i of bf16) and summarised the same way; the cost comes from the median
tokens/s. A recipe whose job fails is not run again; its completed repetitions stand, with the
failure beside them. The parity phase runs once.

Training flags left at 0 take the tier's value: global batch 64 on GPUs (micro-batch 16) and 8 on
CPU (whole local batch). torch.compile and cuDNN attention run on GPUs only; parameters stay
gathered for the whole step (`--no-reshard-after-forward`: ZeRO-2's memory, which these models
afford, and no re-gather or re-cast per micro-batch; `--reshard-after-forward` restores ZeRO-3). Writes
<reports-dir>/project02_fsdp_scaling/precision_<tier>.json, its Markdown and charts, again after
each job (a run cut short keeps what finished).
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
    PrecisionName,
    Train,
    TrainConfig,
    check_name,
    check_preset,
    check_reports_dir,
    cli_flags,
    portable,
    set_by_harness,
)
from project02_fsdp_scaling.scaling import launch
from shared.cli import writable_dir
from shared.repeat import DEFAULT_REPEATS, Spread, flat, merge_runs, ratio, repetition_order

BASELINE = "bf16"
# The harness's own training defaults: 0 takes the tier's value (see PrecisionConfig).
PRECISION_TRAIN = TrainConfig(
    global_batch=0,
    warmup_steps=2,
    lr=1e-3,
    lr_warmup_steps=20,
    compile=True,
    attention="cudnn",
    reshard_after_forward=False,
)
# Micro-batch on GPUs when none is given: 16 sequences of the 1b preset fit a 141 GB GPU without
# activation checkpointing and halve the per-micro-batch casts and accumulation adds of 8 (what
# that bought is in the project's NOTES.md and precision_gpu.json).
GPU_MICRO_BATCH = 16
# The tail of a loss curve whose mean is the run's final loss.
FINAL_FRACTION = 0.1


@dataclass
class PrecisionConfig:
    """Train the same FSDP2 job in bf16, fp8 (tensorwise, rowwise) and fp16: loss curves on a
    learnable stream (parity) and tokens/s, MFU and cost per million tokens (throughput), one
    record. Training flags left at 0 take the tier's value: global batch 64 on GPUs (micro-batch
    16), 8 on CPU; compile and cuDNN attention on GPUs only; each job's precision, preset, steps,
    device and output files are the harness's. Throughput figures are medians over --repeats
    runs of each recipe's job (5 on GPUs, 1 on CPU) with their min-max; parity runs once."""

    precisions: tuple[PrecisionName, ...] = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp16")
    """the recipes, each run in both phases; bf16, the baseline, is added first when missing"""
    world_size: int = 1
    """processes per job (GPUs, or CPU processes over gloo)"""
    parity: bool = True
    """run the parity phase, once per recipe whatever --repeats (--no-parity: throughput only)"""
    parity_preset: str = "auto"
    """model of the parity phase; auto: 125m on GPUs, tiny on CPU"""
    parity_steps: int = 0
    """optimizer steps of each parity run; 0: 500 on GPUs, 40 on CPU"""
    fp16_unscaled_run: bool = True
    """with fp16 in the list, also run fp16 without loss scaling in the parity phase"""
    throughput: bool = True
    """run the throughput phase (--no-throughput: parity only)"""
    throughput_preset: str = "auto"
    """model of the throughput phase; auto: 1b on GPUs, tiny on CPU"""
    throughput_steps: int = 0
    """timed steps of each throughput run (after the warm-up steps); 0: 10 on GPUs, 4 on CPU"""
    repeats: int = 0
    """runs of each recipe's throughput job, each a fresh torchrun job, the recipes interleaved
    (order reversed on alternate repetitions); figures are the medians with their min-max, the
    speed-up over bf16 per repetition. 0: the tier's default, 5 on GPUs, 1 on CPU. The parity
    phase runs once"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: a new runs/<UTC time>/; reports/ only when named)"""
    name: str = ""
    """result file stem; default precision_gpu or precision_cpu"""
    timeout_s: int = 1800
    """wall-clock limit of each job"""
    keep_other_phases: bool = False
    """keep the phase this run leaves out (--no-parity or --no-throughput) from the record already
    at the output path, with the environment and training config it was measured with: the two
    phases as two invocations (e.g. two GPU sessions) into one record"""
    train: Train = field(default_factory=lambda: replace(PRECISION_TRAIN))

    def recipes(self) -> list[str]:
        """The precisions in run order, the bf16 baseline first."""
        return [BASELINE, *(p for p in self.precisions if p != BASELINE)]

    def validate(self) -> PrecisionConfig:
        allowed = tuple(p for p in get_args(PrecisionName) if p != "fp64")
        if not self.precisions or any(p not in allowed for p in self.precisions):
            raise ValueError(
                f"precisions must name one or more of {allowed}, got {list(self.precisions)}"
            )
        if len(set(self.precisions)) != len(self.precisions):
            raise ValueError(f"precisions names one twice: {list(self.precisions)}")
        if not (self.parity or self.throughput):
            raise ValueError("--no-parity and --no-throughput leave nothing to run")
        if self.keep_other_phases and self.parity and self.throughput:
            raise ValueError(
                "--keep-other-phases keeps a phase this run leaves out: add --no-parity or "
                "--no-throughput"
            )
        for name in ("parity_preset", "throughput_preset"):
            check_preset(getattr(self, name), allow_auto=True)
        check_name(self.name)
        for name in ("world_size", "timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 0:
            raise ValueError(
                f"repeats must be an integer >= 0 (0: the tier's default), got {self.repeats!r}"
            )
        for name in ("parity_steps", "throughput_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = the tier's default)")
        if self.train.global_batch < 0:
            raise ValueError(
                f"global_batch must be >= 0 (0 = the tier's default), got {self.train.global_batch}"
            )
        set_by_harness(
            self.train,
            "precision",
            ("precision", "loss_scaling", "preset", "steps"),
            "one job per --precisions entry and phase, with --parity-preset/--throughput-preset "
            "and --parity-steps/--throughput-steps",
        )
        set_by_harness(
            self.train,
            "precision",
            ("device", "out", "save_params", "trace_dir", "profile"),
            "GPUs when visible, else CPU; records in temporary files",
        )
        check_reports_dir(self.reports_dir)
        return self


@dataclass
class Plan:
    on_gpu: bool
    jobs: list[tuple[str, TrainConfig]]  # (phase, job) in run order
    out_dir: Path
    name: str
    repeats: int = 1  # runs of each throughput job, interleaved (the jobs list holds them all)


def _fp16_unfused(job: TrainConfig) -> TrainConfig:
    """fp16 jobs compute the loss unfused whatever --fused-loss says (its gradients would
    form before loss scaling); the record's config says what each job ran with."""
    return replace(job, fused_loss=False) if job.precision == "fp16" else job


def make_plan(cfg: PrecisionConfig) -> Plan:
    """Resolve the tier's defaults; every job validated before the first launch."""
    from shared.results import output_root

    cfg.validate()
    on_gpu = torch.cuda.is_available()
    available = torch.cuda.device_count() if on_gpu else 2**31
    if cfg.world_size > available:
        raise ValueError(f"world_size {cfg.world_size} needs that many GPUs; {available} visible")
    given = cfg.train
    gb = given.global_batch or (64 if on_gpu else 8)
    base = replace(
        given,
        global_batch=gb,
        micro_batch=given.micro_batch
        or (min(GPU_MICRO_BATCH, gb // cfg.world_size) if on_gpu else 0),
        compile=given.compile and on_gpu,
        attention=given.attention if on_gpu else "sdpa",
        device="cuda" if on_gpu else "cpu",
        log_every=given.log_every,
    )
    repeats = cfg.repeats or (DEFAULT_REPEATS if on_gpu else 1)
    jobs: list[tuple[str, TrainConfig]] = []
    if cfg.parity:
        preset = (
            cfg.parity_preset if cfg.parity_preset != "auto" else ("125m" if on_gpu else "tiny")
        )
        steps = cfg.parity_steps or (500 if on_gpu else 40)
        for p in cfg.recipes():
            job = _fp16_unfused(
                replace(base, preset=preset, precision=p, steps=steps - base.warmup_steps)
            )
            jobs.append(("parity", job))
            if p == "fp16" and cfg.fp16_unscaled_run:
                jobs.append(("parity", replace(job, loss_scaling=False)))
    if cfg.throughput:
        preset = (
            cfg.throughput_preset
            if cfg.throughput_preset != "auto"
            else ("1b" if on_gpu else "tiny")
        )
        steps = cfg.throughput_steps or (10 if on_gpu else 4)
        for rep in range(repeats):
            for p in repetition_order(cfg.recipes(), rep):
                job = replace(base, preset=preset, precision=p, steps=steps)
                jobs.append(("throughput", _fp16_unfused(job)))
    for _, job in jobs:
        if job.steps < 1:
            raise ValueError(
                f"parity_steps must exceed the warm-up steps ({base.warmup_steps}) of each run"
            )
        job.validate(cfg.world_size)
    root = output_root(cfg.reports_dir)
    out_dir = writable_dir("--reports-dir", root / PROJECT)
    name = cfg.name or f"precision_{'gpu' if on_gpu else 'cpu'}"
    return Plan(on_gpu, jobs, out_dir, name, repeats)


def final_loss(losses: list[float]) -> float:
    """Mean loss of the last FINAL_FRACTION of the steps (at least one step)."""
    n = max(1, round(len(losses) * FINAL_FRACTION))
    return sum(losses[-n:]) / n


def _label(job: TrainConfig) -> str:
    return job.precision + ("" if job.loss_scaling else " (no loss scaling)")


def _summary(phase: str, job: TrainConfig, rec: dict) -> dict:
    out = {
        "precision": job.precision,
        "loss_scaling": job.loss_scaling if job.precision == "fp16" else None,
        "label": _label(job),
        "status": "ok",
        "preset": rec["preset"],
        "compute_dtype": rec["compute_dtype"],
        "float8_linears": rec["float8_linears"],
        "losses": rec["losses"],
        "final_loss": final_loss(rec["losses"]),
        "skipped_steps": rec["skipped_steps"],
        "loss_scale": rec["loss_scale"],
        "fp16_underflow": rec["fp16_underflow"],
    }
    if phase == "throughput":
        out |= {
            "tokens_per_s": rec["tokens_per_s"],
            "step_time_s": rec["step_time_s"]["median"],
            "mfu": rec["mfu"],
            "peak_kind": rec["peak_kind"],
            "mfu_bf16_peak": rec["mfu_bf16_peak"],
            "achieved_tflops_per_device": rec["achieved_tflops_per_device"],
            "peak_memory_gib": rec["peak_memory_gib"],
            "memory_kind": rec["memory_kind"],
            "gpu": rec["gpu"],
        }
    return out


def compare_to_baseline(runs: list[dict]) -> None:
    """Fill each ok parity run's final-loss difference to the bf16 run's, in place."""
    base = next((r for r in runs if r["precision"] == BASELINE and r["status"] == "ok"), None)
    for r in runs:
        if r["status"] == "ok" and base is not None:
            r["final_loss_diff_vs_bf16"] = r["final_loss"] - base["final_loss"]


# Throughput figures summarised over repetitions with their range (shared.repeat.flat).
SPREAD_FIELDS = (
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "mfu_bf16_peak",
    "achieved_tflops_per_device",
)


def merge_repetitions(runs: list[dict]) -> dict:
    """One recipe's throughput runs (`_summary` each, in repetition order) as one row: the
    figures of SPREAD_FIELDS are the medians with their range, peak memory the largest, the rest
    (losses) the first run's."""
    return merge_runs(runs, SPREAD_FIELDS, largest=("peak_memory_gib",))


def throughput_rows(
    done: dict[str, list[dict]], failed: dict[str, dict], recipes: list[str], repeats: int
) -> list[dict]:
    """The throughput phase's rows in recipe order: each recipe's completed repetitions merged
    (with `repeats`, their number, when more than one was planned, and `failed_repetition` when
    one failed after them), or its failed entry when none completed; the speed-up over bf16 per
    repetition (repetition i over bf16's repetition i, `shared.repeat.ratio`: a recipe that
    stops on a failure stops for good, so the completed repetitions pair by position)."""
    rows = []
    for p in recipes:
        if p not in done:
            if p in failed:
                rows.append({k: v for k, v in failed[p].items() if k != "repetition"})
            continue
        row = merge_repetitions(done[p])
        if repeats > 1:
            row["repeats"] = len(done[p])
        if p in failed:
            f = failed[p]
            row["failed_repetition"] = {k: f[k] for k in ("repetition", "returncode", "note")}
        rows.append(row)
    base = done.get(BASELINE)
    for row in rows:
        if row["status"] != "ok" or not base:
            continue
        tps = [r["tokens_per_s"] for r in done[row["precision"]]]
        speedup = ratio(Spread.of(tps), Spread.of(r["tokens_per_s"] for r in base))
        if speedup.n > 1:
            row.update(flat("speedup_vs_bf16", speedup))
        else:
            row["speedup_vs_bf16"] = speedup.median
    return rows


def cost_lines(runs: list[dict], world_size: int) -> None:
    """Cost per million tokens of each throughput run, on this GPU at its listed prices."""
    from shared.cost import cost_line
    from shared.hardware import detect_gpu

    spec = detect_gpu()
    for r in runs:
        if r["status"] == "ok" and spec is not None:
            line = cost_line(spec, world_size, r["tokens_per_s"], measured=True).to_dict()
            r["usd_per_m_tokens_on_demand"] = line["usd_per_m_tokens_on_demand"]
            r["usd_per_m_tokens_spot"] = line["usd_per_m_tokens_spot"]
            r["price_source"] = line["price_source"]


def run(cfg: PrecisionConfig) -> Path:
    """`precision`: the parity jobs, then the throughput jobs (every recipe once per repetition,
    interleaved), as torchrun jobs; the JSON record, Markdown and charts, rewritten after each
    job. Returns the JSON path."""
    from shared.results import environment

    plan = make_plan(cfg)
    phases: dict[str, dict] = {}
    for phase, job in plan.jobs:
        phases.setdefault(
            phase,
            {
                "preset": job.preset,
                "steps_total": job.total_steps(),
                "global_batch": job.global_batch,
                "micro_batch": job.micro_batch,
                "reshard_after_forward": job.reshard_after_forward,
                "seq_len": job.resolved_seq_len(),
                **({"repeats": plan.repeats} if phase == "throughput" else {}),
                "runs": [],
            },
        )
    results = {
        "tier": "gpu" if plan.on_gpu else "cpu",
        "world_size": cfg.world_size,
        "baseline": BASELINE,
        "final_fraction": FINAL_FRACTION,
        **phases,
    }
    per_job = {k: None for k in ("precision", "loss_scaling", "preset", "steps")}
    config = {
        "precision": portable(asdict(cfg)),
        "train": portable({**asdict(replace(plan.jobs[0][1])), **per_job}),
    }
    from shared.gpu_state import gpu_state

    # read before the first job: each publish adds a reading of its own time as the end
    env = environment(gpu_state_start=gpu_state())
    kept = _kept_phases(cfg, plan, set(phases))
    results |= kept
    path = None
    done: dict[str, list[dict]] = {}  # throughput: each recipe's completed repetitions
    failed: dict[str, dict] = {}  # throughput: each recipe's failed job (it is not run again)
    reps: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (phase, job) in enumerate(plan.jobs):
            where = phase
            if phase == "throughput":
                rep = reps[job.precision] = reps.get(job.precision, 0) + 1
                if plan.repeats > 1:
                    where += f", repetition {rep} of {plan.repeats}"
                if job.precision in failed:
                    print(f"\n=== {where}: {_label(job)} skipped (failed before)", flush=True)
                    continue
            print(f"\n=== {where}: {_label(job)} (job {i + 1} of {len(plan.jobs)})", flush=True)
            job = replace(job, out=f"{tmp}/{i}.json")
            rc, tail = launch(
                cfg.world_size, "train", cli_flags(job), on_gpu=plan.on_gpu, timeout_s=cfg.timeout_s
            )
            if rc != 0 or not Path(job.out).is_file():
                entry = {
                    "precision": job.precision,
                    "loss_scaling": job.loss_scaling if job.precision == "fp16" else None,
                    "label": _label(job),
                    "status": "failed",
                    "returncode": rc,
                    "note": tail[-2000:],
                }
            else:
                entry = _summary(phase, job, json.loads(Path(job.out).read_text()))
            if phase == "parity":
                results[phase]["runs"].append(entry)
                compare_to_baseline(results[phase]["runs"])
            else:
                if entry["status"] == "ok":
                    done.setdefault(job.precision, []).append(entry)
                else:
                    failed[job.precision] = {**entry, "repetition": rep}
                runs = throughput_rows(done, failed, cfg.recipes(), plan.repeats)
                cost_lines(runs, cfg.world_size)
                results[phase]["runs"] = runs
            path = _publish(results, config, env, plan)
    print(Path(path).with_suffix(".md").read_text(), flush=True)
    failures = [
        f"{p} {r['label']}" for p in phases for r in results[p]["runs"] if r["status"] != "ok"
    ]
    failures += [
        f"throughput {r['label']} (repetition {r['failed_repetition']['repetition']})"
        for r in results.get("throughput", {}).get("runs", [])
        if "throughput" in phases and r.get("failed_repetition")
    ]
    if failures:
        raise RuntimeError(f"{failures} failed; see {path}")
    return path


def _kept_phases(cfg: PrecisionConfig, plan: Plan, measured: set[str]) -> dict[str, dict]:
    """With --keep-other-phases, the phases of the record already at the output path that this
    run does not measure, each with the environment and training config it was measured with
    (`measured_with`). Refuses a record of another tier or world size."""
    if not cfg.keep_other_phases:
        return {}
    from shared.results import load_result

    path = plan.out_dir / f"{plan.name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"--keep-other-phases: no record at {path} to keep a phase from")
    old = load_result(path)
    res = old["results"]
    tier = "gpu" if plan.on_gpu else "cpu"
    if res.get("tier") != tier or res.get("world_size") != cfg.world_size:
        raise ValueError(
            f"--keep-other-phases: {path} was measured on tier {res.get('tier')} with world size "
            f"{res.get('world_size')}, this run is tier {tier} with {cfg.world_size}"
        )
    kept = {}
    for phase in ("parity", "throughput"):
        if phase in measured or phase not in res:
            continue
        kept[phase] = {
            **res[phase],
            "measured_with": res[phase].get("measured_with")
            or {"environment": old["environment"], "train": old["config"].get("train")},
        }
    if not kept:
        raise ValueError(f"--keep-other-phases: {path} holds no phase that this run leaves out")
    return kept


def _publish(results: dict, config: dict, env: dict, plan: Plan) -> Path:
    from project02_fsdp_scaling.precision_report import precision_charts, precision_markdown
    from shared.results import atomic_write_text, load_result, save_result

    root = plan.out_dir.parent
    start = (env.get("gpu_state") or {}).get("start")
    path = save_result(
        PROJECT, plan.name, results, config=config, reports_dir=root, env=env, gpu_state_start=start
    )
    rec = load_result(path)
    precision_charts(rec, plan.out_dir, plan.name)
    atomic_write_text(path.with_suffix(".md"), precision_markdown(rec, name=plan.name))
    return path


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["precision", *sys.argv[1:]]))
