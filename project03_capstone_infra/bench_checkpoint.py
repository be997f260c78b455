"""How long a checkpoint holds training, sync vs async, and how long a resume takes (GPU).

    python -m project03_capstone_infra bench-checkpoint --preset 1b --reports-dir runs/<time>
    python -m project03_capstone_infra bench-checkpoint --preset 1b --nproc 2 --global-batch 16

One process (or `--nproc` processes, one GPU each, started here with torch.multiprocessing)
trains the preset with the project's trainer (FSDP2, bf16, AdamW) and measures:
- the median step time over `timed_steps` steps (after warm-up): the baseline;
- a synchronous save: training is held for the whole save (D2H copy, write, fsync, sha256,
  manifest, rename);
- asynchronous saves (`dcp.async_save` with the project's `PersistentStager`: host buffers kept
  across saves, pinned on GPUs, non-blocking copies on a side stream): training is held while
  the save is started plus each following step's excess over the baseline while the state is
  staged and written. The first async save of the process also allocates and pins the staging
  buffers; the next `steady_saves` are the steady state. Then the buffers are freed and built
  again in the background while training runs (what the trainer does at start-up, so that its
  first save is a steady-state one): the steps' excess over the baseline during that build is
  its cost, and one more save follows. Step times while a background write runs are recorded
  (the writer's CPU work can slow the training loop: reported as interference, part of held).
With --repeats N (default 5 on GPUs, 1 on CPU) the sync save and the steady async saves are
measured N times in the same process, interleaved (sync, async saves, async saves, sync, sync,
...: the order reversed on alternate repetitions, `shared.repeat.repetition_order`); the model,
the baseline and the staging buffers are set up once, and the first (cold) async save, the
background build and the resume are measured once. Before each sync save after the first, the
committed checkpoints are removed outside the timed save (so that, like the first, it deletes
nothing) and a training step is run if the last save was of the same step. The headline figures
`derived.sync.held_s` and `derived.steady_state.median_held_s` are then the medians over the
repetitions (a repetition's steady figure: the median of its steady saves; the save after the
background build counts with the last repetition), with `_min`, `_max` and `_reps` beside them
(`shared.repeat.flat`).
The fraction of time blocked at one checkpoint every `ckpt_interval` steps is
blocking / (ckpt_interval x median step time + blocking): the steps in between are not run,
they are extrapolated from the measured median.

Then a second job is launched like a restarted one (`train --resume auto`; under torchrun with
as many ranks when there are several) and killed after its first step: the time from its launch
to the end of that step is the time to resume (interpreter and torch start, CUDA/NCCL init,
pre-flight, model build, checksum verification, load and resharding, first step).

With several ranks every step is a collective, so rank 0's step times are the job's, and the
ranks agree before each step on whether any of them still has a save (or a staging build) in
flight. The record is `checkpoint_bench.json` for one rank and `checkpoint_bench_ws<N>.json`
for N (it carries `world_size`); the N-rank report sets its figures beside the one-rank record
found in the same folder.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from project03_capstone_infra import PROJECT
from shared.repeat import DEFAULT_REPEATS, Spread, flat, repetition_order


@dataclass
class BenchConfig:
    """Sync vs async checkpoint blocking time and time to resume, on the current GPU."""

    preset: str = "1b"
    global_batch: int = 8
    """sequences per step over all ranks (8 x nproc: 8 per GPU, as 1 rank)"""
    seq_len: int = 0
    """0: the preset's max_seq_len"""
    nproc: int = 1
    """ranks: one GPU each (gloo processes on CPU); > 1 spawns them from here"""
    ckpt_interval: int = 100
    """steps between checkpoints for the blocking fraction"""
    warmup_steps: int = 3
    timed_steps: int = 10
    max_steps_during_write: int = 200
    """keep training while an async save is written"""
    write_threads: int = 8
    """files per rank written (and hashed) in parallel"""
    run_dir: str = "/tmp/p03-ckpt-bench"
    """local disk of the machine; removed first"""
    reports_dir: str = ""
    """the record goes to <reports-dir>/project03_capstone_infra/; default: a new runs/<UTC time>/"""
    steady_saves: int = 2
    """async saves after the first one (buffers already built)"""
    prestage: bool = True
    """then free the buffers, rebuild them in the background, save again"""
    stager: str = "persistent"
    """or "dcp": DCP's DefaultStager, a fresh one per save"""
    budget_s: float = 0.0
    """> 0: phase 1's time budget in seconds: in the first repetition no further steady async
    save starts once phase 1 has run this long; a further repetition starts only if one more as
    long as the longest so far fits; the background build is skipped once it is spent"""
    repeats: int = 0
    """repetitions of the sync save and of the --steady-saves steady async saves, interleaved
    (sync, async, async, sync, ...) in one process; the headline figures are their medians with
    min-max. 0: 5 on GPUs, 1 on CPU. The cold first async save, the background build and the
    resume run once. A repetition is one sync save (training held) plus the writing of each
    steady async save (training runs on), so its length grows with the model: the record's
    per-repetition times tell what a --budget-s fits"""
    resume: bool = True
    """measure the resume in a second process"""
    from_json: str = ""
    """re-derive figures and the report from a saved raw record, no training"""
    code_commit: str = ""
    """with from_json: the commit the record was measured with"""

    def resolved_repeats(self) -> int:
        import torch

        return self.repeats or (DEFAULT_REPEATS if torch.cuda.is_available() else 1)

    def validate(self) -> BenchConfig:
        from shared.cli import input_file, require_nonempty, writable_dir
        from shared.model import PRESETS

        if self.preset not in PRESETS:
            raise ValueError(
                f"--preset: unknown {self.preset!r}; expected one of {sorted(PRESETS)}"
            )
        for name in (
            "global_batch",
            "ckpt_interval",
            "timed_steps",
            "max_steps_during_write",
            "write_threads",
            "nproc",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 0:
            raise ValueError(
                f"--repeats must be an integer >= 0 (0: 5 on GPUs, 1 on CPU), got {self.repeats!r}"
            )
        for name in ("seq_len", "warmup_steps", "steady_saves"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if self.global_batch % self.nproc:
            raise ValueError(
                f"--global-batch ({self.global_batch}) must be divisible by --nproc ({self.nproc})"
            )
        if not (math.isfinite(self.budget_s) and self.budget_s >= 0):
            raise ValueError(f"--budget-s must be a finite number >= 0, got {self.budget_s}")
        if self.stager not in ("persistent", "dcp"):
            raise ValueError(f"--stager must be 'persistent' or 'dcp', got {self.stager!r}")
        if self.from_json:
            input_file("--from-json", self.from_json)
        else:
            writable_dir("--run-dir", require_nonempty("--run-dir", self.run_dir))
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        return self


def _fs_of(path: Path) -> str:
    """The mount and file-system type holding `path` (from /proc/mounts)."""
    try:
        best = ("", "?")
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mnt) and len(mnt) >= len(best[0]):
                best = (mnt, fstype)
        return f"{best[0]} ({best[1]})"
    except OSError:
        return "unknown"


def _write(out: dict, paths: list[Path]) -> None:
    from shared.results import atomic_write_json

    for p in paths:
        atomic_write_json(p, out)


def bench_name(world_size: int) -> str:
    """The record's file stem: the one-rank name stays what the cost model and summary read."""
    return "checkpoint_bench" if world_size == 1 else f"checkpoint_bench_ws{world_size}"


def _any_rank(tr, flag: bool) -> bool:
    """True when `flag` holds on any rank (a collective: every rank calls it), so that all ranks
    run the same number of training steps."""
    if tr.world == 1:
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(flag)], device=tr.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _async_save(tr, cap: int) -> dict:
    """Start an async save and keep training until it has committed; raw timings only."""
    before = tr.ckpt.staging_info() or {}
    stats = tr.save("async")
    call_s = stats.blocking_s
    info = tr.ckpt.staging_info() or {}
    during = []
    while _any_rank(tr, tr.ckpt.in_flight) and len(during) < cap:
        during.append(tr.train_step()["step_s"])
    tr.ckpt.wait()
    built = info.get("builds", 0) > before.get("builds", 0)
    return {
        "call_s": call_s,  # the save() call itself
        "staging_wait_s": stats.blocking_s - call_s,  # optimizer step waiting for the copy
        "to_commit_s": stats.total_s,
        "bytes": stats.bytes,
        "step_s_during_write": during,
        "stage_call_s": info.get("last_stage_s"),  # host time of the stager's stage()
        "built_buffers": built,
        "build": info.get("last_build") if built else None,
    }


