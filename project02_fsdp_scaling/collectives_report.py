"""The Markdown table and bus-bandwidth chart of a `collectives` record, from the JSON alone."""

from __future__ import annotations

from pathlib import Path

from shared.results import atomic_write_text, environment_line, markdown_table


def _size(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def collectives_markdown(rec: dict, heading: str = "#") -> str:
    res, cfg = rec["results"], rec["config"]
    sysinfo, ops = res["system"], res["ops"]
    n = sysinfo["world_size"]
    where = rec["environment"].get("gpu") or "CPU"
    lines = [
        f"{heading} Collectives: {n} ranks, {sysinfo['backend']} on {where}, {cfg['dtype']}",
        "",
        f"Bus bandwidth in GB/s (1e9 bytes/s) by message size, nccl-tests' definitions: "
        f"busbw = size / time x 2(n-1)/n for all-reduce, (n-1)/n for all-gather, "
        f"reduce-scatter and all-to-all, 1 for broadcast; time is the slowest rank's mean of "
        f"{cfg['iters']} calls after {cfg['warmup']} warm-up calls.",
        "",
    ]
    names = list(ops)
    sizes = [row["bytes"] for row in ops[names[0]]]
    rows = []
    for i, size in enumerate(sizes):
        row = {"size": _size(size)}
        for op in names:
            row[op] = ops[op][i]["busbw_gbs"]
        rows.append(row)
    lines.append(markdown_table(rows, ["size", *names], floatfmt=",.3g"))
    lines.append("")
    lines.append(
        "Time per call in microseconds at the smallest and largest size: "
        + "; ".join(
            f"{op} {ops[op][0]['time_us']:,.1f} / {ops[op][-1]['time_us']:,.0f}" for op in names
        )
        + "."
    )
    extra = []
    if sysinfo.get("nccl_version"):
        extra.append(f"NCCL {sysinfo['nccl_version']}")
    env = sysinfo.get("nccl_env") or {}
    extra.append(
        ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "NCCL_ALGO/NCCL_PROTO unset"
        if sysinfo["backend"] == "nccl"
        else "gloo (through host memory and the loopback network)"
    )
    if sysinfo.get("nvlink"):
        nv = sysinfo["nvlink"]
        extra.append(f"NVLink: {nv['links']} links x {nv['gbs_per_link']:g} GB/s on GPU 0")
    if sysinfo.get("link_peak_gbs"):
        extra.append(f"link peak {sysinfo['link_peak_gbs']:g} GB/s one way")
    lines += [
        "",
        "; ".join(extra) + ".",
        "",
        f"Measured on {environment_line(rec['environment'])}.",
    ]
    if sysinfo.get("topology"):
        lines += ["", "```", sysinfo["topology"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def collectives_chart(rec: dict, out_dir: Path, stem: str) -> Path:
    from matplotlib.ticker import FuncFormatter

    from shared.charts import footer, line_figure, save_figure

    res = rec["results"]
    sysinfo = res["system"]
    series = {
        op: ([r["bytes"] for r in rows], [r["busbw_gbs"] for r in rows])
        for op, rows in res["ops"].items()
    }
    peak = sysinfo.get("link_peak_gbs")
    fig = line_figure(
        series,
        title=f"Bus bandwidth vs message size, {sysinfo['world_size']} ranks, {sysinfo['backend']}",
        xlabel="message size (bytes, nccl-tests' size)",
        ylabel="bus bandwidth (GB/s)",
        logx=True,
        logy=True,  # bytes/s across nine decades of message size
        hlines=[(peak, f"link peak {peak:g} GB/s")] if peak else (),
        footnote=footer(rec["environment"]),
    )
    fig.axes[0].xaxis.set_major_formatter(FuncFormatter(lambda v, _: _size(int(v))))
    return save_figure(rotate_xlabels(fig), out_dir / f"{stem}_busbw.png")


def rotate_xlabels(fig):
    """Tilt a finished chart's x tick labels and lay it out again above its footer (the
    shared builders lay out once, for level labels)."""
    ax = fig.axes[0]
    for label in ax.get_xticklabels():
        label.set_rotation(30)
        label.set_ha("right")
    footer = fig.texts[-1].get_text() if fig.texts else ""
    lines = footer.count("\n") + 1 if footer else 0
    bottom = (0.12 * lines + 0.06) / fig.get_figheight() if lines else 0.0
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def render(rec: dict, out_dir: Path, stem: str) -> list[Path]:
    md = atomic_write_text(Path(out_dir) / f"{stem}.md", collectives_markdown(rec))
    return [md, collectives_chart(rec, Path(out_dir), stem)]
