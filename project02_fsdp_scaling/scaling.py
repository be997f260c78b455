"""Strong-scaling benchmark: the same global batch on 1, 2, 4, ... devices.

    python -m project02_fsdp_scaling scaling --gpus 1,2,4,8 --preset 1b
    python -m project02_fsdp_scaling scaling            # CPU: tiny model, 1 and 2 gloo processes

Each world size is a fresh `torchrun --standalone` job of `project02_fsdp_scaling train` with the
same configuration and number of steps: warm-up steps, timed steps, then profiled steps whose
torch.profiler trace is analysed (compute vs collective vs exposed communication). World sizes
larger than the machine are skipped with a note. The one-device run of the same job is the
baseline: speed-up and efficiency (throughput / (N x one-device throughput)) are against it.

Headline figures are medians over repetitions (`shared.repeat`): with --repeats N (default 5
on GPUs, 1 on CPU) every world size's job runs N times, each time a fresh torchrun job, the world
sizes interleaved and their order reversed on alternate repetitions (ws1 ws2, ws2 ws1, ...), so
that a drift of the machine's state falls on every world size alike. A world size's record keeps
its fields with the median under the old name and `_min`, `_max`, `_reps` beside it; speed-up and
efficiency are computed per repetition (repetition i of N devices over repetition i of one) and
summarised the same way. The profiled steps run in the first repetition only.

On a GPU the one-GPU variants (eager / compiled, with and without activation checkpointing,
attention backends) are swept first (`project02_fsdp_scaling sweep`, once) and the best by MFU is
the configuration every world size runs, unless --no-sweep.

Results: <reports-dir>/project02_fsdp_scaling/<name>.json (with the environment), one JSON and
one trace per world size, charts and <name>.md (`project02_fsdp_scaling report` renders them).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
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
    cli_flags,
    portable,
    set_by_harness,
)
from shared.cli import writable_dir
from shared.repeat import DEFAULT_REPEATS, flat, interleave, merge_runs, ratio, read_flat
from shared.results import output_root

# Cost configurations: (GPU table key, number of GPUs).
DEFAULT_COST_CONFIGS = "h200-sxm:1,h200-sxm:4,h100-sxm:8"


def assumed_efficiency(n: int) -> float:
    """Scaling efficiency assumed for a projection to n GPUs where none was measured: the
    project's targets (95% up to 4 GPUs, 90% up to 8), not a measurement."""
    if n <= 1:
        return 1.0
    if n <= 4:
        return 0.95
    if n <= 8:
        return 0.90
    return 0.85


# The harness's own training defaults: "auto" and 0 take the tier's value (see ScalingConfig).
SCALING_TRAIN = TrainConfig(preset="auto", global_batch=0, steps=0, compile=True, profile=True)


@dataclass
class ScalingConfig:
    """Strong scaling of FSDP2 training at a fixed global batch, with a profiler timeline per
    world size and cost per million tokens. Training flags left at auto or 0 take the tier's
    value: preset 1b on GPUs and tiny on CPU; global batch 64 and 8; micro-batch min(8, local
    batch) on GPUs and the local batch on CPU; steps 5 and 30 (short, noisy steps on CPU).
    torch.compile runs on GPUs only; the device and each job's output files are the harness's.
    Figures are medians over --repeats runs of each job (5 on GPUs, 1 on CPU) with their
    min-max; the one-GPU sweep and the profiled steps (--profile) run once."""

    gpus: str = "auto"
    """comma-separated world sizes; auto = 1,2,4,8 on GPUs, 1,2 CPU processes without a GPU"""
    sweep: bool = True
    """on a GPU, first sweep the one-GPU variants (once, whatever --repeats) and run the scaling
    with the best by MFU"""
    sweep_variants: str = "eager,eager+ac,compile,compile+ac,compile+cudnn"
    """variants the one-GPU sweep tries (see the sweep command)"""
    sweep_global_batch: int = 32
    """global batch of the one-GPU sweep (micro-batch as below)"""
    sweep_steps: int = 3
    """timed steps per sweep variant"""
    sweep_max_seconds: int = 0
    """start no new sweep variant after this many seconds (0: no limit)"""
    cost_configs: str = DEFAULT_COST_CONFIGS
    """GPU configurations priced per million tokens: key:count,... (keys of shared.hardware)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: a new runs/<UTC time>/; reports/ only when named)"""
    name: str = ""
    """result file stem; default scaling_gpu or scaling_cpu"""
    timeout_s: int = 1800
    """wall-clock limit of one world size's job (of each repetition)"""
    repeats: int = 0
    """runs of each world size's job, each a fresh torchrun job, world sizes interleaved (order
    reversed on alternate repetitions); figures are the medians with their min-max. 0: the
    tier's default, 5 on GPUs, 1 on CPU. The one-GPU sweep and the profiled steps run once (the
    profile in the first repetition); each repetition relaunches every job, so the time grows
    with it"""
    readme: bool = True
    """regenerate project02_fsdp_scaling/README.md when writing to the repository's reports/"""
    train: Train = field(default_factory=lambda: replace(SCALING_TRAIN))

    def validate(self) -> ScalingConfig:
        parse_world_sizes(self.gpus) if self.gpus != "auto" else None
        parse_cost_configs(self.cost_configs)
        check_preset(self.train.preset, allow_auto=True)
        check_name(self.name)
        for name in ("global_batch", "micro_batch", "seq_len", "steps"):
            if getattr(self.train, name) < 0:
                raise ValueError(
                    f"{name} must be >= 0 (0 = the tier's default), got {getattr(self.train, name)}"
                )
        if self.sweep_max_seconds < 0:
            raise ValueError(f"sweep_max_seconds must be >= 0, got {self.sweep_max_seconds}")
        set_by_harness(
            self.train,
            "scaling",
            ("device", "out", "save_params", "trace_dir"),
            "GPUs when visible, else CPU; records and traces in the reports folder",
        )
        check_reports_dir(self.reports_dir)
        parse_variants(self.sweep_variants)
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 0:
            raise ValueError(
                f"repeats must be an integer >= 0 (0: the tier's default), got {self.repeats!r}"
            )
        for name in ("sweep_steps", "timeout_s", "sweep_global_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.train.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.train.warmup_steps}")
        return self