def _prestage(tr, cap: int) -> dict:
    """Free the staging buffers, rebuild them on a background thread while training runs (what
    the trainer does at start-up) and record the steps' times meanwhile."""
    tr.ckpt.release_staging()
    gc.collect()
    t0 = time.perf_counter()
    tr.ckpt.prestage(tr._model_optim_state(), background=True)
    call_s = time.perf_counter() - t0
    during = []
    while _any_rank(tr, tr.ckpt.prestaging) and len(during) < cap:
        during.append(tr.train_step()["step_s"])
    tr.ckpt.wait_prestage()
    info = tr.ckpt.staging_info() or {}
    return {
        "call_s": call_s,
        "wall_s": time.perf_counter() - t0,
        "step_s_during_build": during,
        "build": info.get("last_build"),
    }


def _median(xs: list[float]) -> float | None:
    """The median (of an even count, the mean of the middle two), None for no values."""
    return statistics.median(xs) if xs else None


def _sync_keys(res: dict) -> list[str]:
    """The sync saves' raw records in repetition order: `sync`, then `sync_2`, `sync_3`, ..."""
    more = [k for k in res if k.startswith("sync_") and k[5:].isdigit()]
    more.sort(key=lambda k: int(k[5:]))
    return (["sync"] if "sync" in res else []) + more


