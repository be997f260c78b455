"""Resharding: a run trained on A ranks continues on B ranks, and its loss curve stays put.

    python -m project03_capstone_infra reshard                         # CPU: 2 gloo ranks <-> 1
    python -m project03_capstone_infra reshard --deterministic --preset 125m   # 2 GPUs <-> 1

For each direction A -> B (2 -> 1, 1 -> 2): an uninterrupted reference run on A ranks, and the
same run stopped after step N on A ranks (`--stop-after N`: a checkpoint at N, the schedule still
spanning every step) then continued on B ranks to the end; DCP reshards the FSDP shards of the
model and optimizer, the data stream is indexed by step and needs nothing. What it checks:

- Where the world size does not change, everything is bitwise: the losses of steps 1..N and
  the checkpoint at step N equal the reference's bit for bit.
- The first step after the change starts from that exact state on the same batch; only the
  order of its sums differs (another split of the batch over ranks, another reduction). Its
  loss is within `first_step_tolerance` of the reference's (`TOLERANCE`, from the arithmetic).
- Later steps drift apart by rounding only; their largest relative difference is recorded.

Writes reshard.json (curves, checks, environment) and reshard.png to the reports folder.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from project03_capstone_infra import PROJECT

from . import runner
from .checkpoint.compare import compare_states
from .checkpoint.safe_read import read_full_state
from .report.reshard import render
from .report.summary import write_summary

# Relative tolerance of the first loss after the change, by compute dtype. float32: one rank
# sums the batch's tokens at once, two ranks sum halves; a sum of n terms moves by at most
# (n - 1) u sum|terms| (u = 2**-24), and the forward's chains of sums add up to a few thousand
# terms for the tiny model (the derivation in tests/.../test_fault_tolerance.py: 1.2e-4), more
# for wider ones: 1e-3. bfloat16: every matmul output is rounded to 8 bits of mantissa, and a
# different split of the batch can flip that rounding by one unit (2**-8) where the float32
# accumulations differ; the loss averages these over every token, so they largely cancel:
# 2**-6 (four units). A wrongly resharded model moves it by far more (a scrambled shard gives a
# loss near log(vocab)).
TOLERANCE = {"float32": 1e-3, "bfloat16": 2.0**-6}


@dataclass
class ReshardConfig:
    """Train on A ranks, continue on B ranks: loss continuity across the change of world size."""

    directions: tuple[str, ...] = ("2-1", "1-2")
    """A-B pairs of world sizes (ranks or GPUs)"""
    preset: str = "tiny"
    steps: int = 24
    """total steps of every run"""
    switch_after: int = 12
    """the world size changes after this step"""
    global_batch: int = 8
    deterministic: bool = False
    """deterministic kernels (GPU: the bitwise part needs it)"""
    pg_timeout_s: float = 120.0
    workdir: str = ""
    """where the runs go (default: a temporary directory, removed after)"""
    keep: bool = False
    """keep the run directories"""
    reports_dir: str = ""
    """default: a new runs/<UTC time>/; reports/ only when named"""
    timeout_s: float = 600.0
    """per launch"""

    def pairs(self) -> list[tuple[int, int]]:
        """The directions as (A, B) world sizes; ValueError naming a malformed one."""
        out = []
        for d in self.directions:
            a, _, b = d.partition("-")
            if not (a.isdigit() and b.isdigit()) or int(a) < 1 or int(b) < 1 or int(a) == int(b):
                raise ValueError(
                    f"ReshardConfig.directions: {d!r} is not A-B with two different "
                    "positive world sizes (e.g. 2-1)"
                )
            out.append((int(a), int(b)))
        return out

    def validate(self) -> ReshardConfig:
        from shared.cli import require_finite, writable_dir

        if self.preset not in ("tiny", "125m", "1b"):
            raise ValueError(
                f"ReshardConfig.preset must be one of ('tiny', '125m', '1b'), got {self.preset!r}"
            )
        for name in ("steps", "switch_after", "global_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"ReshardConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.switch_after >= self.steps:
            raise ValueError(
                f"ReshardConfig.switch_after ({self.switch_after}) must be below "
                f"steps ({self.steps})"
            )
        require_finite("ReshardConfig", self, ("pg_timeout_s", "timeout_s"))
        for name in ("pg_timeout_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ReshardConfig.{name} must be > 0, got {getattr(self, name)}")
        if not self.directions:
            raise ValueError("ReshardConfig.directions: expected at least one A-B pair, e.g. 2-1")
        for pair in self.pairs():
            for n in pair:
                if self.global_batch % n:
                    raise ValueError(
                        f"ReshardConfig.global_batch ({self.global_batch}) must be a "
                        f"multiple of every world size, {n} is not a divisor"
                    )
        if self.workdir:
            writable_dir("--workdir", self.workdir)
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        return self


def _log(msg: str) -> None:
    runner.log("reshard", msg)


def _launch(run_dir: Path, cfg: ReshardConfig, nproc: int, what: str, **overrides) -> None:
    args = dict(
        preset=cfg.preset,
        steps=cfg.steps,
        global_batch=cfg.global_batch,
        ckpt_every=cfg.switch_after,
        milestone_every=cfg.switch_after,
        keep_last=2,
        log_every=cfg.steps,
        pg_timeout_s=cfg.pg_timeout_s,
        deterministic=cfg.deterministic,
    )
    args.update(overrides)
    done = runner.launch(run_dir, nproc=nproc, timeout=cfg.timeout_s, **args)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (rc {done.returncode}):\n{done.output[-3000:]}")
    _log(f"{what}: {done.seconds:.1f} s")


def _step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:08d}"


def compare_direction(ref_dir: Path, run_dir: Path, n: int, tolerance: float) -> dict:
    """The checks of one direction from the two runs' files (events and checkpoints)."""
    from .faults import read_events

    ref, got = runner.loss_curve(ref_dir), runner.loss_curve(run_dir)
    pre = [s for s in ref if s <= n]
    diffs = compare_states(
        read_full_state(_step_dir(ref_dir, n)), read_full_state(_step_dir(run_dir, n))
    )
    after = {s: abs(got[s] - ref[s]) / abs(ref[s]) for s in got if s > n and s in ref}
    first = n + 1
    resumes = [e for e in read_events(run_dir / "events.jsonl") if e["event"] == "resume"]
    return {
        "losses_before_bitwise": all(got.get(s) == ref[s] for s in pre) and len(pre) == n,
        "state_at_switch_bitwise": not diffs,
        "state_differences": diffs[:10],
        "first_after": {
            "step": first,
            "loss": got.get(first),
            "reference": ref.get(first),
            "rel_diff": after.get(first),
            "tolerance": tolerance,
            "ok": first in after and after[first] <= tolerance,
        },
        "max_rel_diff_after": max(after.values()) if after else None,
        "final_loss": got.get(max(ref)),
        "reference_final_loss": ref.get(max(ref)),
        "resumed_from": resumes[-1]["from_step"] if resumes else None,
        "saved_world_size": resumes[-1]["saved_world_size"] if resumes else None,
        "curve": got,
        "reference_curve": ref,
    }