def parse_world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"gpus must be comma-separated positive integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"gpus must be comma-separated positive integers, got {text!r}")
    return sorted(set(sizes))


def parse_variants(text: str) -> list[str]:
    """The sweep's variant names, each checked (see project02_fsdp_scaling.sweep)."""
    from project02_fsdp_scaling.sweep import parse_variant

    names = [v.strip() for v in str(text).split(",") if v.strip()]
    if not names:
        raise ValueError("sweep_variants must name at least one variant")
    for v in names:
        parse_variant(v)
    return names


def parse_cost_configs(text: str) -> list[tuple[str, int]]:
    from shared.hardware import GPUS

    out = []
    for item in str(text).split(","):
        if not item.strip():
            continue
        key, _, n = item.strip().partition(":")
        if key not in GPUS:
            raise ValueError(f"cost_configs: unknown GPU {key!r}; expected one of {sorted(GPUS)}")
        try:
            count = int(n)
        except ValueError:
            raise ValueError(f"cost_configs: {item!r} must be key:count, e.g. h200-sxm:4") from None
        if count < 1:
            raise ValueError(f"cost_configs: GPU count must be >= 1 in {item!r}")
        out.append((key, count))
    if not out:
        raise ValueError("cost_configs must name at least one key:count")
    return out


@dataclass
class Plan:
    on_gpu: bool
    available: int
    world_sizes: list[int]
    train: TrainConfig
    out_dir: Path
    name: str
    repeats: int = 1


def make_plan(cfg: ScalingConfig) -> Plan:
    """Resolve the tier's defaults and validate the training config for every world size."""
    cfg.validate()
    on_gpu = torch.cuda.is_available()
    available = torch.cuda.device_count() if on_gpu else (os.cpu_count() or 1)
    sizes = parse_world_sizes(cfg.gpus if cfg.gpus != "auto" else ("1,2,4,8" if on_gpu else "1,2"))
    given = cfg.train
    train = replace(
        given,
        preset=given.preset if given.preset != "auto" else ("1b" if on_gpu else "tiny"),
        global_batch=given.global_batch or (64 if on_gpu else 8),
        steps=given.steps or (5 if on_gpu else 30),
        compile=given.compile and on_gpu,
        device="cuda" if on_gpu else "cpu",
    )
    for ws in sizes:  # every error before the first launch
        replace(train, micro_batch=_micro_batch(cfg, train, ws, on_gpu)).validate(ws)
    root = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", root / PROJECT)  # before the first launch, not after it
    name = cfg.name or ("scaling_gpu" if on_gpu else "scaling_cpu")
    repeats = cfg.repeats or (DEFAULT_REPEATS if on_gpu else 1)
    return Plan(on_gpu, available, sizes, train, root / PROJECT, name, repeats)