def _spread_fields(name: str, values: list[float], f=None) -> dict:
    """{name: the value} for one value; with two or more, `shared.repeat.flat` of them (the
    median under `name`, `_min`, `_max`, `_reps`): a record of one repetition stays as it was."""
    s = Spread.of(values)
    s = s.map(f) if f else s
    return {name: s.values[0]} if s.n == 1 else flat(name, s)


def _steady_keys(res: dict) -> list[str]:
    keys = [k for k in res if k.startswith("async_steady_")]
    keys.sort(key=lambda k: int(k.rsplit("_", 1)[1]))
    return (["async_warm"] if "async_warm" in res else []) + keys


def derive(res: dict, ckpt_interval: int) -> dict:
    """The figures reported, computed from the raw timings in `res`.

    Time training is held by an async save = the call + every step's excess over the baseline
    median while the save is staged and written (the staging copy, pinned-buffer allocation
    and the writer's CPU work all show up there, whatever the mechanism). For a sync save it is
    the whole save. Fraction at one checkpoint every `ckpt_interval` steps:
    held / (ckpt_interval x median step + held). The target is judged on the steady state
    (median over the saves made with the buffers already built).
    """
    median = res["baseline"]["median_step_s"]
    interval_s = ckpt_interval * median
    out = {"ckpt_interval_steps": ckpt_interval, "interval_s": interval_s}
    sync = [res[k]["blocking_s"] for k in _sync_keys(res)]
    if sync:
        out["sync"] = {
            **_spread_fields("held_s", sync),
            **_spread_fields("fraction", sync, lambda h: h / (interval_s + h)),
        }
        if len(sync) > 1:
            out["sync"]["saves"] = len(sync)
    steady = _steady_keys(res)
    for k in ("async_cold", *steady, "async_after_prestage"):
        if k not in res:
            continue
        r = res[k]
        excess = [max(0.0, d - median) for d in r["step_s_during_write"]]
        held = r["call_s"] + sum(excess)
        out[k] = {
            "held_s": held,
            "fraction": held / (interval_s + held),
            "call_s": r["call_s"],
            "explicit_staging_wait_s": r["staging_wait_s"],
            "first_step_excess_s": excess[0] if excess else 0.0,
            "later_steps_excess_s": sum(excess[1:]),
            "steps_while_writing": len(excess),
            "median_step_while_writing_s": _median(r["step_s_during_write"]),
            # Signed: step noise below the median offsets noise above it (held counts only the
            # steps above the median, so it also counts step-to-step noise as held).
            "net_held_s": r["call_s"] + sum(d - median for d in r["step_s_during_write"]),
            "write_to_commit_s": r["to_commit_s"],
        }
        if r.get("build"):
            out[k]["build_s"] = r["build"]["seconds"]
    if "prestage" in res:
        p = res["prestage"]
        excess = [max(0.0, d - median) for d in p["step_s_during_build"]]
        held = p["call_s"] + sum(excess)
        out["prestage"] = {
            "held_s": held,
            "build_s": (p.get("build") or {}).get("seconds"),
            "wall_s": p["wall_s"],
            "steps_during_build": len(excess),
        }
    keys = [k for k in (*steady, "async_after_prestage") if k in out]
    if keys:
        ss = [out[k]["held_s"] for k in keys]
        # Each repetition's figure: the median of its steady saves (the save after the
        # background build counts with the last repetition); one repetition: all of them.
        rep_of = {k: res[k].get("repetition", 1) for k in steady if k in res}
        last = max(rep_of.values(), default=1)
        by_rep: dict[int, list[float]] = {}
        for k in keys:
            by_rep.setdefault(rep_of.get(k, last), []).append(out[k]["held_s"])
        per_rep = [_median(v) for _, v in sorted(by_rep.items())]
        held_f = _spread_fields("median_held_s", per_rep)
        frac_f = _spread_fields("fraction", per_rep, lambda h: h / (interval_s + h))
        held, frac = held_f["median_held_s"], frac_f["fraction"]
        out["steady_state"] = {
            "saves": len(ss),
            **held_f,
            "max_held_s": max(ss),
            "median_net_held_s": _median([out[k]["net_held_s"] for k in keys]),
            **frac_f,
            "target_fraction": 0.01,
            "met": frac < 0.01,
        }
        if len(per_rep) > 1:
            out["steady_state"]["repetitions"] = len(per_rep)
        # The same figure under the name the cost model and the project summary read.
        out["async_warm"] = {
            **_spread_fields("held_s", per_rep),
            "fraction": frac,
            "from": keys,
        }
    out["method"] = (
        "Held: a sync save holds training for the whole save; an async save for its call plus "
        "every training step's excess over the baseline median while it is staged and written "
        "(waiting for the staging copy, pinning host buffers, the writer's CPU work). Fraction "
        f"at one checkpoint every {ckpt_interval} steps = held / ({ckpt_interval} x median step "
        f"+ held): the {ckpt_interval} steps in between are not run, their time is extrapolated "
        f"from the measured median ({median * 1e3:.1f} ms)"
    )
    return out


