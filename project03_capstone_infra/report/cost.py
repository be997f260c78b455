"""The cost model's report, from its JSON record alone: `<name>.png` (expected and P90 cost
of every plan), `<name>_interval.png` (expected cost against the checkpoint interval, Young/Daly
and the numerical optimum marked) and `<name>.md` (the plans, the inputs and their sources).
`<name>` is the record's `out_name` (default `cost`)."""

from __future__ import annotations

from pathlib import Path

from ..cost.model import MC_TOLERANCE


def render(record: dict, out_dir: Path) -> list[Path]:
    """Every chart and the Markdown of a cost record, into `out_dir`."""
    from shared.results import atomic_write_text

    paths = write_charts(record, out_dir)
    paths.append(atomic_write_text(out_dir / f"{_name(record)}.md", render_markdown(record)))
    return paths


def _name(record: dict) -> str:
    return (record.get("config") or {}).get("out_name") or record.get("name", "cost")


def _fmt_h(h: float) -> str:
    return f"{h:.2f} h" if h < 100 else f"{h:,.0f} h"


def _sources(results: dict) -> list[str]:
    """The result records the plan's inputs were read from (measured throughput, bf16/fp32
    ratio, checkpoint save and restart times), in order, each once."""
    import re

    found = []
    for key in ("bf16_tokens_per_s_per_gpu", "bf16_speedup", "save_source", "restart_source"):
        found += re.findall(r"reports/[\w./-]+\.json", (results.get(key) or {}).get("source", ""))
    for s in (results.get("precision_speedups_vs_bf16") or {}).values():
        found += re.findall(r"reports/[\w./-]+\.json", s["source"])
    return list(dict.fromkeys(found))


def _precisions(rows: list[dict]) -> list[str]:
    """The precisions the plans price, in the order of the rows (fp32, bf16, then measured
    ones)."""
    return list(dict.fromkeys(r["precision"] for r in rows))


def chart_footer(record: dict, context: str | None = None) -> str:
    """What the cost figures are about: a projection for the planned GPUs from the records it
    read, never the machine that ran the model."""
    from shared.charts import projection_footer

    res = record["results"]
    if context is None:
        mc = (record.get("config") or {}).get("mc_runs")
        context = "model + Monte Carlo" + (f" ({mc:,} runs)" if mc else "")
    return projection_footer(
        f"{res['n_gpus']}x {res['gpu']}, {res['total_tokens']:.3g} tokens",
        _sources(res) or ["datasheet peaks and assumed MFU"],
        context=context,
        date=(record.get("environment") or {}).get("date"),
    )


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """<name>.png (cost per plan) and <name>_interval.png (Young/Daly) from a cost record."""
    from shared.charts import grouped_bar_chart, line_chart

    results = record["results"]
    name = _name(record)
    rows = results["plans"]
    baseline = next(r for r in rows if r["market"] == "on-demand" and r["precision"] == "bf16")
    groups = list(dict.fromkeys(r["plan"] for r in rows))
    series = {
        f"{p} {what}": [
            next(r[key] for r in rows if r["plan"] == g and r["precision"] == p) for g in groups
        ]
        for what, key in (("expected", "expected_usd"), ("P90", "p90_usd"))
        for p in _precisions(rows)
    }
    foot = chart_footer(record)
    paths = [
        grouped_bar_chart(
            out_dir / f"{name}.png",
            groups,
            series,
            title=f"Training job cost: on-demand vs spot, {' vs '.join(_precisions(rows))} "
            f"({results['gpu']})",
            ylabel="USD per job",
            baseline=baseline["expected_usd"],
            baseline_label="on-demand bf16 (expected)",
            footnote=foot,
        )
    ]
    sweep = results["interval_sweep_spot_bf16"]
    paths.append(
        line_chart(
            out_dir / f"{name}_interval.png",
            {
                "expected cost (model)": (sweep["interval_h"], sweep["expected_usd"]),
                "Young/Daly sqrt(2CM)": ([sweep["young_daly_h"]], [sweep["young_daly_usd"]]),
                "numerical optimum": ([sweep["optimal_h"]], [sweep["optimal_usd"]]),
            },
            title="Spot bf16: expected cost vs checkpoint interval",
            xlabel="checkpoint interval (hours of work, log)",
            ylabel="expected USD per job",
            logx=True,
            y_from_zero=False,  # the curve's minimum is the point: not from 0
            footnote=chart_footer(
                record,
                f"analytic model; save {results['save_s']:.3g} s, "
                f"restart {results['restart_s']:.3g} s",
            ),
        )
    )
    return paths


def _spot_by_precision(results: dict) -> list[str]:
    """Market x precision as one table: the expected cost of each plan in each precision, and
    the saving of the cheapest cell against on-demand bf16. Records written before fp16/fp8
    were priced (no `precision_speedups_vs_bf16`) render without it, as they did."""
    from shared.results import markdown_table

    if "precision_speedups_vs_bf16" not in results:
        return []
    rows = results["plans"]
    base = next(r for r in rows if r["market"] == "on-demand" and r["precision"] == "bf16")
    table = [
        {
            "plan": plan,
            **{
                f"{p} E[cost] USD": next(
                    r["expected_usd"] for r in rows if r["plan"] == plan and r["precision"] == p
                )
                for p in _precisions(rows)
            },
        }
        for plan in dict.fromkeys(r["plan"] for r in rows)
    ]
    missing = [p for p in ("fp16", "fp8-tensorwise", "fp8-rowwise") if p not in _precisions(rows)]
    return [
        "## Market x precision",
        "",
        markdown_table(table, floatfmt=",.0f"),
        "",
        f"Against on-demand bf16 (${base['expected_usd']:,.0f}). Each precision's throughput is "
        "bf16's times the ratio measured in one run (inputs below)"
        + (
            f"; not priced, because no record here measured them: {', '.join(missing)}."
            if missing
            else "."
        ),
        "",
    ]


