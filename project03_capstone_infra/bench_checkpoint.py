"""How long a checkpoint holds training, sync vs async, and how long a resume takes (GPU).

    python -m project03_capstone_infra.bench_checkpoint --preset 1b --out-dir reports/project03_capstone_infra

One process trains the preset with the project's trainer (FSDP2, bf16, AdamW) and measures:
- the median step time over `timed_steps` steps (after warm-up): the baseline;
- a synchronous save: training is held for the whole save (D2H copy, write, fsync, sha256,
  manifest, rename);
- two asynchronous saves (`dcp.async_save`, pinned-memory staging on a side stream): training is
  held while the save is started plus whatever the next optimizer step has to wait for the
  staging copy; the write, checksums and commit run in the background while training goes on.
  The first async save also pays for allocating and pinning the staging buffers; the second is
  the steady state. Step times while the background write runs are recorded as well (CPU work
  of the writer can slow the data loader: that is reported as interference, apart from blocking).
The fraction of time blocked at one checkpoint every `ckpt_interval` steps is
blocking / (ckpt_interval x median step time + blocking): the steps in between are not run,
they are extrapolated from the measured median.

Then a second process is launched like a restarted job (`train --resume auto`) and killed after
its first step: the time from its launch to the end of that step is the time to resume
(interpreter and torch start, CUDA/NCCL init, pre-flight, model build, checksum verification,
load and resharding, first step).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROJECT = "project03_capstone_infra"


@dataclass
class BenchConfig:
    """Sync vs async checkpoint blocking time and time to resume, on the current GPU."""

    preset: str = "1b"
    global_batch: int = 8
    seq_len: int = 0  # 0: the preset's max_seq_len
    ckpt_interval: int = 100  # steps between checkpoints for the blocking fraction
    warmup_steps: int = 3
    timed_steps: int = 10
    max_steps_during_write: int = 200  # keep training while an async save is written
    write_threads: int = 8  # files per rank written (and hashed) in parallel
    run_dir: str = "/tmp/p03-ckpt-bench"  # local disk of the machine; removed first
    out_dir: str = ""  # also write checkpoint_bench.json here
    budget_s: float = 0.0  # > 0: skip the second async save if phase 1 has run this long
    resume: bool = True  # measure the resume in a second process


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


def _async_save(tr, median: float, cap: int) -> dict:
    """Start an async save, keep training until it has committed; return its timings."""
    stats = tr.save("async")
    call_s = stats.blocking_s
    during = []
    while tr.ckpt.in_flight and len(during) < cap:
        during.append(tr.train_step()["step_s"])  # the first one waits for the staging copy
    tr.ckpt.wait()
    return {
        "call_s": call_s,
        "blocking_s": stats.blocking_s,  # call + waits for the staging copy before optimizer.step
        "staging_wait_s": stats.blocking_s - call_s,
        "to_commit_s": stats.total_s,
        "bytes": stats.bytes,
        "steps_during_write": len(during),
        "step_s_during_write": during,
        "interference_s": sum(
            max(0.0, d - median) for d in during[1:]
        ),  # slower steps, not counting the staging wait
    }


def run(cfg: BenchConfig) -> dict:
    import torch

    from shared.results import REPORTS_DIR, environment

    from .config import TrainConfig
    from .faults import read_events
    from .runner import REPO_ROOT, child_env
    from .train import Trainer

    t_start = time.time()
    run_dir = Path(cfg.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    outs = [Path(os.environ["OUT"]) / "checkpoint_bench.json"] if os.environ.get("OUT") else []
    outs.append(Path(cfg.out_dir or REPORTS_DIR / PROJECT) / "checkpoint_bench.json")
    train_cfg = TrainConfig(
        preset=cfg.preset, steps=100_000, global_batch=cfg.global_batch, seq_len=cfg.seq_len,
        run_dir=str(run_dir), ckpt_every=10**9, ckpt_mode="async", keep_last=1,
        ckpt_write_threads=cfg.write_threads, log_every=10**9,
    )  # fmt: skip
    env = environment()
    out: dict = {
        "schema": 1, "project": PROJECT, "name": "checkpoint_bench", "environment": env,
        "config": {**asdict(cfg), "train": train_cfg.to_dict()}, "results": {},
    }  # fmt: skip
    res = out["results"]
    res["checkpoint_fs"] = _fs_of(run_dir.parent)

    tr = Trainer(train_cfg)
    t0 = time.perf_counter()
    tr.setup()
    res["setup_fresh_s"] = time.perf_counter() - t0
    res["n_params"] = sum(p.numel() for p in tr.model.parameters())
    res["tokens_per_step"] = tr.tokens_per_step
    for _ in range(cfg.warmup_steps):
        tr.train_step()
    times = sorted(tr.train_step()["step_s"] for _ in range(cfg.timed_steps))
    median = times[len(times) // 2]
    res["baseline"] = {"median_step_s": median, "min_step_s": times[0], "max_step_s": times[-1],
                       "tokens_per_s": tr.tokens_per_step / median, "steps": cfg.timed_steps}  # fmt: skip
    res["peak_gpu_mem_gib"] = (
        torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    )
    print(
        f"baseline: {median * 1e3:.1f} ms/step, {tr.tokens_per_step / median:,.0f} tok/s",
        flush=True,
    )
    _write(out, outs)

    stats = tr.save("sync")
    res["sync"] = {
        "blocking_s": stats.blocking_s,
        "to_commit_s": stats.total_s,
        "bytes": stats.bytes,
    }
    print(f"sync save: {stats.blocking_s:.2f} s, {stats.bytes / 2**30:.2f} GiB", flush=True)
    _write(out, outs)
    res["async_cold"] = _async_save(tr, median, cfg.max_steps_during_write)
    print(f"async save (cold): blocking {res['async_cold']['blocking_s']:.3f} s", flush=True)
    _write(out, outs)
    if not cfg.budget_s or time.time() - t_start < cfg.budget_s:
        res["async_warm"] = _async_save(tr, median, cfg.max_steps_during_write)
        print(f"async save (warm): blocking {res['async_warm']['blocking_s']:.3f} s", flush=True)
    interval_s = cfg.ckpt_interval * median
    res["blocking_fraction"] = {
        k: res[k]["blocking_s"] / (interval_s + res[k]["blocking_s"])
        for k in ("sync", "async_cold", "async_warm") if k in res
    }  # fmt: skip
    res["overhead_fraction_with_interference"] = {
        k: (res[k]["blocking_s"] + res[k]["interference_s"]) / (interval_s + res[k]["blocking_s"])
        for k in ("async_cold", "async_warm") if k in res
    }  # fmt: skip
    res["extrapolation"] = (
        f"one checkpoint every {cfg.ckpt_interval} steps: the {cfg.ckpt_interval} steps between "
        f"two checkpoints are not run, their time is {cfg.ckpt_interval} x the measured median "
        f"step ({median * 1e3:.1f} ms)"
    )
    saved_step = tr.step
    tr.close()
    del tr  # free this process's GPU memory: the resumed job's pre-flight checks it
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    res["phase1_s"] = time.time() - t_start
    _write(out, outs)

    if cfg.resume:
        # A restarted job: same command, --resume auto; killed (SIGKILL) before its 2nd step so
        # that it does not write a 13 GB final checkpoint.
        from .runner import cli_args

        args = cli_args(**{k: v for k, v in train_cfg.to_dict().items() if k in ("preset", "global_batch", "seq_len", "run_dir", "ckpt_write_threads")},
                        steps=saved_step + 10, ckpt_every=10**9, resume="auto", log_every=1)  # fmt: skip
        env_vars = child_env(faults=[{"kind": "kill", "after": 1, "rank": 0}])
        env_vars["P03_LAUNCH_T"] = repr(time.time())
        t_launch = time.time()
        proc = subprocess.run([sys.executable, "-m", "project03_capstone_infra.train", *args],
                              cwd=REPO_ROOT, env=env_vars, capture_output=True, text=True, timeout=300)  # fmt: skip
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
            "returncode": proc.returncode,  # -9: killed by design after the first step
            "stderr_tail": proc.stderr[-1500:] if first is None else "",
        }
        print(
            f"resume: first new step {res['resume']['to_first_new_step_s']} s after launch",
            flush=True,
        )
    res["total_s"] = time.time() - t_start
    _write(out, outs)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    import tyro

    cfg = tyro.cli(BenchConfig, args=argv, description=__doc__.split("\n\n")[0])
    out = run(cfg)
    keys = ("baseline", "sync", "blocking_fraction", "resume")
    print(json.dumps({k: out["results"].get(k) for k in keys}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