def write_report(record: dict, out_dir: Path) -> list[Path]:
    """The record's report (report/checkpoint_bench.py); in a <reports-dir>/project03_capstone_infra/ the
    project summary is refreshed too."""
    from .report import checkpoint_bench as report

    paths = report.render(record, out_dir)
    if out_dir.name == PROJECT:
        from .report.summary import write_summary

        paths.append(write_summary(out_dir.parent))
    return paths


RAW_ASYNC_KEYS = (
    "call_s",
    "staging_wait_s",
    "to_commit_s",
    "bytes",
    "step_s_during_write",
    "stage_call_s",
    "built_buffers",
    "build",
    "repetition",
)


def rederive(cfg: BenchConfig) -> dict:
    """Recompute `derived` from a record's raw timings (keeping only raw fields) and rewrite
    the JSON and Markdown report into the reports folder."""
    from shared.results import atomic_write_json, output_root

    record = json.loads(Path(cfg.from_json).read_text())
    res = record["results"]
    for k in ("async_cold", *_steady_keys(res), "async_after_prestage"):
        if k in res:
            res[k] = {f: res[k][f] for f in RAW_ASYNC_KEYS if f in res[k]}
    for stale in ("blocking_fraction", "overhead_fraction_with_interference", "extrapolation"):
        res.pop(stale, None)
    interval = int(record["config"].get("ckpt_interval", cfg.ckpt_interval))
    res["derived"] = derive(res, interval)
    if cfg.code_commit and not record["environment"].get("git_commit"):
        record["environment"]["git_commit"] = cfg.code_commit
    out_dir = output_root(cfg.reports_dir) / PROJECT
    atomic_write_json(out_dir / f"{record.get('name', bench_name(1))}.json", record)
    write_report(record, out_dir)
    return record


