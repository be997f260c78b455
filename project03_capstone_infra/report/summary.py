"""reports/project03_capstone_infra/summary.md: the project's results in one place, links
relative to that folder, from whatever result files exist (chaos, chaos_gpu, checkpoint_bench,
reshard, determinism_cost, and a link to every other report); each part names its own context. Written by the chaos run, the resharding demo, the
determinism cost run, the checkpoint benchmark, `report` and `make publish`."""

from __future__ import annotations

import json
from pathlib import Path

from project03_capstone_infra import PROJECT
from project03_capstone_infra.report.chaos import FAULT_WORDS, coverage
from project03_capstone_infra.report.checkpoint_bench import text as figure_text


def _chaos_summary(d: Path, stem: str) -> list[str]:
    from shared.results import environment_line, markdown_table

    path = d / f"{stem}.json"
    if not path.exists():
        return []
    rec = json.loads(path.read_text())
    r, c = rec["results"], rec["config"]
    verdict = "bitwise identical" if r["identical"] else "NOT identical"
    mode = ", deterministic mode" if c.get("deterministic") else ""
    rows = [
        {
            "fault": f["fault"],
            "steps lost": f.get("steps_lost"),
            "to first new step (s)": f.get("to_first_new_step_s"),
        }
        for f in r["faults"]
    ]
    # The faults the run went through, from its own rows (not the plan: one may not have fired).
    words = [FAULT_WORDS.get(f["fault"], f["fault"]) for f in r["faults"]]
    went = ", ".join(words[:-1]) + f" and {words[-1]}" if len(words) > 1 else "".join(words)
    cov = coverage(c.get("fault_plan") or [], r.get("timeline") or {})
    missed = "; ".join(
        f"{FAULT_WORDS.get(f['kind'], f['kind'])} (step {f['step']})"
        for f in cov["faults_not_fired"]
    )
    missed = f" Planned but never fired: {missed} (see the report)." if missed else ""
    return [
        f"**Chaos run** ({c['preset']}, {c['nproc']} ranks{mode}, {c['steps']} steps, "
        f"{environment_line(rec['environment'])}): after {went}, the final model and optimizer "
        f"state is **{verdict}** to the uninterrupted run ({r['tensors_compared']} tensors), loss "
        f"curves {'equal' if r['loss_curves_equal'] else 'differ'}.{missed} "
        f"[Details]({stem}.md)",
        "",
        markdown_table(rows, floatfmt=".1f"),
        "",
    ]


def _fewer(cost: float) -> str:
    return f"{100 * cost:.1f}% fewer" if cost >= 0 else f"{-100 * cost:.1f}% more"


def _determinism_summary(d: Path) -> list[str]:
    """One line each for the resharding demo and the cost of deterministic mode."""
    from shared.results import environment_line

    parts = []
    path = d / "reshard.json"
    if path.exists():
        rec = json.loads(path.read_text())
        r = rec["results"]
        dirs = "; ".join(
            f"{x['from_world']} -> {x['to_world']}: first loss after the change off by "
            f"{x['first_after']['rel_diff']:.1e} relative (tolerance {x['first_after']['tolerance']:.2g})"
            for x in r["directions"]
            if x["first_after"]["rel_diff"] is not None
        )
        before = "bitwise equal" if r["bitwise_before_switch"] else "NOT bitwise equal"
        parts += [
            f"**Resharding** ({rec['config']['preset']}, {r['dtype']}, {r['backend']}"
            f"{', deterministic mode' if r.get('deterministic') else ''}, "
            f"{environment_line(rec['environment'])}): steps 1-{r['switch_after']} and the state "
            f"at the change {before} to the uninterrupted run; {dirs}. "
            "[Chart](reshard.png)",
            "",
        ]
    path = d / "determinism_cost.json"
    if path.exists():
        rec = json.loads(path.read_text())
        r, m = rec["results"], rec["results"]["modes"]
        rep = {k: v.get("repeats_bitwise_equal") for k, v in m.items()}
        rep_txt = "; ".join(
            f"{k} runs {'repeat bit for bit' if v else 'differ run to run'}"
            for k, v in rep.items()
            if v is not None
        )
        parts += [
            f"**Deterministic mode's cost** ({rec['config']['preset']}, {r['nproc']} ranks, "
            f"{r['dtype']}, {environment_line(rec['environment'])}): "
            f"{m['deterministic']['tokens_per_s']:,.0f} tokens/s vs {m['default']['tokens_per_s']:,.0f} "
            f"by default ({_fewer(r['throughput_cost'])}){'; ' + rep_txt if rep_txt else ''}.",
            "",
        ]
    return parts


def write_summary(reports_dir: str | Path | None = None) -> Path:
    from shared.results import REPORTS_DIR, atomic_write_text

    root = Path(reports_dir) if reports_dir else REPORTS_DIR
    d = root / PROJECT
    parts = []
    for stem in ("chaos", "chaos_gpu"):
        parts += _chaos_summary(d, stem)
    bench = d / "checkpoint_bench.json"
    if bench.exists():
        rec = json.loads(bench.read_text())
        res, der = rec["results"], rec["results"]["derived"]
        line = [
            f"**Checkpoints, {rec['config']['preset']} on {rec['environment'].get('gpu') or 'CPU'}** "
            f"({res['sync']['bytes'] / 2**30:.1f} GiB, one every {der['ckpt_interval_steps']} steps): "
            f"sync save holds training {figure_text(der['sync'], 'held_s', '.1f')} s ({100 * der['sync']['fraction']:.1f}% of the time)"
        ]
        for k, label in (
            ("async_cold", "first async save of a process"),
            ("async_warm", "steady-state async save"),
        ):
            if k in der:
                line.append(
                    f"{label} {figure_text(der[k], 'held_s', '.2f')} s ({100 * der[k]['fraction']:.2f}%)"
                )
        resume = res.get("resume") or {}
        if resume.get("to_first_new_step_s") is not None:
            line.append(
                f"resume to the first new step {resume['to_first_new_step_s']:.1f} s after launch"
            )
        reps = max(len(der["sync"].get("held_s_reps") or ()), 1)
        tail = (
            f"; sync and steady state: median (min–max) of {reps} repetitions" if reps > 1 else ""
        )
        parts += [
            "; ".join(line) + f"{tail}. [Details](checkpoint_bench.md)",
            "",
        ]
    parts += _determinism_summary(d)
    others = [
        f"[{p.stem}]({p.name})"
        for p in sorted(d.glob("*.md"))
        if p.stem not in ("summary", "chaos", "chaos_gpu", "checkpoint_bench")
    ]
    if others:
        parts.append("Also: " + ", ".join(others) + ".")
    text = "\n".join(parts).strip() or "_No project03 results yet._"
    out = d / "summary.md"
    atomic_write_text(out, text + "\n")
    return out
