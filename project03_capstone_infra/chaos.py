"""The demonstration: a reference run, then the same run under injected faults, compared.

    python -m project03_capstone_infra.chaos            # CPU: 2 gloo ranks, tiny model, ~1-2 min
    python -m project03_capstone_infra.chaos --nproc 2 --deterministic      # 2 GPUs: chaos_gpu.*
    python -m project03_capstone_infra.chaos --nproc 2 --deterministic --preset 125m --steps 40 \\
        --ckpt-every 4 --sigterm-deadline-s 20    # 1.6 GB checkpoints: the preemption save needs >5 s

The faulted run is one torchrun job with --max-restarts, as on a cluster, followed by a
requeue after its preemption. What happens to it, in order (steps drawn at random from --seed):

    attempt 0   kill -9 of a random rank                       torchrun restarts the group
    attempt 1   a NaN loss (transient)                          rolled back in-process, replayed
                one rank hangs                                   peers time out (--pg-timeout-s)
    attempt 2   newest checkpoint's shard truncated, kill -9     resume skips it (size check)
    attempt 3   one byte of the newest checkpoint flipped, kill  resume skips it (sha256)
    attempt 4   SIGTERM to the launcher (spot preemption)        saved in time, exit 75
    requeue     the same command again                          resumes, runs to the end

Then it checks that the final model and optimizer state are bitwise identical to the reference
run's and that both loss curves are the same, and writes to reports/project03_capstone_infra/:
chaos.json (with the environment), chaos.md (the fault table), chaos_loss.png (both curves)
and chaos_timeline.png (training progress against wall time, faults marked). On GPUs the stem
is chaos_gpu (chaos_gpu.json, ...), so a GPU run never overwrites the CPU report; `--report-name`
chooses another. On GPUs the bitwise claim needs `--deterministic` (shared.determinism): the
default kernels differ run to run. On NCCL a hung rank's peers are ended by NCCL's watchdog
after --pg-timeout-s (the process is torn down, so no `collective_failure` event is written:
the fault table shows "n/a" for its detection time), and torchrun restarts the group.
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from project03_capstone_infra import PROJECT
from shared.progress import progress

from . import runner
from .checkpoint.compare import compare_states
from .checkpoint.safe_read import read_full_state
from .faults import read_events
from .report.chaos import coverage, render
from .report.summary import write_summary


@dataclass
class ChaosConfig:
    """Reference run vs the same run under kill -9, NaN, hang, corrupt checkpoints, SIGTERM."""

    nproc: int = 0
    """ranks; 0: the GPU count on a GPU machine, else 2 (gloo)"""
    preset: str = "tiny"
    steps: int = 60
    global_batch: int = 8
    ckpt_every: int = 5
    seed: int = 0
    """draws the fault steps and ranks"""
    pg_timeout_s: float = 5.0
    """how long the hung rank's peers wait"""
    sigterm_deadline_s: float = 0.0
    """preemption save deadline; 0: max(5, pg_timeout_s) (125m: 20)"""
    workdir: str = ""
    """where the runs go (default: a temporary directory, removed after)"""
    keep: bool = False
    """keep the run directories"""
    reports_dir: str = ""
    """default: a new runs/<UTC time>/; reports/ only when named"""
    timeout_s: float = 900.0
    """per launch"""
    deterministic: bool = False
    """deterministic kernels in every launch (needed for bitwise on GPU)"""
    report_name: str = ""
    """file stem of the outputs; default chaos (CPU) or chaos_gpu (GPUs)"""

    def validate(self) -> ChaosConfig:
        from shared.cli import require_finite, writable_dir

        if self.nproc < 0:
            raise ValueError(f"ChaosConfig.nproc must be >= 0 (0: automatic), got {self.nproc}")
        for name in ("steps", "global_batch", "ckpt_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"ChaosConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.preset not in ("tiny", "125m", "1b"):
            raise ValueError(
                f"ChaosConfig.preset must be one of ('tiny', '125m', '1b'), got {self.preset!r}"
            )
        require_finite("ChaosConfig", self, ("pg_timeout_s", "timeout_s", "sigterm_deadline_s"))
        if self.sigterm_deadline_s < 0:
            raise ValueError(
                f"ChaosConfig.sigterm_deadline_s must be >= 0 (0: automatic), got "
                f"{self.sigterm_deadline_s}"
            )
        for name in ("pg_timeout_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ChaosConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.steps < 10 * self.ckpt_every:
            raise ValueError(
                f"ChaosConfig.steps ({self.steps}) must be at least 10 x ckpt_every "
                f"({self.ckpt_every}) to fit the faults"
            )
        if self.report_name and not _STEM.match(self.report_name):
            raise ValueError(
                "ChaosConfig.report_name must be a file stem of letters, digits, '_' "
                f"and '-' (e.g. chaos_gpu), got {self.report_name!r}"
            )
        if self.workdir:
            writable_dir("--workdir", self.workdir)
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        return self


_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def report_name(cfg: ChaosConfig, cuda: bool) -> str:
    """The outputs' file stem: --report-name, else chaos_gpu on GPUs and chaos on CPU."""
    return cfg.report_name or ("chaos_gpu" if cuda else "chaos")


def _log(msg: str) -> None:
    runner.log("chaos", msg)


def plan_faults(cfg: ChaosConfig, nproc: int) -> tuple[list[dict], int]:
    """The hook faults of the faulted run (by attempt) and the step at which SIGTERM is sent.
    Each fault's step lies after the previous one's, so each is reached in its attempt."""
    rng = random.Random(cfg.seed)
    s, e = cfg.steps, cfg.ckpt_every
    if s < 10 * e:
        raise ValueError(f"steps ({s}) must be at least 10 x ckpt_every ({e}) to fit the faults")
    span = s // 9

    def pick(lo: int) -> int:
        return rng.randint(lo + 2, lo + span)

    rank = lambda: rng.randrange(nproc)  # noqa: E731
    kill = pick(e)
    nan = pick(kill)
    hang = pick(nan)
    trunc = pick(hang) + e  # past a fresh checkpoint, so there is one to damage
    flip = pick(trunc) + e
    sigterm = pick(flip)
    faults = [
        {"kind": "kill", "step": kill, "rank": rank(), "attempt": 0},
        {"kind": "nan", "step": nan, "rank": rank(), "attempt": 1},
    ]
    attempt = 2
    if nproc > 1:  # a hang needs a peer to notice it
        faults.append({"kind": "hang", "step": hang, "rank": rank(), "attempt": 1})
    else:
        attempt = 1
        faults[1]["attempt"] = None
        faults.insert(1, {"kind": "kill", "step": hang, "rank": 0, "attempt": 1})
    faults.append({"kind": "truncate", "step": trunc, "rank": rank(), "attempt": attempt})
    faults.append({"kind": "flip", "step": flip, "rank": rank(), "attempt": attempt + 1})
    return faults, sigterm


def _first(events: list[dict], after_t: float, pred) -> dict | None:
    return next((e for e in events if e["t"] > after_t and pred(e)), None)


def fault_table(events: list[dict], sigterm_sent_t: float | None) -> list[dict]:
    """One row per fault: when it hit, what it cost (steps lost) and how long until training
    was running again (first new step) and back where it was (caught up)."""
    events = sorted(events, key=lambda e: e["t"])
    hits = [e for e in events if e["event"] == "fault" and e["kind"] != "sigterm"]
    pre = next((e for e in events if e["event"] == "preempted"), None)
    if pre is not None and sigterm_sent_t is not None:
        hits.append(
            {
                "t": sigterm_sent_t,
                "kind": "sigterm",
                "step": pre["step"] + 1,
                "rank": "all",
                "detail": f"saved step {pre['step']} in {pre['save_s']:.2f} s, exit 75",
            }
        )
    rows = []
    for f in sorted(hits, key=lambda e: e["t"]):
        done_before = f["step"] - 1  # hooks fire before the step runs
        rec = _first(
            events, f["t"], lambda e: e["event"] in ("resume", "rollback") and e["rank"] == 0
        )
        if rec is None:
            rows.append({"fault": f["kind"], "at_step": done_before, "recovered": False})
            continue
        back = rec["from_step"]
        new = _first(
            events, rec["t"], lambda e, b=back: e["event"] == "step" and e["step"] == b + 1
        )
        caught = _first(
            events, rec["t"], lambda e, d=done_before: e["event"] == "step" and e["step"] >= d
        )
        how = {
            "kill": "torchrun restarted the group; resumed from the newest good checkpoint",
            "nan": "non-finite loss seen by every rank; rolled back in-process",
            "hang": "peers' collective timed out; torchrun restarted the group",
            "truncate": "size check failed; checkpoint quarantined, fell back one",
            "flip": "sha256 check failed; checkpoint quarantined, fell back one",
            "sigterm": "saved within the deadline, exited 75; the requeued job resumed",
        }[f["kind"]]
        # The peers' own report of the timeout, before the recovery (a later fault's does not
        # count). Under NCCL the watchdog tears the process down without one.
        timeout = _first(
            events, f["t"], lambda e, r=rec["t"]: e["event"] == "collective_failure" and e["t"] <= r
        )
        if f["kind"] == "hang" and timeout is None:
            how = (
                "peers' collective timed out; NCCL's watchdog ended them; torchrun restarted "
                "the group"
            )
        rows.append(
            {
                "fault": f["kind"],
                "rank": f["rank"],
                "at_step": done_before,
                "resumed_from": back,
                "steps_lost": max(0, done_before - back),
                "detected_s": (timeout["t"] - f["t"]) if f["kind"] == "hang" and timeout else None,
                "to_first_new_step_s": (new["t"] - f["t"]) if new else None,
                "to_caught_up_s": (caught["t"] - f["t"]) if caught else None,
                "skipped": "; ".join(f"{n}: {w}" for n, w in rec.get("skipped") or []),
                "recovery": how,
                "detail": f.get("detail", ""),
                "recovered": new is not None,
            }
        )
    return rows


def timeline(ref_events: list[dict], fault_events: list[dict], marks) -> dict:
    """What the timeline chart draws, for the record: (seconds since launch, step reached) of
    both runs and the faults (seconds, kind, step), so the chart redraws from the JSON alone."""

    def points(evs: list[dict]) -> list[list[float]]:
        starts = [e["t"] for e in evs if e["event"] == "start"]
        if not starts:
            return []
        t0 = min(starts)
        return [[round(e["t"] - t0, 3), e["step"]] for e in evs if e["event"] == "step"]

    starts = [e["t"] for e in fault_events if e["event"] == "start"]
    t0 = min(starts) if starts else 0.0
    return {
        "reference": points(ref_events),
        "faulted": points(fault_events),
        "faults": [{"t": round(t - t0, 3), "kind": k, "step": step} for t, k, step in marks],
    }


def _steps_done(events: list[dict]) -> int:
    return max((e["step"] for e in events if e["event"] == "step" and e["rank"] == 0), default=0)


def _fault_status(events: list[dict], faults: list[dict], sigterm_step: int) -> str:
    """What the faulted run is going through: the launch attempt, the last fault that hit and
    what comes next."""
    attempt = max((e["attempt"] for e in events if e["event"] == "start"), default=0)
    hit = [e for e in events if e["event"] == "fault"]
    fired = {(e["kind"], e["step"]) for e in hit}
    pending = [f for f in faults if (f["kind"], f["step"]) not in fired]
    parts = [f"attempt {attempt}"]
    if hit:
        last = hit[-1]
        parts.append(f"last fault: {last['kind']} @ step {last['step']} (rank {last['rank']})")
    nxt = min(pending, key=lambda f: f["step"]) if pending else None
    parts.append(
        f"next: {nxt['kind']} @ step {nxt['step']}"
        if nxt
        else f"next: SIGTERM after step {sigterm_step}"
    )
    return "; ".join(parts)


def _follow(
    proc, run_dir: Path, bar, timeout: float, *, until_step: int | None = None, status=None
) -> None:
    """Show a run's progress from its event log until it ends (or reaches `until_step`)."""
    deadline = time.time() + timeout
    events_path = run_dir / "events.jsonl"
    while True:
        events = read_events(events_path)
        done = _steps_done(events)
        bar.set(done, status=status(events) if status else None)
        if until_step is not None and done >= until_step:
            return
        if proc.poll() is not None:
            if until_step is not None:
                raise RuntimeError(f"the run ended (rc {proc.returncode}) before step {until_step}")
            return
        if time.time() > deadline:
            what = f"step {until_step} not reached" if until_step else "the run did not finish"
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(0.05 if until_step is not None else 0.25)


def _launch_followed(run_dir: Path, what: str, cfg: ChaosConfig, *, nproc: int, **train_args):
    """runner.launch, with a progress display of the steps the run has done."""
    done = _steps_done(read_events(run_dir / "events.jsonl"))  # a requeue resumes from there
    t0 = time.time()
    proc = runner.start(run_dir, nproc=nproc, **train_args)
    try:
        with progress(cfg.steps, what, every=max(1, cfg.steps // 6), start=done) as bar:
            _follow(proc, run_dir, bar, cfg.timeout_s)
    except TimeoutError:
        pass  # runner.finish kills it and says so, with the output
    return runner.finish(proc, t0, max(1.0, cfg.timeout_s - (time.time() - t0)))


def run(cfg: ChaosConfig) -> dict:
    import torch

    from shared.cli import writable_dir
    from shared.results import load_result, output_root, save_result

    cfg.validate()
    cuda = torch.cuda.is_available()
    nproc = cfg.nproc or (torch.cuda.device_count() if cuda else 2)
    name = report_name(cfg, cuda)
    faults, sigterm_step = plan_faults(cfg, nproc)
    out_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", out_dir / PROJECT)  # before two training runs, not after
    work = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="p03-chaos-"))
    ref_dir, run_dir = work / "reference", work / "faulted"
    for d in (ref_dir, run_dir):
        if d.exists():
            shutil.rmtree(d)
    train_args = dict(
        preset=cfg.preset,
        steps=cfg.steps,
        global_batch=cfg.global_batch,
        ckpt_every=cfg.ckpt_every,
        keep_last=3,
        log_every=cfg.steps,
        pg_timeout_s=cfg.pg_timeout_s,
        sigterm_deadline_s=cfg.sigterm_deadline_s or max(5.0, cfg.pg_timeout_s),
        deterministic=cfg.deterministic,
    )

    mode = "deterministic mode" if cfg.deterministic else "default kernels"
    _log(
        f"reference run: {nproc} ranks ({'NCCL' if cuda else 'gloo'}, {mode}), {cfg.preset}, "
        f"{cfg.steps} steps, checkpoint every {cfg.ckpt_every}"
    )
    ref = _launch_followed(ref_dir, "reference", cfg, nproc=nproc, **train_args)
    if ref.returncode != 0:
        raise RuntimeError(f"the reference run failed (rc {ref.returncode}):\n{ref.output[-3000:]}")
    _log(f"reference done in {ref.seconds:.1f} s")

    plan = ", ".join(f"{f['kind']}@{f['step']}(rank {f['rank']})" for f in faults)
    _log(f"faulted run: {plan}, SIGTERM when step {sigterm_step} is done")
    t0 = time.time()
    proc = runner.start(run_dir, nproc=nproc, max_restarts=len(faults), faults=faults, **train_args)
    with progress(cfg.steps, "faulted run", every=max(1, cfg.steps // 6)) as bar:
        _follow(
            proc,
            run_dir,
            bar,
            cfg.timeout_s,
            until_step=sigterm_step,
            status=lambda ev: _fault_status(ev, faults, sigterm_step),
        )
    sigterm_t = time.time()
    _log(f"step {sigterm_step} done: SIGTERM to the launcher (a spot preemption)")
    proc.send_signal(signal.SIGTERM)
    first = runner.finish(proc, t0, cfg.timeout_s)
    if not any(e["event"] == "preempted" for e in read_events(run_dir / "events.jsonl")):
        raise RuntimeError(f"the faulted run did not save on SIGTERM:\n{first.output[-3000:]}")
    _log(f"preempted after {first.seconds:.1f} s (torchrun rc {first.returncode}); requeueing")
    second = _launch_followed(run_dir, "requeued run", cfg, nproc=nproc, **train_args)
    if second.returncode != 0:
        raise RuntimeError(f"the requeued run failed:\n{second.output[-3000:]}")
    faulted_s = time.time() - t0
    _log(f"faulted run finished after {faulted_s:.1f} s in all")

    ref_events = read_events(ref_dir / "events.jsonl")
    events = read_events(run_dir / "events.jsonl")
    rows = fault_table(events, sigterm_t)
    ref_curve, curve = runner.loss_curve(ref_dir), runner.loss_curve(run_dir)
    a = read_full_state(runner.final_checkpoint(ref_dir))
    b = read_full_state(runner.final_checkpoint(run_dir))
    diffs = compare_states(a, b)
    n_tensors = sum(k.startswith(("model.", "optim.")) for k in a)
    replays = runner.replay_mismatches(run_dir)
    identical = not diffs and ref_curve == curve and not replays
    attempts = len(
        {(e["attempt"], e["pid"]) for e in events if e["event"] == "start" and e["rank"] == 0}
    )

    launch_modes = {
        bool(e.get("deterministic")) for e in events + ref_events if e["event"] == "start"
    }
    results = {
        "identical": identical,
        "deterministic": cfg.deterministic,
        "every_launch_in_that_mode": launch_modes == {cfg.deterministic},
        "final_state_bitwise_equal": not diffs,
        "tensors_compared": n_tensors,
        "state_differences": diffs[:20],
        "loss_curves_equal": ref_curve == curve,
        "replayed_steps_with_other_loss": replays,
        "final_loss": curve.get(cfg.steps),
        "reference_final_loss": ref_curve.get(cfg.steps),
        "faults": rows,
        "process_launches": attempts,
        "reference_wall_s": ref.seconds,
        "faulted_wall_s": faulted_s,
        "steps_lost_total": sum(r.get("steps_lost", 0) for r in rows),
        "loss_curve": {"reference": ref_curve, "faulted": curve},
    }
    marks = [(e["t"], e["kind"], e["step"]) for e in events if e["event"] == "fault"]
    marks.append((sigterm_t, "sigterm", sigterm_step))
    results["timeline"] = timeline(ref_events, events, marks)
    # Did the run go through every planned fault, and is every restart one of them?
    cov = coverage(faults, results["timeline"])
    results.update(cov)
    results["all_faults_fired"] = not cov["faults_not_fired"]
    if cov["faults_not_fired"] or cov["unexplained_restarts"]:
        # The workers' own account of what ended a launch nobody planned to end (C++ stack
        # frames left out: they fill the tail without saying which step or rank failed).
        lines = [ln for ln in first.output.splitlines() if not ln.startswith("frame #")]
        results["torchrun_output_tail"] = "\n".join(lines)[-20000:]
        for f in cov["faults_not_fired"]:
            _log(f"WARNING: {f['kind']} @ step {f['step']} (rank {f['rank']}) never fired")
        for u in cov["unexplained_restarts"]:
            _log(
                f"WARNING: after step {u['after_step']} the run restarted from step "
                f"{u['resumed_at_step'] - 1} with no planned fault (torchrun output in the record)"
            )
    config = {
        **asdict(cfg),
        "nproc": nproc,
        "backend": "nccl" if cuda else "gloo",
        "report_name": name,
        "fault_plan": faults,
        "sigterm_after_step": sigterm_step,
        "train": train_args,
    }
    json_path = save_result(
        PROJECT,
        name,
        results,
        baseline={"reference_wall_s": ref.seconds},
        config=config,
        reports_dir=out_dir,
    )
    render(load_result(json_path), out_dir / PROJECT)
    write_summary(out_dir)
    verdict = "IDENTICAL" if identical else "DIFFERENT"
    if not results["all_faults_fired"]:
        verdict += " (but not every planned fault fired: see the report)"
    _log(f"{verdict}: wrote {json_path} and {name}.md / .png")
    if not cfg.keep and not cfg.workdir:
        shutil.rmtree(work, ignore_errors=True)
    elif cfg.keep:
        _log(f"runs kept under {work}")
    return results


def command(cfg: ChaosConfig) -> int:
    """`chaos`: both runs and the report; exit status 1 when the final states differ or a
    planned fault never fired (the demonstration did not cover it)."""
    with runner.jobs_end_with_this_process():
        results = run(cfg.validate())
    return 0 if results["identical"] and results["all_faults_fired"] else 1


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project03_capstone_infra.__main__ import main

    sys.exit(main(["chaos", *sys.argv[1:]]))
