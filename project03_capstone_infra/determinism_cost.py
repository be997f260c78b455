"""What deterministic mode costs: tokens/s of the same short run with default and with
deterministic kernels, and whether each mode repeats bit for bit.

    python -m project03_capstone_infra determinism-cost              # GPUs: 125m on every GPU
    python -m project03_capstone_infra determinism-cost --repeats 2  # also: is each mode repeatable?

The runs alternate (default, deterministic, default, ...) so that a slow drift of the machine
(clocks, temperature) falls on both modes alike. Throughput is the median step time of each run
after `--warmup` steps (the trainer times each step to a CUDA synchronise; the only checkpoint
is the final one, after the last timed step), turned into tokens/s of the whole world; a mode's
figure is the median over its runs. With `--repeats 2` or more, the final model and optimizer
state of the runs of one mode are compared bit for bit: deterministic runs must be equal, while
default runs on GPUs usually are not (nothing is asserted about them; the record says which).

Writes determinism_cost.json (and a line in summary.md) to the reports folder.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from project03_capstone_infra import PROJECT

from . import runner
from .checkpoint.compare import compare_states
from .checkpoint.safe_read import read_full_state
from .faults import read_events
from .report.summary import write_summary

MODES = {"default": False, "deterministic": True}


@dataclass
class DeterminismCostConfig:
    """Tokens/s of the same short run in default and deterministic mode."""

    nproc: int = 0
    """ranks; 0: every GPU on a GPU machine, else 2 (gloo)"""
    preset: str = ""
    """model size; "": 125m on GPUs, tiny on CPU"""
    steps: int = 30
    """steps per run"""
    warmup: int = 5
    """first steps left out of the median (allocator, NCCL, autotuning)"""
    global_batch: int = 8
    repeats: int = 1
    """runs per mode; 2 or more also compares the runs of a mode bit for bit"""
    workdir: str = ""
    """where the runs go (default: a temporary directory, removed after)"""
    reports_dir: str = ""
    """default: a new runs/<UTC time>/; reports/ only when named"""
    timeout_s: float = 600.0
    """per launch"""

    def validate(self) -> DeterminismCostConfig:
        from shared.cli import require_finite, writable_dir

        if self.nproc < 0:
            raise ValueError(
                f"DeterminismCostConfig.nproc must be >= 0 (0: automatic), got {self.nproc}"
            )
        if self.preset not in ("", "tiny", "125m", "1b"):
            raise ValueError(
                "DeterminismCostConfig.preset must be one of ('', 'tiny', '125m', "
                f"'1b'), got {self.preset!r}"
            )
        for name in ("steps", "global_batch", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"DeterminismCostConfig.{name} must be >= 1, got {getattr(self, name)}"
                )
        if not 0 <= self.warmup <= self.steps - 3:
            raise ValueError(
                f"DeterminismCostConfig.warmup must be in [0, steps - 3] (at least 3 "
                f"timed steps), got {self.warmup} with {self.steps} steps"
            )
        require_finite("DeterminismCostConfig", self, ("timeout_s",))
        if not self.timeout_s > 0:
            raise ValueError(f"DeterminismCostConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.workdir:
            writable_dir("--workdir", self.workdir)
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        return self


def _log(msg: str) -> None:
    runner.log("determinism_cost", msg)


def step_times(run_dir: Path, warmup: int) -> list[float]:
    """Rank 0's step times (s) of the run's first launch after `warmup` steps, in step order."""
    events = read_events(Path(run_dir) / "events.jsonl")
    steps = {
        e["step"]: e["step_s"]
        for e in events
        if e["event"] == "step" and e["rank"] == 0 and e["attempt"] == 0
    }
    return [steps[s] for s in sorted(steps) if s > warmup]


def run(cfg: DeterminismCostConfig) -> dict:
    import torch

    from shared.cli import writable_dir
    from shared.model import ModelArgs
    from shared.results import output_root, save_result

    cfg.validate()
    cuda = torch.cuda.is_available()
    nproc = cfg.nproc or (torch.cuda.device_count() if cuda else 2)
    preset = cfg.preset or ("125m" if cuda else "tiny")
    seq_len = ModelArgs.from_preset(preset).max_seq_len
    tokens_per_step = cfg.global_batch * seq_len
    out_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", out_dir / PROJECT)
    work = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="p03-detcost-"))
    train_args = dict(
        preset=preset,
        steps=cfg.steps,
        global_batch=cfg.global_batch,
        ckpt_every=cfg.steps,
        keep_last=1,
        log_every=cfg.steps,
        resume="never",
    )
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(cfg.repeats):
        for mode, deterministic in MODES.items():
            run_dir = work / f"{mode}_{r}"
            shutil.rmtree(run_dir, ignore_errors=True)
            done = runner.launch(
                run_dir,
                nproc=nproc,
                timeout=cfg.timeout_s,
                deterministic=deterministic,
                **train_args,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"the {mode} run failed (rc {done.returncode}):\n{done.output[-3000:]}"
                )
            times = step_times(run_dir, cfg.warmup)
            med = statistics.median(times)
            runs[mode].append(
                {
                    "run_dir": run_dir.name,
                    "median_step_s": med,
                    "tokens_per_s": tokens_per_step / med,
                    "timed_steps": len(times),
                    "step_s": times,
                    "launch_s": done.seconds,
                }
            )
            _log(
                f"{mode} run {r + 1}/{cfg.repeats}: median step {1e3 * med:.1f} ms, "
                f"{tokens_per_step / med:,.0f} tok/s"
            )
    modes = {}
    for mode, rs in runs.items():
        tps = statistics.median(r["tokens_per_s"] for r in rs)
        modes[mode] = {
            "tokens_per_s": tps,
            "runs": rs,
            "tokens_per_s_range": [
                min(r["tokens_per_s"] for r in rs),
                max(r["tokens_per_s"] for r in rs),
            ],
        }
        if len(rs) > 1:
            first = read_full_state(runner.final_checkpoint(work / rs[0]["run_dir"]))
            diffs = [
                compare_states(first, read_full_state(runner.final_checkpoint(work / r["run_dir"])))
                for r in rs[1:]
            ]
            modes[mode]["repeats_bitwise_equal"] = not any(diffs)
            modes[mode]["differences"] = [d[:5] for d in diffs]
    cost = 1 - modes["deterministic"]["tokens_per_s"] / modes["default"]["tokens_per_s"]
    results = {
        "tokens_per_step": tokens_per_step,
        "nproc": nproc,
        "backend": "nccl" if cuda else "gloo",
        "dtype": "bfloat16" if cuda else "float32",
        "modes": modes,
        "throughput_cost": cost,  # fraction of default tokens/s lost in deterministic mode
    }
    config = {
        **asdict(cfg),
        "nproc": nproc,
        "preset": preset,
        "seq_len": seq_len,
        "train": train_args,
    }
    path = save_result(
        PROJECT,
        "determinism_cost",
        results,
        baseline={"default_tokens_per_s": modes["default"]["tokens_per_s"]},
        config=config,
        reports_dir=out_dir,
    )
    write_summary(out_dir)
    _log(
        f"deterministic mode: {modes['deterministic']['tokens_per_s']:,.0f} tok/s vs default "
        f"{modes['default']['tokens_per_s']:,.0f} tok/s ({-100 * cost:+.1f}%); wrote {path}"
    )
    if not cfg.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return results


def command(cfg: DeterminismCostConfig) -> int:
    """`determinism-cost`: the runs and the record; exit status 1 when deterministic runs
    differ."""
    with runner.jobs_end_with_this_process():
        res = run(cfg.validate())
    det = res["modes"]["deterministic"].get("repeats_bitwise_equal")
    return 1 if det is False else 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project03_capstone_infra.__main__ import main

    sys.exit(main(["determinism-cost", *sys.argv[1:]]))
