"""The Ray Tune experiment's report, from its JSON record alone: `<name>_curves.png` (every ASHA
trial's loss curve, its stop marked), `<name>_random_curves.png` (random search),
`<name>_compute.png` (trial-steps each search used) and `<name>.md`. `<name>` is the record's
`out_name` (default `tune`)."""

from __future__ import annotations

from pathlib import Path


def render(record: dict, out_dir: Path) -> list[Path]:
    """Every chart and the Markdown of a tune record, into `out_dir`."""
    from shared.results import atomic_write_text

    paths = write_charts(record, out_dir)
    name = record["config"].get("out_name") or record.get("name", "tune")
    paths.append(atomic_write_text(out_dir / f"{name}.md", render_markdown(record)))
    return paths


def write_charts(record: dict, out: Path) -> list[Path]:
    """tune_curves.png, tune_random_curves.png and tune_compute.png from a tune record."""
    from shared.charts import bar_chart, footer, line_chart

    results, c = record["results"], record["config"]
    name = c.get("out_name") or record.get("name", "tune")
    foot = footer(record["environment"], f"{c['preset']} preset, {c['num_samples']} trials")
    paths = []

    def curves(records: list[dict]) -> dict:
        series = {}
        for r in records:
            xs = [int(s) for s in r["curve"]]
            tag = {
                "completed": "",
                "stopped": f" stopped@{r['stopped_at_step']}",
                "error": " error",
            }[r["status"]]
            series[f"lr {r['lr']:.1e} wd {r['weight_decay']:.2f}{tag}"] = (
                xs,
                list(r["curve"].values()),
            )
        return series

    paths.append(
        line_chart(
            out / f"{name}_curves.png",
            curves(results["trials"]),
            title=f"ASHA: training loss of every trial (grace {c['grace_steps']}, rf {c['reduction_factor']})",
            xlabel="optimiser step",
            ylabel="training loss (nats)",
            y_from_zero=False,
            footnote=foot,
        )
    )
    comp = results.get("comparison")
    if results.get("random_trials"):
        paths.append(
            line_chart(
                out / f"{name}_random_curves.png",
                curves(results["random_trials"]),
                title="Random search (no early stopping): the same configurations",
                xlabel="optimiser step",
                ylabel="training loss (nats)",
                y_from_zero=False,
                footnote=foot,
            )
        )
    if comp:
        labels = ["ASHA", "random search"]
        values = [comp["asha_trial_steps"], comp["random_trial_steps"]]
        for q in (50, 90):
            if comp.get(f"random_steps_for_p{q}_match"):
                labels.append(f"random: {q}% chance\nto match ASHA")
                values.append(comp[f"random_steps_for_p{q}_match"])
        paths.append(
            bar_chart(
                out / f"{name}_compute.png",
                labels,
                values,
                title="Compute to search (trial-steps; lower is better)",
                ylabel="optimiser steps over all trials",
                footnote=foot,
            )
        )
    return paths


def render_markdown(record: dict) -> str:
    """<name>.md: the setting, the best configuration, ASHA against random search, the trials."""
    from shared.results import environment_line, markdown_table

    cfg, results, env = record["config"], record["results"], record["environment"]
    best = results["best"]
    lines = [
        f"# Ray Tune HPO: ASHA over lr, weight decay, warm-up ({cfg['preset']} preset)",
        "",
        f"Measured with: {environment_line(env)}, Ray {results['ray_version']}. "
        f"{cfg['num_samples']} trials of up to {cfg['max_steps']} steps (global batch "
        f"{cfg['global_batch']}); ASHA grace {cfg['grace_steps']} steps, reduction factor "
        f"{cfg['reduction_factor']}; search seed {cfg['search_seed']}. Wall time "
        f"{results['wall_s']:.0f} s (ASHA) and {results.get('random_wall_s') or 0:.0f} s (random).",
        "",
        f"Per trial (median): {results['median_first_report_s'] or 0:.1f} s from start to its "
        f"first report (actor start, imports, model build, first step), then "
        f"{results['median_step_s'] or 0:.3f} s per step: at this size start-up dominates, so "
        "ASHA's saving in trial-steps shows only partly in wall time.",
        "",
        f"**Best configuration**: lr {best['lr']:.3g}, weight decay {best['weight_decay']:.3g}, "
        f"warm-up fraction {best['warmup_frac']:.3g}: loss {best['final_loss']:.4f} at step "
        f"{best['last_step']}.",
        "",
    ]
    comp = results.get("comparison")
    if comp:
        lines += [
            "## ASHA against random search at the same compute",
            f"- ASHA used {comp['asha_trial_steps']} trial-steps, random search (every trial to the "
            f"end) {comp['random_trial_steps']}: **{comp['compute_saved_pct']:.0f}% less compute**.",
            f"- Best loss: ASHA {comp['asha_best_loss']:.4f}, random search {comp['random_best_loss']:.4f}.",
        ]
        if comp.get("random_trials_at_asha_budget"):
            lines.append(
                f"- With ASHA's budget, random search affords {comp['random_trials_at_asha_budget']} "
                f"full trials; their expected best loss is {comp['random_expected_best_at_asha_budget']:.4f} "
                "(mean over every subset of that size of the measured random-search trials)."
            )
        if comp.get("random_p_match_at_asha_budget") is not None:
            lines.append(
                f"- The chance that those {comp['random_trials_at_asha_budget']} trials include a "
                f"configuration as good as ASHA's best is {comp['random_p_match_at_asha_budget']:.0%}; "
                f"a 50% chance needs {comp['random_steps_for_p50_match']} trial-steps, a 90% "
                f"chance {comp['random_steps_for_p90_match']} (ASHA: {comp['asha_trial_steps']}, "
                "found with certainty among the same configurations)."
            )
        lines.append(
            "- ASHA is asynchronous: a trial is judged against the trials that reached its rung "
            "before it, so which trials it stops, and the compute it saves, varies with trial "
            "order and machine load from one run to the next."
        )
        if comp.get("same_config_max_loss_diff") is not None:
            lines.append(
                f"- The same configuration gives the same loss at the same step in both "
                f"experiments (max difference {comp['same_config_max_loss_diff']:.2e} over "
                f"{comp['configs_matched']} shared configurations): the comparison is like for like."
            )
        lines.append("")
    cols = [
        "lr",
        "weight_decay",
        "warmup_frac",
        "status",
        "stopped_at_step",
        "last_step",
        "final_loss",
        "attempts",
    ]
    lines += ["## Trials (ASHA)", "", markdown_table(results["trials"], cols), ""]
    lines.append("Charts: `tune_curves.png` (ASHA), `tune_random_curves.png`, `tune_compute.png`.")
    return "\n".join(lines) + "\n"
