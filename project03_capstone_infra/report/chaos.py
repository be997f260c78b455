"""The chaos demonstration's report, from its JSON record alone: the Markdown (verdict, fault
table, images) and the two charts (loss curves; progress against wall time with the faults).
The stem is the record's name (chaos, chaos_gpu, ...).
"""

from __future__ import annotations

from pathlib import Path

# What the summary and the report call each kind of fault.
FAULT_WORDS = {
    "kill": "kill -9",
    "nan": "NaN",
    "hang": "a hung rank",
    "truncate": "a truncated checkpoint",
    "flip": "a bit-flipped checkpoint",
    "sigterm": "a SIGTERM",
}


def coverage(fault_plan: list[dict], timeline: dict) -> dict:
    """Which planned faults fired, and which restarts of the faulted run no fault explains.

    From a record's plan (config.fault_plan) and timeline alone, so old records are read the same
    way. A restart is a step of the faulted run that does not exceed the one before it (a new
    launch, or a rollback in-process, resumed from an earlier step); each fault mark explains the
    first restart that follows it (a mark may be stamped just before the step it interrupts is
    logged by rank 0, so a mark explains a restart that comes after it, not one inside a window).
    A restart with no unused mark before it is unexplained: the run recovered from something the
    plan did not inject, and the fault the plan had for that attempt may never have fired."""
    marks = sorted(timeline.get("faults") or [], key=lambda m: m["t"])
    fired = {(m["kind"], m["step"]) for m in marks}
    not_fired = [
        {k: f.get(k) for k in ("kind", "step", "rank", "attempt")}
        for f in fault_plan
        if (f["kind"], f["step"]) not in fired
    ]
    # SIGTERM ends a launch after a save; the requeue continues from the next step: no restart.
    restart_marks = [m for m in marks if m["kind"] != "sigterm"]
    pts = timeline.get("faulted") or []
    unexplained, used = [], 0
    for (t_prev, s_prev), (t, s) in zip(pts, pts[1:]):
        if s > s_prev:
            continue
        if used < len(restart_marks) and restart_marks[used]["t"] <= t:
            used += 1
            continue
        unexplained.append(
            {"after_step": s_prev, "resumed_at_step": s, "t_last_step": t_prev, "t_resumed": t}
        )
    return {"faults_not_fired": not_fired, "unexplained_restarts": unexplained}


def render(record: dict, out_dir: Path) -> list[Path]:
    """Both charts and the Markdown of a chaos record, into `out_dir`."""
    from shared.results import atomic_write_text

    stem = record.get("name") or "chaos"
    paths = write_charts(record, out_dir)
    paths.append(atomic_write_text(out_dir / f"{stem}.md", render_markdown(record)))
    return paths


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
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "-",
                marker=".",
                ms=3,
                color=COLORS[i],
                label=name,
            )
            end = max(end, max(p[0] for p in pts))
    faults = sorted(tl.get("faults") or [], key=lambda f: f["t"])
    top = max([p[1] for k in ("reference", "faulted") for p in tl.get(k) or []] or [1])
    ax.set_ylim(0, top * 1.35)  # room above the curves for three rows of labels
    rows = _stagger([f["t"] for f in faults], min_gap=0.11 * end)
    for f, row in zip(faults, rows):
        ax.axvline(f["t"], color="#C44E52", ls=":", lw=1)
        ax.annotate(
            f"{f['kind']} @{f['step']}",
            (f["t"], 1 - 0.075 * row),
            xycoords=("data", "axes fraction"),
            xytext=(3, -2),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=8,
            color="#C44E52",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.9},
        )
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
    mode = ", deterministic mode" if c.get("deterministic") else ""
    return footer(env, f"{c['preset']}, {c['nproc']} ranks over {backend}{mode}, seed {c['seed']}")


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """<stem>_loss.png and (when the record carries it) <stem>_timeline.png from a chaos record
    (the stem is the record's name: chaos, chaos_gpu, ...)."""
    from shared.charts import line_chart

    stem = record.get("name") or "chaos"
    res, foot = record["results"], chaos_footer(record)
    ref = {int(k): v for k, v in res["loss_curve"]["reference"].items()}
    run = {int(k): v for k, v in res["loss_curve"]["faulted"].items()}
    same = "bitwise identical" if res["identical"] else "DIFFERENT"
    paths = [
        line_chart(
            out_dir / f"{stem}_loss.png",
            {
                "reference (no faults)": (sorted(ref), [ref[s] for s in sorted(ref)]),
                "under faults (final trajectory)": (sorted(run), [run[s] for s in sorted(run)]),
            },
            title=f"Loss: reference vs faulted run ({same})",
            xlabel="optimizer step",
            ylabel="training loss (nats)",
            y_from_zero=False,
            footnote=foot,
        )
    ]
    if res.get("timeline"):
        paths.append(timeline_chart(out_dir / f"{stem}_timeline.png", res["timeline"], foot))
    return paths