def _measure(cfg: BenchConfig, train_cfg, out: dict, outs: list[Path], t_start: float) -> None:
    """Phase 1 on this rank: baseline, sync save, async saves, background build. Rank 0 fills
    `out` and writes it to `outs` as it goes; every rank runs the same steps and saves."""
    import torch

    from .train import Trainer

    res = out["results"]
    tr = Trainer(train_cfg)
    t0 = time.perf_counter()
    tr.setup()
    main = tr.rank == 0
    write = _write if main else (lambda out, outs: None)
    say = print if main else (lambda *a, **k: None)
    res["setup_fresh_s"] = time.perf_counter() - t0
    res["n_params"] = sum(p.numel() for p in tr.model.parameters())
    res["tokens_per_step"] = tr.tokens_per_step
    for _ in range(cfg.warmup_steps):
        tr.train_step()
    times = sorted(tr.train_step()["step_s"] for _ in range(cfg.timed_steps))
    median = statistics.median(times)
    res["baseline"] = {
        "median_step_s": median,
        "min_step_s": times[0],
        "max_step_s": times[-1],
        "tokens_per_s": tr.tokens_per_step / median,
        "steps": cfg.timed_steps,
    }
    res["peak_gpu_mem_gib"] = (
        torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    )
    say(
        f"baseline: {median * 1e3:.1f} ms/step, {tr.tokens_per_step / median:,.0f} tok/s",
        flush=True,
    )
    write(out, outs)

    tr.ckpt.stager_kind = cfg.stager
    repeats = cfg.resolved_repeats()

    def over_budget(extra_s: float = 0.0) -> bool:  # rank 0's clock decides, for every rank
        late = main and bool(cfg.budget_s) and time.time() - t_start + extra_s > cfg.budget_s
        return _any_rank(tr, late)

    def record(name: str, raw: dict) -> None:
        res[name] = raw
        res["derived"] = derive(res, cfg.ckpt_interval)
        held = res["derived"].get(name, {}).get("held_s")
        say(
            f"{name}: held {held:.3f} s"
            + (f" (buffers built in {raw['build']['seconds']:.2f} s)" if raw.get("build") else ""),
            flush=True,
        )
        write(out, outs)

    def sync_save(rep: int) -> None:
        if rep > 1:
            _before_sync(tr)
        stats = tr.save("sync")
        res["sync" if rep == 1 else f"sync_{rep}"] = {
            "blocking_s": stats.blocking_s,
            "to_commit_s": stats.total_s,
            "bytes": stats.bytes,
            "repetition": rep,
        }
        res["derived"] = derive(res, cfg.ckpt_interval)
        say(f"sync save: {stats.blocking_s:.2f} s, {stats.bytes / 2**30:.2f} GiB", flush=True)
        write(out, outs)

    def async_saves(rep: int) -> None:
        if "async_cold" not in res:  # the first async save of the process, once
            record("async_cold", _async_save(tr, cfg.max_steps_during_write))
        for _ in range(cfg.steady_saves):
            if rep == 1 and over_budget():
                break
            n = len(_steady_keys(res)) + 1
            raw = _async_save(tr, cfg.max_steps_during_write)
            record(f"async_steady_{n}", {**raw, "repetition": rep})

    longest = 0.0
    res["repeats"] = {"asked": repeats, "run": 0, "order": []}
    for rep in range(repeats):
        if rep and over_budget(longest):
            res["repeats"]["note"] = (
                f"stopped after {rep} of {repeats} repetitions: one more (the longest took "
                f"{longest:.0f} s) would pass --budget-s {cfg.budget_s:g}"
            )
            say(res["repeats"]["note"], flush=True)
            break
        if repeats > 1:
            say(f"repetition {rep + 1} of {repeats}", flush=True)
        t_rep = time.time()
        order = repetition_order(["sync", "async"], rep)
        for name in order:
            (sync_save if name == "sync" else async_saves)(rep + 1)
        longest = max(longest, time.time() - t_rep)
        res["repeats"]["run"] = rep + 1
        res["repeats"]["order"].append(order)
        write(out, outs)
    if cfg.prestage and cfg.stager == "persistent" and not over_budget():
        record("prestage", _prestage(tr, cfg.max_steps_during_write))
        record("async_after_prestage", _async_save(tr, cfg.max_steps_during_write))
    res["steps_run"] = tr.step  # the resumed job resumes from the last save before it
    tr.close()
    tr = None  # free this process's GPU memory: the resumed job's pre-flight checks it
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    res["phase1_s"] = time.time() - t_start
    write(out, outs)


