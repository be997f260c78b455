"""The Markdown table and charts of a `strategies` record, from the JSON alone."""

from __future__ import annotations

from pathlib import Path

from shared.results import atomic_write_text, environment_line, markdown_table


def _label(run: dict) -> str:
    d = run["degrees"]
    mesh = "x".join(f"{k}{v}" for k, v in d.items() if v > 1)
    return f"{run['name']} ({mesh})"


def strategies_markdown(rec: dict, heading: str = "#") -> str:
    res = rec["results"]
    env = rec["environment"]
    where = env.get("gpu") or f"CPU ({env.get('cpu_count')} cores)"
    on_gpu = res["device"] == "cuda"
    rows = []
    for r in res["runs"]:
        bubble = r.get("bubble") or {}
        exposed = r.get("exposed_comm_ms")
        step_ms = r.get("profiled_step_ms")
        rows.append(
            {
                "strategy": _label(r),
                "ranks": r["world_size"],
                "tokens/s": round(r["tokens_per_s"]),
                "MFU": None if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
                "state MiB/rank": r["state_bytes_measured"] / 2**20,
                "formula MiB": r["state_bytes_formula"] / 2**20,
                "formula": r["state_formula"],
                "peak GiB": r.get("peak_memory_gib"),
                "exposed comm": None
                if exposed is None or not step_ms
                else f"{exposed:.1f} ms ({100 * exposed / step_ms:.0f}%)",
                "idle (bubble)": None
                if not bubble
                else f"{100 * bubble['measured_idle_share']:.0f}% "
                f"(formula {100 * bubble['formula_share']:.0f}%)",
            }
        )
    args = res["model"]["args"]
    lines = [
        f"{heading} Parallel strategies: `{res['preset']}` ({args['n_layers']} blocks, "
        f"{res['model']['n_params']:,} parameters), global batch {res['global_batch']} x "
        f"{res['seq_len']} tokens, {res['precision']}, {where}",
        "",
        markdown_table(rows, floatfmt=",.4g"),
        "",
        "state MiB/rank: the largest rank's parameters, gradients (the parameters' size) and "
        "AdamW moments, measured from its tensors; formula: 16 bytes per parameter held "
        "(float32 parameter, gradient and two moments) over what the strategy splits. "
        "Exposed comm: communication while nothing computes, from one profiled step on rank 0 "
        "(torch.profiler). Idle: the share of a pipeline rank's step outside its stages' "
        "forward and backward (bubble plus point-to-point waits) beside (p - 1) / (v m + p - 1).",
    ]
    if not on_gpu:
        lines += [
            "",
            "On the CPU every strategy shares one process per rank, so no per-strategy peak "
            "memory is read (the host's peak RSS only grows); ranks beyond the cores share them, "
            "so tokens/s compares strategies at one world size, not across world sizes.",
        ]
    lines += ["", f"Measured on {environment_line(env)}."]
    return "\n".join(lines) + "\n"


def strategies_charts(rec: dict, out_dir: Path, stem: str) -> list[Path]:
    from project02_fsdp_scaling.collectives_report import rotate_xlabels
    from shared.charts import bar_chart, footer, grouped_bar_figure, save_figure

    runs = rec["results"]["runs"]
    labels = [_label(r) for r in runs]
    memory = grouped_bar_figure(
        labels,
        {
            "measured": [r["state_bytes_measured"] / 2**20 for r in runs],
            "formula": [r["state_bytes_formula"] / 2**20 for r in runs],
        },
        title="Training state per rank (parameters, gradients, AdamW moments): measured vs formula",
        ylabel="MiB per rank",
        footnote=footer(rec["environment"]),
    )
    rotate_xlabels(memory)  # long strategy names
    return [
        bar_chart(
            out_dir / f"{stem}_throughput.png",
            labels,
            [r["tokens_per_s"] for r in runs],
            title="Throughput by parallel strategy",
            ylabel="tokens/s",
            bar_labels=[f"{r['tokens_per_s']:,.0f}" for r in runs],
            groups=[str(r["world_size"]) + " ranks" for r in runs],
            footnote=footer(rec["environment"]),
        ),
        save_figure(memory, out_dir / f"{stem}_memory.png"),
    ]


def render(rec: dict, out_dir: Path, stem: str) -> list[Path]:
    md = atomic_write_text(Path(out_dir) / f"{stem}.md", strategies_markdown(rec))
    return [md, *strategies_charts(rec, Path(out_dir), stem)]