def _micro_batch(cfg: ScalingConfig, train: TrainConfig, ws: int, on_gpu: bool) -> int:
    """The micro-batch of world size `ws`: as given, else min(8, local batch) on GPUs and the
    whole local batch (0) on CPU."""
    return cfg.train.micro_batch or (min(8, train.global_batch // ws) if on_gpu else 0)


def _default_reports_root() -> Path:
    """The published results' folder: the README block is refreshed only when writing there."""
    from shared.results import REPORTS_DIR

    return Path(REPORTS_DIR)


def launch(
    ws: int, command: str, flags: list[str], *, on_gpu: bool, timeout_s: int
) -> tuple[int, str]:
    """One `torchrun --standalone` job of `ws` processes running `python -m
    project02_fsdp_scaling <command> <flags>`; its output streams through, prefixed. Returns
    (exit code, last lines of output)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd = [*torchrun, "--nproc-per-node", str(ws), "-m", PROJECT, command, *flags]
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not on_gpu:
        # On CPU a "device" is one process with one thread (one core). Several threads per
        # process on a small host spin against gloo's threads and the other ranks, and the tiny
        # model's steps slow down many times over.
        env["OMP_NUM_THREADS"] = "1"
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    print(f"\n=== world size {ws}: {' '.join(cmd[1:])}", flush=True)
    tail: list[str] = []
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"  [ws{ws}] {line}", end="", flush=True)
        tail = (tail + [line])[-40:]
        if time.monotonic() > deadline:
            break
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)  # this job's own process group (start_new_session)
        proc.wait()
        rc = 124
        tail.append(f"killed after {timeout_s} s (timeout_s)\n")
    return rc, "".join(tail)


def run(cfg: ScalingConfig) -> Path:
    """`scaling`: run every world size; write the JSON record; render charts and Markdown from
    it. Returns the JSON path."""
    from project02_fsdp_scaling import report
    from shared.gpu_state import gpu_state
    from shared.results import environment, load_result, save_result

    gpu_start = gpu_state()  # clocks, temperature and power before the jobs (NVML)
    plan = make_plan(cfg)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    train = plan.train
    sweep_info = None
    if plan.on_gpu and cfg.sweep:
        sweep_info = _run_sweep(cfg, plan)
        if sweep_info.get("best"):
            best = sweep_info["best"]["overrides"]
            train = replace(train, **best)
            print(f"one-GPU sweep: best variant {sweep_info['best']['variant']!r} -> {best}")

    load_before = _load_average()
    runs = run_world_sizes(cfg, plan, train)

    results = build_results(runs, plan, cfg, train, sweep_info)
    # Other work on the host skews short CPU steps: keep the load next to the numbers.
    results["host_load_average_1min"] = {"before": load_before, "after": _load_average()}
    path = save_result(
        PROJECT,
        plan.name,
        results,
        baseline=results["baseline"],
        config={"scaling": portable(asdict(cfg)), "train": portable(asdict(train))},
        reports_dir=plan.out_dir.parent,
        env=environment(gpu_state_start=gpu_start),
    )
    report.render_scaling(path)
    if cfg.readme and plan.out_dir.parent.resolve() == _default_reports_root().resolve():
        report.refresh_readme(plan.out_dir)
    print(report.scaling_markdown(load_result(path), name=plan.name), flush=True)
    failed = [
        r["world_size"] for r in runs if r["status"] == "failed" or r.get("failed_repetition")
    ]
    if failed:
        raise RuntimeError(f"world sizes {failed} failed; their log tails are in {path}")
    return path


class JobFailed(RuntimeError):
    """A world size's training job exited non-zero or wrote no record."""


def run_file(name: str, ws: int, rep: int) -> str:
    """The record of repetition `rep` (1-based) of world size `ws`: the first keeps the name
    a single run always had."""
    return f"{name}_ws{ws}.json" if rep == 1 else f"{name}_ws{ws}_rep{rep}.json"


def run_world_sizes(cfg: ScalingConfig, plan: Plan, train: TrainConfig) -> list[dict]:
    """Every world size's job `plan.repeats` times, interleaved (`shared.repeat.interleave`):
    one entry per world size, skipped (larger than the machine), failed (its first repetition
    failed) or ok (`merge_repetitions` of its runs). A world size whose job fails is not run
    again; the repetitions it completed stand, with the failure beside them."""
    unit = "GPUs" if plan.on_gpu else "CPU cores"
    skipped, todo = {}, []
    for ws in plan.world_sizes:
        if ws > plan.available:
            note = f"skipped: world size {ws} needs {ws} {unit}, this machine has {plan.available}"
            print(note, flush=True)
            skipped[ws] = {"world_size": ws, "status": "skipped", "note": note}
        else:
            todo.append(ws)
    done: dict[int, list[dict]] = {ws: [] for ws in todo}
    failures: dict[int, dict] = {}

    def job(ws: int):
        def measure() -> float:
            rep = len(done[ws]) + 1
            run_json = plan.out_dir / run_file(plan.name, ws, rep)
            run_cfg = replace(
                train,
                micro_batch=_micro_batch(cfg, train, ws, plan.on_gpu),
                out=str(run_json),
                trace_dir=str(plan.out_dir),
                profile=train.profile and rep == 1,  # one profile per world size
            )
            run_json.unlink(missing_ok=True)
            if plan.repeats > 1:
                print(f"\n=== repetition {rep} of {plan.repeats}: world size {ws}", flush=True)
            rc, tail = launch(
                ws, "train", cli_flags(run_cfg), on_gpu=plan.on_gpu, timeout_s=cfg.timeout_s
            )
            if rc != 0 or not run_json.is_file():
                failures[ws] = {"repetition": rep, "returncode": rc, "log_tail": tail}
                raise JobFailed(f"world size {ws} exited {rc}")
            rec = json.loads(run_json.read_text())
            done[ws].append({"file": run_json.name, **_summary(rec)})
            return rec["tokens_per_s"]

        return measure

    if todo:
        interleave({f"ws{ws}": job(ws) for ws in todo}, plan.repeats, catch=(JobFailed,))
    runs = []
    for ws in plan.world_sizes:
        if ws in skipped:
            runs.append(skipped[ws])
        elif not done[ws]:
            f = failures[ws]
            runs.append({"world_size": ws, "status": "failed", **f})
        else:
            r = {"world_size": ws, "status": "ok", **merge_repetitions(done[ws])}
            if ws in failures:
                r["failed_repetition"] = failures[ws]
            runs.append(r)
    return runs


# Per-run figures summarised over repetitions with their range (shared.repeat.flat).
SPREAD_FIELDS = (
    "tokens_per_s",
    "tokens_per_s_per_device",
    "step_time_s",
    "mfu",
    "achieved_tflops_per_device",
)


def merge_repetitions(runs: list[dict]) -> dict:
    """One world size's repeated runs (`_summary` each, in repetition order) as one entry: the
    figures of SPREAD_FIELDS are the medians with their range; the step time's p20/p80 the
    medians of the runs' (each below/above its run's median, so theirs are too); peak memory the
    largest; the rest (losses, the profile) the first run's. One run is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    out = merge_runs(runs, SPREAD_FIELDS, largest=("peak_memory_gib",))
    out |= {"repeats": len(runs), "files": [r["file"] for r in runs]}
    for key in ("step_time_p20_s", "step_time_p80_s"):
        out[key] = statistics.median(r[key] for r in runs)
    return out


def _run_sweep(cfg: ScalingConfig, plan: Plan) -> dict:
    from project02_fsdp_scaling.sweep import SWEPT, SweepConfig

    sweep_cfg = SweepConfig(
        variants=cfg.sweep_variants,
        reports_dir=str(plan.out_dir.parent),
        max_seconds=cfg.sweep_max_seconds,
        name="sweep_gpu" if plan.on_gpu else "sweep_cpu",
        train=replace(
            plan.train,
            global_batch=cfg.sweep_global_batch,
            micro_batch=cfg.train.micro_batch or 8,
            steps=cfg.sweep_steps,
            # each variant sets these; the sweep times without the profiler, on the tier's device
            **{k: getattr(TrainConfig(), k) for k in (*SWEPT, "profile", "device")},
        ),
    )
    # In a child process: the sweep's CUDA memory and compile caches leave with it.
    cmd = [sys.executable, "-m", PROJECT, "sweep", *cli_flags(sweep_cfg)]
    print(f"\n=== one-GPU sweep: {' '.join(cmd[1:])}", flush=True)
    path = plan.out_dir / f"{sweep_cfg.name}.json"
    path.unlink(missing_ok=True)
    try:
        rc = subprocess.call(cmd, timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        rc = 124
    if not path.is_file():
        print(f"one-GPU sweep failed (exit {rc}); scaling runs the configuration given", flush=True)
        return {"status": "failed", "returncode": rc}
    # The sweep rewrites its record after every variant: a cut-short sweep still has a best.
    rec = json.loads(path.read_text())
    status = "ok" if rc == 0 else f"incomplete (exit {rc})"
    return {"status": status, "file": path.name, "best": rec["results"].get("best")}


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def _summary(rec: dict) -> dict:
    """The per-world-size fields the report needs, from one train.py result."""
    prof = (rec.get("profile") or {}).get("rank0")
    return {
        "tokens_per_s": rec["tokens_per_s"],
        "tokens_per_s_per_device": rec["tokens_per_s_per_device"],
        "step_time_s": rec["step_time_s"]["median"],
        "step_time_p20_s": rec["step_time_s"]["p20"],
        "step_time_p80_s": rec["step_time_s"]["p80"],
        "timed_steps": rec["step_time_s"]["n"],
        "mfu": rec.get("mfu"),
        "achieved_tflops_per_device": rec.get("achieved_tflops_per_device"),
        "peak_memory_gib": rec["peak_memory_gib"],
        "memory_kind": rec["memory_kind"],
        "micro_batch": rec["micro_batch"],
        "grad_accum_steps": rec["grad_accum_steps"],
        "compute_dtype": rec.get("compute_dtype"),
        "first_loss": rec["losses"][0],
        "last_loss": rec["losses"][-1],
        "gpu": rec.get("gpu"),
        "profile": prof,
        "trace": (rec.get("profile") or {}).get("trace"),
    }


def build_results(runs, plan: Plan, cfg: ScalingConfig, train: TrainConfig, sweep_info) -> dict:
    ok = {r["world_size"]: r for r in runs if r["status"] == "ok"}
    base = ok.get(1)
    for r in ok.values():
        if base:
            # per repetition: repetition i of N devices over repetition i of one
            speedup = ratio(read_flat(r, "tokens_per_s"), read_flat(base, "tokens_per_s"))
            eff = speedup.map(lambda v, n=r["world_size"]: v / n)
            if speedup.n > 1:
                r.update({**flat("speedup", speedup), **flat("efficiency", eff)})
            else:
                r["speedup"], r["efficiency"] = speedup.median, eff.median
        else:
            r["speedup"] = r["efficiency"] = None
    return {
        "tier": "gpu" if plan.on_gpu else "cpu",
        "devices_available": plan.available,
        "preset": train.preset,
        "global_batch": train.global_batch,
        "seq_len": train.resolved_seq_len(),
        "tokens_per_step": train.global_batch * train.resolved_seq_len(),
        "repeats": plan.repeats,
        "runs": runs,
        "baseline": (
            {
                "world_size": 1,
                "tokens_per_s": base["tokens_per_s"],
                "what": "one-device run of the same job in this harness run"
                + (f" (median of {plan.repeats} runs)" if plan.repeats > 1 else ""),
            }
            if base
            else None
        ),
        "cost": cost_table(ok, plan, cfg),
        "sweep": sweep_info,
    }


def cost_table(ok: dict, plan: Plan, cfg: ScalingConfig) -> dict:
    """Cost per million tokens of each configuration: measured where this run measured that GPU
    and count, otherwise projected (and labelled so) from the measured one-GPU throughput."""
    from shared.cost import cost_line
    from shared.hardware import detect_gpu, get_gpu

    configs = parse_cost_configs(cfg.cost_configs)
    here = detect_gpu() if plan.on_gpu else None
    if here is None or 1 not in ok:
        why = "no GPU in this run" if not plan.on_gpu else "no one-GPU measurement on a known GPU"
        return {"lines": [], "note": f"cost per token needs a measured GPU throughput ({why})"}
    per_gpu = ok[1]["tokens_per_s"]
    lines = []
    for key, n in configs:
        spec = get_gpu(key)
        if key == here.key and n in ok:
            tps, basis = ok[n]["tokens_per_s"], f"measured: {n}x {here.key} in this run"
            measured = True
        else:
            eff = ok[n]["efficiency"] if (key == here.key and n in ok) else assumed_efficiency(n)
            ratio = spec.peak_flops("bf16") / here.peak_flops("bf16")
            tps = per_gpu * n * eff * ratio
            measured = False
            basis = (
                f"projected: measured 1x {here.key} {per_gpu:,.0f} tokens/s x {n} GPUs x "
                f"{eff:.0%} assumed scaling efficiency x {ratio:.2f} (bf16 peak {key} / {here.key})"
            )
        line = cost_line(spec, n, tps, measured=measured).to_dict()
        line["basis"] = basis
        line["price_on_demand_usd_per_gpu_hour"] = spec.price_on_demand.value
        line["price_spot_usd_per_gpu_hour"] = spec.price_spot.value
        line["spot_price_source"] = f"{spec.price_spot.source} ({spec.price_spot.date})"
        lines.append(line)
    return {"lines": lines, "note": None}


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["scaling", *sys.argv[1:]]))