def _before_sync(tr) -> None:
    """Before a sync save that is not the process's first: one training step if the last save
    was of this step (a re-save would replace that checkpoint inside the timed save), and the
    committed checkpoints removed (rank 0), so that the save's retention deletes nothing while
    it is timed, as for the first one."""
    from .checkpoint.layout import list_checkpoints

    if tr.saves and tr.saves[-1].step == tr.step:
        tr.train_step()
    if tr.rank == 0:
        for path in list_checkpoints(tr.ckpt.root):
            shutil.rmtree(path, ignore_errors=True)
    _any_rank(tr, False)  # every rank waits for rank 0's removal


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, cfg, train_cfg, out, outs, t_start) -> None:
    """One spawned rank of phase 1: the environment torchrun would give it, then `_measure`."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    _measure(cfg, train_cfg, out, outs if rank == 0 else [], t_start)


def run(cfg: BenchConfig) -> dict:
    import torch

    from shared.results import environment, output_root

    from .config import TrainConfig
    from .faults import read_events
    from .runner import REPO_ROOT, child_env, torchrun_cmd

    if torch.cuda.is_available() and cfg.nproc > torch.cuda.device_count():
        raise ValueError(f"--nproc {cfg.nproc}: only {torch.cuda.device_count()} GPUs are visible")
    from shared.gpu_state import gpu_state

    t_start = time.time()
    gpu_start = gpu_state()  # clocks, temperature and power before the run (NVML)
    run_dir = Path(cfg.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    name = bench_name(cfg.nproc)
    outs = [output_root(cfg.reports_dir) / PROJECT / f"{name}.json"]
    train_cfg = TrainConfig(
        preset=cfg.preset,
        steps=100_000,
        global_batch=cfg.global_batch,
        seq_len=cfg.seq_len,
        run_dir=str(run_dir),
        ckpt_every=10**9,
        ckpt_mode="async",
        keep_last=1,
        ckpt_write_threads=cfg.write_threads,
        log_every=10**9,
    )
    env = environment(gpu_state_start=gpu_start)
    out: dict = {
        "schema": 1,
        "project": PROJECT,
        "name": name,
        "environment": env,
        "config": {**asdict(cfg), "train": train_cfg.to_dict()},
        "results": {},
    }
    out["results"]["world_size"] = cfg.nproc
    out["results"]["checkpoint_fs"] = _fs_of(run_dir.parent)
    if cfg.nproc == 1:
        _measure(cfg, train_cfg, out, outs, t_start)
    else:
        import torch.multiprocessing as mp

        mp.start_processes(
            _rank_main,
            nprocs=cfg.nproc,
            start_method="spawn",
            args=(cfg.nproc, _free_port(), cfg, train_cfg, out, outs, t_start),
        )
        out = json.loads(outs[-1].read_text())  # rank 0's record of phase 1
    res = out["results"]

    if cfg.resume:
        # A restarted job: same command, --resume auto; every rank kills itself (SIGKILL) before
        # its 2nd step, so that it does not write a 13 GB final checkpoint.
        from .runner import cli_args

        args = cli_args(
            **{
                k: v
                for k, v in train_cfg.to_dict().items()
                if k in ("preset", "global_batch", "seq_len", "run_dir", "ckpt_write_threads")
            },
            steps=res["steps_run"] + 10,
            ckpt_every=10**9,
            resume="auto",
            log_every=1,
            fault_injection=True,
        )
        kills = [{"kind": "kill", "after": 1, "rank": r} for r in range(cfg.nproc)]
        env_vars = child_env(faults=kills)
        env_vars["P03_LAUNCH_T"] = repr(time.time())
        cmd = (
            torchrun_cmd(cfg.nproc, args)
            if cfg.nproc > 1
            else [sys.executable, "-m", "project03_capstone_infra.train", *args]
        )
        t_launch = time.time()
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, env=env_vars, capture_output=True, text=True, timeout=300
        )
        wall = time.time() - t_launch
        events = read_events(run_dir / "events.jsonl")
        resume = next((e for e in events if e["event"] == "resume"), None)
        first = next(
            (
                e
                for e in events
                if e["event"] == "first_step" and e["attempt"] == 0 and e["t"] > t_launch
            ),
            None,
        )
        res["resume"] = {
            "to_first_new_step_s": first["since_launch_s"] if first else None,
            "from_step": resume["from_step"] if resume else None,
            "verify_s": resume["verify_s"] if resume else None,
            "load_s": resume["load_s"] if resume else None,  # verify + read + reshard
            "process_wall_s": wall,
            "returncode": proc.returncode,  # killed by design after the first step
            "stderr_tail": proc.stderr[-1500:] if first is None else "",
        }
        print(
            f"resume: first new step {res['resume']['to_first_new_step_s']} s after launch",
            flush=True,
        )
    res["total_s"] = time.time() - t_start
    res["derived"] = derive(res, cfg.ckpt_interval)
    # the GPU's state at the start and once everything ran (the environment was read at the start)
    out["environment"]["gpu_state"] = {"start": gpu_start, "end": gpu_state()}
    _write(out, outs)
    for o in outs:
        write_report(out, o.parent)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def command(cfg: BenchConfig) -> int:
    """`bench-checkpoint`: measure (or re-derive `--from-json`), write the record and report,
    and print the headline figures."""
    cfg.validate()
    out = rederive(cfg) if cfg.from_json else run(cfg)
    keys = ("baseline", "derived", "resume")
    print(json.dumps({k: out["results"].get(k) for k in keys}, indent=1, default=str))
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    from project03_capstone_infra.__main__ import main

    sys.exit(main(["bench-checkpoint", *sys.argv[1:]]))