def render_markdown(record: dict) -> str:
    """The report's Markdown (fault table, verdict, images), from the chaos record alone."""
    from shared.results import environment_line, markdown_table

    c, r, env = record["config"], record["results"], record["environment"]
    stem = record.get("name") or "chaos"
    rows, diffs, curve = r["faults"], r["state_differences"], r["loss_curve"]["faulted"]
    identical = r["identical"]
    backend = (
        "NCCL" if (c.get("backend") or ("nccl" if env.get("gpu") else "gloo")) == "nccl" else "gloo"
    )
    mode = (
        "deterministic mode (`--deterministic`: shared.determinism)"
        if c.get("deterministic")
        else "default kernels (not `--deterministic`)"
    )
    table = markdown_table(
        rows,
        [
            "fault",
            "rank",
            "at_step",
            "resumed_from",
            "steps_lost",
            "detected_s",
            "to_first_new_step_s",
            "to_caught_up_s",
            "recovery",
        ],
        headers=[
            "fault",
            "rank",
            "steps done",
            "resumed from",
            "steps lost",
            "detected (s)",
            "to first new step (s)",
            "to caught up (s)",
            "recovery",
        ],
        floatfmt=".2f",
    )
    skipped = [
        f"- {f['fault']}: {f['detail']}; loader: {f['skipped']}" for f in rows if f.get("skipped")
    ]
    cov = coverage(c.get("fault_plan") or [], r.get("timeline") or {})
    gaps = [
        f"- **Planned but never fired:** {f['kind']} @ step {f['step']} (rank {f['rank']}, "
        f"launch attempt {f['attempt']}): that attempt ended before the step, so the run did not "
        f"go through this fault."
        for f in cov["faults_not_fired"]
    ] + [
        f"- **A restart no planned fault explains:** after step {u['after_step']} "
        f"({u['t_last_step']:.1f} s) the run went back and continued with step "
        f"{u['resumed_at_step']} ({u['t_resumed']:.1f} s)."
        + (
            " The end of torchrun's output is in the record (`torchrun_output_tail`)."
            if r.get("torchrun_output_tail")
            else " This record holds no torchrun output to say why."
        )
        for u in cov["unexplained_restarts"]
    ]
    if gaps:
        gaps = ["Coverage: not every planned fault was exercised.", "", *gaps, ""]
    final, ref_final = r.get("final_loss"), r.get("reference_final_loss")
    losses = (
        f"final loss {final:.6f} (reference {ref_final:.6f})"
        if final is not None and ref_final is not None
        else "no final loss"
    )
    return "\n".join(
        [
            "# Chaos run: the same training run, with and without injected faults",
            "",
            f"{c['preset']} model, {c['steps']} steps, global batch {c['global_batch']}, checkpoint every "
            f"{c['ckpt_every']} steps (async), {c['nproc']} ranks over {backend} "
            f"under `torchrun --max-restarts {len(c.get('fault_plan') or [])}`, then one requeue after the "
            f"preemption; {mode}. Fault steps drawn with seed {c['seed']}.",
            "",
            f"**Result: {'bitwise identical' if identical else 'NOT identical'}** — final model and optimizer "
            f"state ({r['tensors_compared']} tensors) {'equal bit for bit' if not diffs else 'differ'}; loss curves "
            f"{'equal' if r['loss_curves_equal'] else 'differ'} at all {len(curve)} steps; {losses}.",
            "",
            f"Wall time: reference {r['reference_wall_s']:.1f} s, faulted {r['faulted_wall_s']:.1f} s "
            f"({r['process_launches']} worker-group launches, {r['steps_lost_total']} steps recomputed).",
            "",
            table,
            "",
            *gaps,
            "Times are seconds from the fault to the first step completed after recovery and to the",
            "step the run had reached when the fault hit (they include each launch's start-up: Python",
            "and torch imports, process group, model build, checkpoint load). Corrupted checkpoints",
            "detected:",
            "",
            *skipped,
            "",
            f"![loss curves]({stem}_loss.png)",
            "",
            f"![progress]({stem}_timeline.png)",
            "",
            f"Measured: {environment_line(env)}.",
            "",
        ]
    )
