"""The demonstration: a reference run, then the same run under injected faults, compared.

    python -m project03_capstone_infra.chaos            # CPU: 2 gloo ranks, tiny model, ~1-2 min
    python -m project03_capstone_infra.chaos --nproc 4 --preset 125m --steps 200   # on GPUs

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
and chaos_timeline.png (training progress against wall time, faults marked).
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from shared.cli import main_guard, parse_dataclass
from shared.progress import progress

from . import runner
from .checkpoint import compare_states, read_full_state
from .faults import read_events

PROJECT = "project03_capstone_infra"


@dataclass
class ChaosConfig:
    """Reference run vs the same run under kill -9, NaN, hang, corrupt checkpoints, SIGTERM."""

    nproc: int = 0  # ranks; 0: the GPU count on a GPU machine, else 2 (gloo)
    preset: str = "tiny"
    steps: int = 60
    global_batch: int = 8
    ckpt_every: int = 5
    seed: int = 0  # draws the fault steps and ranks
    pg_timeout_s: float = 5.0  # how long the hung rank's peers wait
    workdir: str = ""  # where the runs go (default: a temporary directory, removed after)
    keep: bool = False  # keep the run directories
    reports_dir: str = ""  # default: reports/ of this repository
    timeout_s: float = 900.0  # per launch

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
        require_finite("ChaosConfig", self, ("pg_timeout_s", "timeout_s"))
        for name in ("pg_timeout_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ChaosConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.steps < 10 * self.ckpt_every:
            raise ValueError(f"ChaosConfig.steps ({self.steps}) must be at least 10 x ckpt_every "
                             f"({self.ckpt_every}) to fit the faults")  # fmt: skip
        if self.workdir:
            writable_dir("--workdir", self.workdir)
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        return self


def _log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
        hits.append({"t": sigterm_sent_t, "kind": "sigterm", "step": pre["step"] + 1, "rank": "all",
                     "detail": f"saved step {pre['step']} in {pre['save_s']:.2f} s, exit 75"})  # fmt: skip
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
        timeout = _first(events, f["t"], lambda e: e["event"] == "collective_failure")
        rows.append({
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
        })  # fmt: skip
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


def _stagger(xs: list[float], min_gap: float, rows: int = 3) -> list[int]:
    """A row for each label at x (sorted) so that labels closer than min_gap never share a row."""
    last = [-float("inf")] * rows
    out = []
    for x in xs:
        row = next(
            (r for r in range(rows) if x - last[r] >= min_gap),
            min(range(rows), key=last.__getitem__),
        )
        last[row] = x
        out.append(row)
    return out


def timeline_chart(path: Path, tl: dict, footnote: str) -> Path:
    """Step reached against wall time for both runs, each fault a dotted line with its label
    written horizontally in staggered rows at the top (labels of close faults never overlap)."""
    from shared.charts import COLORS, _finish, plt, save_figure

    fig, ax = plt.subplots(figsize=(9, 4.6))
    end = 1.0
    for i, (name, key) in enumerate((("reference", "reference"), ("under faults", "faulted"))):
        pts = tl.get(key) or []
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker=".", ms=3,
                    color=COLORS[i], label=name)  # fmt: skip
            end = max(end, max(p[0] for p in pts))
    faults = sorted(tl.get("faults") or [], key=lambda f: f["t"])
    top = max([p[1] for k in ("reference", "faulted") for p in tl.get(k) or []] or [1])
    ax.set_ylim(0, top * 1.35)  # room above the curves for three rows of labels
    rows = _stagger([f["t"] for f in faults], min_gap=0.11 * end)
    for f, row in zip(faults, rows):
        ax.axvline(f["t"], color="#C44E52", ls=":", lw=1)
        ax.annotate(f"{f['kind']} @{f['step']}", (f["t"], 1 - 0.075 * row),
                    xycoords=("data", "axes fraction"), xytext=(3, -2),
                    textcoords="offset points", ha="left", va="top", fontsize=8,
                    color="#C44E52", bbox={"boxstyle": "round,pad=0.15", "fc": "white",
                                           "ec": "none", "alpha": 0.9})  # fmt: skip
    ax.set_xlim(0, end * 1.03)
    ax.set_xlabel("wall time since launch, s")
    ax.set_ylabel("optimizer step reached")
    ax.set_title("Training progress: reference vs under injected faults (fault @ step it hit)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(_finish(fig, footnote), path)


def chaos_footer(record: dict) -> str:
    from shared.charts import footer

    c, env = record["config"], record["environment"]
    backend = "NCCL" if env.get("gpu") else "gloo"
    return footer(env, f"{c['preset']}, {c['nproc']} ranks over {backend}, seed {c['seed']}")


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """chaos_loss.png and (when the record carries it) chaos_timeline.png from a chaos record."""
    from shared.charts import line_chart

    res, foot = record["results"], chaos_footer(record)
    ref = {int(k): v for k, v in res["loss_curve"]["reference"].items()}
    run = {int(k): v for k, v in res["loss_curve"]["faulted"].items()}
    same = "bitwise identical" if res["identical"] else "DIFFERENT"
    paths = [line_chart(
        out_dir / "chaos_loss.png",
        {"reference (no faults)": (sorted(ref), [ref[s] for s in sorted(ref)]),
         "under faults (final trajectory)": (sorted(run), [run[s] for s in sorted(run)])},
        title=f"Loss: reference vs faulted run ({same})",
        xlabel="optimizer step", ylabel="training loss (nats)", y_from_zero=False, footnote=foot,
    )]  # fmt: skip
    if res.get("timeline"):
        paths.append(timeline_chart(out_dir / "chaos_timeline.png", res["timeline"], foot))
    return paths


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
    parts.append(f"next: {nxt['kind']} @ step {nxt['step']}" if nxt else
                 f"next: SIGTERM after step {sigterm_step}")  # fmt: skip
    return "; ".join(parts)


def _follow(proc, run_dir: Path, bar, timeout: float, *, until_step: int | None = None,
            status=None) -> None:  # fmt: skip
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
    from shared.results import (
        REPORTS_DIR,
        atomic_write_text,
        environment,
        environment_line,
        load_result,
        markdown_table,
        save_result,
    )

    cfg.validate()
    nproc = cfg.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    faults, sigterm_step = plan_faults(cfg, nproc)
    out_dir = Path(cfg.reports_dir) if cfg.reports_dir else REPORTS_DIR
    writable_dir("--reports-dir", out_dir / PROJECT)  # before two training runs, not after
    work = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="p03-chaos-"))
    ref_dir, run_dir = work / "reference", work / "faulted"
    for d in (ref_dir, run_dir):
        if d.exists():
            shutil.rmtree(d)
    train_args = dict(preset=cfg.preset, steps=cfg.steps, global_batch=cfg.global_batch,
                      ckpt_every=cfg.ckpt_every, keep_last=3, log_every=cfg.steps,
                      pg_timeout_s=cfg.pg_timeout_s, sigterm_deadline_s=max(5.0, cfg.pg_timeout_s))  # fmt: skip

    _log(
        f"reference run: {nproc} ranks, {cfg.preset}, {cfg.steps} steps, checkpoint every {cfg.ckpt_every}"
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
        _follow(proc, run_dir, bar, cfg.timeout_s, until_step=sigterm_step,
                status=lambda ev: _fault_status(ev, faults, sigterm_step))  # fmt: skip
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

    results = {
        "identical": identical,
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
    config = {
        **asdict(cfg),
        "nproc": nproc,
        "fault_plan": faults,
        "sigterm_after_step": sigterm_step,
        "train": train_args,
    }
    env = environment()
    json_path = save_result(PROJECT, "chaos", results, baseline={"reference_wall_s": ref.seconds},
                            config=config, reports_dir=out_dir, env=env)  # fmt: skip
    write_charts(load_result(json_path), out_dir / PROJECT)

    table = markdown_table(
        rows,
        ["fault", "rank", "at_step", "resumed_from", "steps_lost", "detected_s", "to_first_new_step_s", "to_caught_up_s", "recovery"],
        headers=["fault", "rank", "steps done", "resumed from", "steps lost", "detected (s)", "to first new step (s)", "to caught up (s)", "recovery"],
        floatfmt=".2f",
    )  # fmt: skip
    skipped = [
        f"- {r['fault']}: {r['detail']}; loader: {r['skipped']}" for r in rows if r.get("skipped")
    ]
    md = "\n".join([
        "# Chaos run: the same training run, with and without injected faults",
        "",
        f"{cfg.preset} model, {cfg.steps} steps, global batch {cfg.global_batch}, checkpoint every "
        f"{cfg.ckpt_every} steps (async), {nproc} ranks under `torchrun --max-restarts {len(faults)}`, "
        f"then one requeue after the preemption. Fault steps drawn with seed {cfg.seed}.",
        "",
        f"**Result: {'bitwise identical' if identical else 'NOT identical'}** — final model and optimizer "
        f"state ({n_tensors} tensors) {'equal bit for bit' if not diffs else 'differ'}; loss curves "
        f"{'equal' if ref_curve == curve else 'differ'} at all {len(curve)} steps; final loss "
        f"{results['final_loss']:.6f} (reference {results['reference_final_loss']:.6f}).",
        "",
        f"Wall time: reference {ref.seconds:.1f} s, faulted {faulted_s:.1f} s "
        f"({attempts} worker-group launches, {results['steps_lost_total']} steps recomputed).",
        "",
        table,
        "",
        "Times are seconds from the fault to the first step completed after recovery and to the",
        "step the run had reached when the fault hit (they include process start-up, ~3-5 s of",
        "Python and torch imports per launch on this machine). Corrupted checkpoints detected:",
        "",
        *skipped,
        "",
        "![loss curves](chaos_loss.png)",
        "",
        "![progress](chaos_timeline.png)",
        "",
        f"Measured: {environment_line(env)}.",
        "",
    ])  # fmt: skip
    atomic_write_text(out_dir / PROJECT / "chaos.md", md)
    from .report import write_summary

    write_summary(out_dir)
    _log(f"{'IDENTICAL' if identical else 'DIFFERENT'}: wrote {json_path} and chaos.md / .png")
    if not cfg.keep and not cfg.workdir:
        shutil.rmtree(work, ignore_errors=True)
    elif cfg.keep:
        _log(f"runs kept under {work}")
    return results


@main_guard
def main(argv: list[str] | None = None) -> int:
    cfg = parse_dataclass(ChaosConfig, argv, description=__doc__.split("\n\n")[0]).validate()
    results = run(cfg)
    return 0 if results["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
