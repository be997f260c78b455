"""The serving record as a chart and a table, from the record's `results` alone (no rerun).

`serving_chart`: p50 and p99 TTFT (left) and TPOT (right) against achieved output tok/s, one
point per run labelled with its offered rate or client count, the SLO targets as dashed lines and
the offline engine's throughput, where known, as the ceiling.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

SERIES = (("p50_ms", "p50", "-"), ("p99_ms", "p99", "--"))


def _label(run: dict) -> str:
    return f"{run['max_concurrency']} clients" if run.get("closed_loop") else run["request_rate"]


def serving_chart(results: dict, path: str | os.PathLike, footnote: str | None = None) -> Path:
    from shared import charts  # sets the Agg backend

    plt = charts.plt
    runs = sorted(
        (r for r in results["runs"] if r.get("completed")), key=lambda r: r["output_tok_s"]
    )
    slo, ceiling = results["slo"], (results.get("offline") or {}).get("offline_output_tok_s")
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.4))
    for ax, (metric, title, target) in zip(
        axes,
        (
            ("ttft", "Time to first token", slo["ttft_ms"]),
            ("tpot", "Time per output token", slo["tpot_ms"]),
        ),
    ):
        xs = [r["output_tok_s"] for r in runs]
        for key, name, style in SERIES:
            ys = [r[metric][key] if r[metric][key] is not None else math.nan for r in runs]
            ax.plot(xs, ys, style, marker="o", label=name)
        for r in runs:
            y = r[metric]["p99_ms"]
            if y is not None:
                ax.annotate(
                    _label(r),
                    (r["output_tok_s"], y),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        ax.axhline(target, color="#C44E52", ls=":", lw=1.2, label=f"SLO {target:g} ms")
        if ceiling:
            ax.axvline(
                ceiling, color="0.3", ls="-.", lw=1.2, label=f"offline engine {ceiling:,.0f} tok/s"
            )
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("achieved output tok/s")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Serving latency vs achieved throughput (point labels: offered req/s)")
    return charts._save(fig, path, footnote)


def _ms(d: dict, key: str):
    return d.get(key) if d else None


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    slo = results["slo"]
    t = Table(
        title=f"serving: {results['target']['base_url']}{results['target']['endpoint']} "
        f"(SLO: TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms)"
    )
    cols = (
        "offered",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "ITL p99",
        "E2E p50",
        "failed",
        "goodput",
        "SLO",
    )
    for c in cols:
        t.add_column(c, justify="right")
    for r in results["runs"]:
        if "skipped" in r:
            t.add_row(_label(r), *["-"] * (len(cols) - 2), "skipped")
            continue
        cells = [
            r["request_throughput"],
            r["output_tok_s"],
            _ms(r["ttft"], "p50_ms"),
            _ms(r["ttft"], "p99_ms"),
            _ms(r["tpot"], "p50_ms"),
            _ms(r["tpot"], "p99_ms"),
            _ms(r["itl"], "p99_ms"),
            _ms(r["e2e"], "p50_ms"),
        ]
        t.add_row(
            _label(r),
            *(_cell(v) for v in cells),
            str(r["failed"] + r["not_sent"]),
            _cell(r["goodput_req_s"]),
            "met" if r["slo_met"] else "missed",
        )
    t.caption = "req/s and goodput: completed requests/s; latencies in ms"
    Console(width=None if sys.stdout.isatty() else 150).print(t)
    best, off = results["max_rate_meeting_slo"], results["offline"]
    rate = best["request_rate"]
    print("highest offered rate meeting the SLO: " + (f"{rate} req/s" if rate else "none"))
    if off["serving_vs_offline"] is not None:
        print(
            f"serving {off['serving_output_tok_s']:,.0f} vs offline "
            f"{off['offline_output_tok_s']:,.0f} output tok/s (run {off['serving_run']}): "
            f"{off['serving_vs_offline']:.3f}x, HTTP + streaming overhead "
            f"{off['overhead_pct']:+.1f}% of the offline rate"
        )
        if off["workload_differences"]:
            print(f"  (workloads differ: {off['workload_differences']})")


def _cell(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