def run(cfg: ReshardConfig) -> dict:
    import torch

    from shared.cli import writable_dir
    from shared.results import load_result, output_root, save_result

    cfg.validate()
    cuda = torch.cuda.is_available()
    pairs = cfg.pairs()
    if cuda and max(max(w) for w in pairs) > torch.cuda.device_count():
        raise ValueError(
            f"ReshardConfig.directions {list(cfg.directions)} need more GPUs than "
            f"the {torch.cuda.device_count()} visible"
        )
    dtype = "bfloat16" if cuda else "float32"
    out_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", out_dir / PROJECT)
    work = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="p03-reshard-"))
    n = cfg.switch_after
    refs: dict[int, Path] = {}
    directions = []
    for a, b in pairs:
        if a not in refs:
            refs[a] = work / f"reference_{a}"
            shutil.rmtree(refs[a], ignore_errors=True)
            _launch(refs[a], cfg, a, f"reference on {a} rank(s), {cfg.steps} steps")
        run_dir = work / f"{a}_to_{b}"
        shutil.rmtree(run_dir, ignore_errors=True)
        _launch(run_dir, cfg, a, f"{a} rank(s) to step {n}", stop_after=n)
        _launch(run_dir, cfg, b, f"continued on {b} rank(s) to step {cfg.steps}")
        d = compare_direction(refs[a], run_dir, n, TOLERANCE[dtype])
        d.update({"from_world": a, "to_world": b})
        before = d["losses_before_bitwise"] and d["state_at_switch_bitwise"]
        first = d["first_after"]
        _log(
            f"{a} -> {b}: steps 1-{n} {'bitwise equal' if before else 'DIFFERENT'}; first loss "
            f"after the change off by {first['rel_diff'] if first['rel_diff'] is not None else float('nan'):.2e} "
            f"relative (tolerance {first['tolerance']:.1e})"
        )
        directions.append(d)
    results = {
        "deterministic": cfg.deterministic,
        "dtype": dtype,
        "backend": "nccl" if cuda else "gloo",
        "switch_after": n,
        "continuous": all(d["first_after"]["ok"] for d in directions),
        "bitwise_before_switch": all(
            d["losses_before_bitwise"] and d["state_at_switch_bitwise"] for d in directions
        ),
        "directions": directions,
    }
    path = save_result(PROJECT, "reshard", results, config=asdict(cfg), reports_dir=out_dir)
    render(load_result(path), out_dir / PROJECT)
    write_summary(out_dir)
    ok = results["continuous"] and results["bitwise_before_switch"]
    _log(f"{'OK' if ok else 'FAILED'}: wrote {path} and reshard.png")
    if not cfg.keep and not cfg.workdir:
        shutil.rmtree(work, ignore_errors=True)
    elif cfg.keep:
        _log(f"runs kept under {work}")
    return results


def command(cfg: ReshardConfig) -> int:
    """`reshard`: every direction and the report; exit status 1 when a check fails."""
    with runner.jobs_end_with_this_process():
        res = run(cfg.validate())
    return 0 if res["continuous"] and res["bitwise_before_switch"] else 1


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project03_capstone_infra.__main__ import main

    sys.exit(main(["reshard", *sys.argv[1:]]))