def render_markdown(record: dict) -> str:
    """<name>.md: the plans, the checkpoint interval and save-time tables, every input's source."""
    from shared.results import environment_line, markdown_table

    cfg, results, env = record["config"], record["results"], record["environment"]
    rows = results["plans"]
    c = results["cheapest"]
    tput, ratio = results["bf16_tokens_per_s_per_gpu"], results["bf16_speedup"]
    sweep = results["interval_sweep_spot_bf16"]
    cols = [
        "plan",
        "precision",
        "usd_per_gpu_hour",
        "interval_h",
        "work_h",
        "expected_h",
        "overhead_pct",
        "expected_usd",
        "p50_h",
        "p90_h",
        "p99_h",
        "p90_usd",
        "mc_vs_analytic_pct",
    ]
    heads = [
        "plan",
        "precision",
        "USD/GPU-h",
        "ckpt every (h)",
        "work (h)",
        "E[wall] (h)",
        "overhead %",
        "E[cost] USD",
        "P50 (h)",
        "P90 (h)",
        "P99 (h)",
        "P90 cost USD",
        "MC vs model %",
    ]
    if cfg["deadline_h"] > 0:
        cols.append("p_miss_deadline")
        heads.append(f"P(> {cfg['deadline_h']:g} h)")
    risk = (
        f"P90 completion {_fmt_h(c['p90_h'])} against an expectation of "
        f"{_fmt_h(c['expected_h'])} (P99 {_fmt_h(c['p99_h'])}); P90 cost "
        f"${c['p90_usd']:,.0f}"
    )
    lines = [
        f"# Cost of a training job: {results['n_gpus']}x {results['gpu']}, "
        f"{results['total_tokens']:.3g} tokens of the `{cfg['preset']}` preset",
        "",
        f"Measured/produced with: {environment_line(env)}. Regenerate with "
        "`python -m project03_capstone_infra.cost`.",
        "",
        f"**Cheapest plan: {c['plan']}, {c['precision']}**: expected ${c['expected_usd']:,.0f} "
        f"and {_fmt_h(c['expected_h'])}, {results['savings_vs_on_demand_bf16_pct']:.0f}% below "
        f"on-demand bf16 (${next(r for r in rows if r['market'] == 'on-demand' and r['precision'] == 'bf16')['expected_usd']:,.0f}). "
        f"Risk: {risk}.",
        "",
        markdown_table(rows, cols, headers=heads),
        "",
        "`E[...]` is the analytic model; P50/P90/P99 come from the Monte Carlo "
        f"({cfg['mc_runs']:,} simulated jobs); `MC vs model` is the Monte Carlo mean against the "
        f"model (agreement required within {100 * MC_TOLERANCE:g}% for exponential arrivals).",
        "",
        *_spot_by_precision(results),
        "## Checkpoint interval (spot, bf16)",
        f"Young/Daly sqrt(2CM) = {sweep['young_daly_h'] * 60:.1f} min of work per save "
        f"(expected ${sweep['young_daly_usd']:,.2f}); the best interval a numerical search of "
        f"the model finds is {sweep['optimal_h'] * 60:.1f} min (${sweep['optimal_usd']:,.2f}). "
        f"Every {sweep['interval_h'][0] * 60:.1f} min or every {sweep['interval_h'][-1] * 60:.0f} "
        f"min instead: ${sweep['expected_usd'][0]:,.2f} or ${sweep['expected_usd'][-1]:,.2f}. "
        "Chart: `cost_interval.png`.",
        "",
        "## Checkpoint save time (spot, bf16, Young/Daly interval for each)",
        "",
        markdown_table(
            results["save_cost_sensitivity_spot_bf16"],
            ["save_s", "interval_h", "expected_h", "overhead_pct", "expected_usd"],
            headers=[
                "save blocks (s)",
                "ckpt every (h)",
                "E[wall] (h)",
                "overhead %",
                "E[cost] USD",
            ],
        ),
        "",
        "## Inputs and where they come from",
        f"- Prices: on-demand ${results['prices']['on_demand']['value']}/GPU-h "
        f"({results['prices']['on_demand']['source']}, {results['prices']['on_demand']['date']}); "
        f"spot ${results['prices']['spot']['value']}/GPU-h ({results['prices']['spot']['source']}).",
        f"- bf16 throughput: {tput['value']:,.0f} tokens/s per GPU: {tput['source']}.",
        f"- bf16 / fp32 speed ratio: {ratio['value']:.2f}: {ratio['source']}.",
        *(
            f"- {p} / bf16 speed ratio: {s['value']:.2f}: {s['source']}."
            for p, s in (results.get("precision_speedups_vs_bf16") or {}).items()
        ),
        f"- Spot interruptions: {results['interruptions']['spot_source']}, per node, "
        f"{results['n_nodes']} node(s); GPU failures: {cfg['gpu_failures_per_gpu_hour']:.3g} per "
        f"GPU-hour ({results['interruptions']['gpu_failure_source']}).",
        f"- Checkpoint save holds training {results['save_s']:.3g} s: "
        f"{results['save_source']['source']}.",
        f"- An interruption costs {results['restart_s']:.3g} s before training runs again: "
        f"{results['restart_source']['source']}.",
        "- Both are measured by `python -m project03_capstone_infra.bench_checkpoint` (GPU); "
        "--save-s / --restart-s override them.",
        "- Billing: the whole allocation is paid for all wall time, lost work and restarts "
        "included.",
    ]
    return "\n".join(lines) + "\n"
