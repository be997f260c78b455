"""Charts for reports: PNGs readable in a README (title, axes with units, baseline lines).

Every `*_chart` function writes one PNG (parent folders created) and returns its path; the
`*_figure` function of the same name builds the matplotlib Figure without writing it (what the
tests inspect, and what a caller extends before `save_figure`). Matplotlib runs with the Agg
backend, so no display is needed.

House rules the builders apply, so every chart reads at a glance:

- x values that are all integers (world sizes, sequence lengths, steps) get integer ticks, at
  the measured values themselves when there are few of them (never "1.2 GPUs");
- a linear y axis starts at 0 (a rate's fall from 100 to 95 is 5%, not a cliff) unless the
  caller says otherwise (`y_from_zero=False`, e.g. a loss curve) or sets `ylim`;
- each series has its own colour and marker;
- the footer names where the figures come from: `footer(record's environment)` for a
  measurement, `projection_footer(...)` for a projection; never the machine drawing the chart.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    MaxNLocator,
    NullLocator,
)

_DPI = 130
COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
# 7 markers against 10 colours: (colour, marker) pairs repeat only after 70 series.
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
BASELINE_COLOR = "#C44E52"
_MAX_FIXED_TICKS = 12  # integer x values up to this many distinct ones get a tick each


def series_style(i: int) -> dict:
    """Colour and marker of the i-th series: distinct for every series of a chart."""
    return {"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)]}


# --- footers ---------------------------------------------------------------------------------


def footer(env: dict, context: str | None = None) -> str:
    """The footer of a chart about a measurement: its context, then the record's environment
    (GPU, driver, versions, date, commit) -- where the figures were measured."""
    from shared.results import environment_line

    line = environment_line(env or {})
    return f"{context}; {line}" if context else line


def projection_footer(
    subject: str, sources: Sequence[str], *, date: str | None = None, context: str | None = None
) -> str:
    """The footer of a projection: what it is about (e.g. '8x h200-sxm') and the records it is
    projected from, so it is never read as measured on the machine that drew it."""
    src = ", ".join(dict.fromkeys(s for s in sources if s)) or "assumptions only"
    parts = [f"PROJECTED for {subject} from {src}"]
    if context:
        parts.append(context)
    if date:
        parts.append(str(date)[:10])
    return "; ".join(parts)


# --- layout helpers ---------------------------------------------------------------------------


def _wrap(text: str, width_in: float, chars_per_in: float) -> str:
    return "\n".join(textwrap.wrap(text, max(20, int(width_in * chars_per_in))))


def _title(ax, fig, title: str) -> None:
    ax.set_title(_wrap(title, fig.get_figwidth(), 9.5))


def _finish(fig, footnote: str | None = None) -> Figure:
    """Footer (wrapped to the figure's width) and a tight layout that leaves room for it."""
    bottom = 0.0
    if footnote:
        text = _wrap(footnote, fig.get_figwidth(), 17.0)
        fig.text(0.01, 0.005, text, fontsize=7, color="0.35", ha="left", va="bottom")
        bottom = (0.12 * (text.count("\n") + 1) + 0.06) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Write a finished figure as a PNG (atomically) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=_DPI)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _save(fig, path: str | os.PathLike, footnote: str | None = None) -> Path:
    """Footer, layout and write, for a figure built by hand."""
    return save_figure(_finish(fig, footnote), path)


def _check_lengths(**seqs: Sequence) -> None:
    lengths = {k: len(v) for k, v in seqs.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"lengths differ: {lengths}")


def _finite(values) -> list[float]:
    out = []
    for v in values:
        if v is None:
            continue
        f = float(v)
        if math.isfinite(f):
            out.append(f)
    return out


def fmt_number(v: float) -> str:
    """3 significant digits, thousands as k and millions as M (4.08M, not 4.08e+06)."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g}G"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def _y_formatter(ax, ys: Sequence[float]) -> None:
    if ys and max(abs(y) for y in ys) >= 1e4 and ax.get_yscale() == "linear":
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_number(v) if v else "0"))


def integer_xticks(ax, xs: Sequence[float], *, log: bool = False) -> bool:
    """Integer ticks when every x value is an integer: one at each measured value when there
    are at most a dozen of them (or the axis is logarithmic), else whole numbers only.
    Returns whether it applied."""
    vals = _finite(xs)
    if not vals or not all(v.is_integer() for v in vals):
        return False
    distinct = sorted({int(v) for v in vals})
    if log or len(distinct) <= _MAX_FIXED_TICKS:
        step = math.ceil(len(distinct) / _MAX_FIXED_TICKS)
        ax.xaxis.set_major_locator(FixedLocator(distinct[::step]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v)):,}"))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return True


def y_axis_from_zero(ax, ys: Sequence[float], *, headroom: float = 0.05) -> None:
    """Start a linear y axis at 0 (data all >= 0), with a little room above the top value."""
    vals = _finite(ys)
    if ax.get_yscale() != "linear" or not vals or min(vals) < 0:
        return
    top = max(max(vals), ax.get_ylim()[1] if max(vals) == 0 else 0.0)
    ax.set_ylim(0, top * (1 + headroom) if top > 0 else 1.0)


def hline(
    ax,
    y: float,
    label: str,
    *,
    color: str = "0.25",
    ls: str = "--",
    lw: float = 1.3,
    text: bool = True,
) -> None:
    """A labelled horizontal line (a hardware peak, a baseline): in the legend and, with
    `text`, written on the line at its right end."""
    ax.axhline(y, color=color, ls=ls, lw=lw, label=label)
    if text:
        ax.annotate(
            label,
            (1.0, y),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color=color,
        )


def _legend(ax, n: int) -> None:
    if n <= 0:
        return
    if n > 6:  # many series: beside the plot, never over the data
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8, loc="best")


# --- charts ----------------------------------------------------------------------------------


def bar_figure(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    baseline_label: str | None = None,
    annotate: bool = True,
    bar_labels: Sequence[str] | None = None,
    groups: Sequence[str] | None = None,
    group_baselines: dict[str, tuple[float, str]] | None = None,
    footnote: str | None = None,
) -> Figure:
    """Vertical bars, one per label, with an optional horizontal baseline (e.g. cuBLAS).

    `groups` names each bar's family (e.g. its dtype): bars are coloured by family, with a
    legend. `group_baselines` maps a family to (value, label): a line over that family's bars
    only. `bar_labels` replaces the value written above each bar."""
    _check_lengths(labels=labels, values=values)
    if groups is not None:
        _check_lengths(labels=labels, groups=groups)
    if bar_labels is not None:
        _check_lengths(labels=labels, bar_labels=bar_labels)
    fig, ax = plt.subplots(figsize=(max(6.4, 0.8 * len(labels) + 2), 4.4))
    x = np.arange(len(labels))
    vals = [np.nan if v is None else float(v) for v in values]
    families = list(dict.fromkeys(groups)) if groups is not None else []
    color = {g: COLORS[i % len(COLORS)] for i, g in enumerate(families)}
    colors = [color[g] for g in groups] if groups is not None else COLORS[0]
    bars = ax.bar(x, vals, color=colors)
    handles = [Patch(color=color[g], label=g) for g in families]  # one entry per family
    lines = list(_finite(vals))
    if baseline is not None:
        handles.append(
            ax.axhline(
                baseline, color=BASELINE_COLOR, ls="--", lw=1.5, label=baseline_label or "baseline"
            )
        )
        lines.append(baseline)
    for g, (value, label) in (group_baselines or {}).items():
        idx = [i for i, gi in enumerate(groups or []) if gi == g]
        if not idx:
            continue
        handles.append(
            ax.hlines(
                value,
                min(idx) - 0.45,
                max(idx) + 0.45,
                color=color.get(g, "0.3"),
                ls="--",
                lw=1.5,
                label=label,
            )
        )
        lines.append(value)
    if annotate:
        texts = (
            bar_labels
            if bar_labels is not None
            else ["" if not math.isfinite(v) else fmt_number(v) for v in vals]
        )
        for b, v, t in zip(bars, vals, texts):
            if t:
                ax.annotate(
                    t,
                    (b.get_x() + b.get_width() / 2, 0 if math.isnan(v) else v),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 2),
                    textcoords="offset points",
                    zorder=4,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85},
                )
    widest = max((len(line) for s in labels for line in str(s).split("\n")), default=0)
    long = widest > 12 or len(labels) > 8
    ax.set_xticks(x, labels, rotation=30 if long else 0, ha="right" if long else "center")
    ax.set_ylabel(ylabel)
    _title(ax, fig, title)
    ax.grid(axis="y", alpha=0.3)
    # Headroom above the tallest bar or line for the value labels and the legend.
    n_legend = len(handles)
    rows = math.ceil(n_legend / 2) if n_legend > 2 else n_legend
    ax.set_ylim(0, max(lines, default=1.0) * (1.12 + 0.08 * rows) or 1.0)
    _y_formatter(ax, lines)
    if handles:
        ax.legend(handles=handles, fontsize=8, loc="upper left", ncol=2 if n_legend > 2 else 1)
    return _finish(fig, footnote)


def bar_chart(
    path: str | os.PathLike, labels: Sequence[str], values: Sequence[float], **kwargs
) -> Path:
    """`bar_figure` written to `path`."""
    return save_figure(bar_figure(labels, values, **kwargs), path)


def grouped_bar_figure(
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    baseline_label: str | None = None,
    footnote: str | None = None,
) -> Figure:
    """Groups along x (e.g. sequence lengths), one bar per series in each (e.g. implementations)."""
    for name, vals in series.items():
        if len(vals) != len(groups):
            raise ValueError(f"series {name!r} has {len(vals)} values for {len(groups)} groups")
    n = max(len(series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.4, 0.6 * len(groups) * n + 2), 4.4))
    x = np.arange(len(groups))
    ys: list[float] = []
    for i, (name, vals) in enumerate(series.items()):
        v = [np.nan if y is None else y for y in vals]
        ys += _finite(v)
        ax.bar(x - 0.4 + width * (i + 0.5), v, width, label=name, color=COLORS[i % len(COLORS)])
    if baseline is not None:
        ax.axhline(baseline, color="k", ls="--", lw=1, label=baseline_label or "baseline")
        ys.append(baseline)
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    _title(ax, fig, title)
    y_axis_from_zero(ax, ys, headroom=0.05 + 0.07 * min(len(series) + (baseline is not None), 5))
    _y_formatter(ax, ys)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    return _finish(fig, footnote)


def grouped_bar_chart(
    path: str | os.PathLike, groups: Sequence[str], series: dict[str, Sequence[float]], **kwargs
) -> Path:
    """`grouped_bar_figure` written to `path`."""
    return save_figure(grouped_bar_figure(groups, series, **kwargs), path)


def line_figure(
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ideal: tuple[Sequence[float], Sequence[float]] | None = None,
    ideal_label: str = "ideal",
    logx: bool = False,
    logy: bool = False,
    y_from_zero: bool = True,
    ylim: tuple[float, float] | None = None,
    hlines: Sequence[tuple[float, str]] = (),
    footnote: str | None = None,
) -> Figure:
    """One line per series of (x, y), each with its own colour and marker; `ideal` is drawn
    dashed (e.g. linear scaling), `hlines` are labelled horizontal lines (value, label), e.g. a
    hardware peak. A linear y axis starts at 0 unless `y_from_zero=False` or `ylim` is given."""
    fig, ax = plt.subplots(figsize=(6.8 if len(series) <= 6 else 8.6, 4.4))
    xs_all: list[float] = []
    ys_all: list[float] = []
    for i, (name, (xs, ys)) in enumerate(series.items()):
        _check_lengths(x=xs, y=ys)
        style = series_style(i)
        # With few series the earlier ones are drawn larger, so a curve that coincides with a
        # later one (an equality the chart exists to show) stays visible around it.
        grow = len(series) - 1 - i if len(series) <= 3 else 0
        ms = (5 if len(xs) > 20 else 6) + 2.5 * grow
        # a long series (a loss curve) marks about 12 of its points: a marker per point would
        # hide the line and the curves under it
        every = max(1, len(xs) // 12) if len(xs) > 40 else 1
        ax.plot(xs, ys, label=name, ms=ms, lw=1.5 + 1.5 * grow, markevery=every, **style)
        xs_all += _finite(xs)
        ys_all += _finite(ys)
    if ideal is not None:
        ax.plot(ideal[0], ideal[1], ls="--", color="0.4", label=ideal_label)
        ys_all += _finite(ideal[1])
    for j, (value, label) in enumerate(hlines):
        hline(ax, value, label, color=("0.2", BASELINE_COLOR, "0.5")[j % 3], ls=("--", ":")[j % 2])
        ys_all.append(value)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    integer_xticks(ax, xs_all, log=logx)
    if ylim is not None:
        ax.set_ylim(*ylim)
    elif y_from_zero:
        y_axis_from_zero(ax, ys_all)
    if not logy:
        _y_formatter(ax, ys_all)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _title(ax, fig, title)
    ax.grid(alpha=0.3)
    _legend(ax, len(series) + (ideal is not None) + len(hlines))
    return _finish(fig, footnote)


def line_chart(
    path: str | os.PathLike, series: dict[str, tuple[Sequence[float], Sequence[float]]], **kwargs
) -> Path:
    """`line_figure` written to `path`."""
    return save_figure(line_figure(series, **kwargs), path)


def roofline_figure(
    points: Sequence[tuple[str, float, float]],
    *,
    peak_flops: float,
    peak_bandwidth: float,
    title: str,
    groups: Sequence[str] | None = None,
    footnote: str | None = None,
) -> Figure:
    """Log-log roofline: points are (label, FLOP/byte, achieved FLOP/s); roofs from the peaks
    (FLOP/s and bytes/s). Axes are shown in TFLOP/s. With `groups` (one per point, e.g. the
    kernel) each group has one colour and marker and a legend entry, and the groups' labels sit
    on alternate sides of their points, so points of one shape do not hide each other's label."""
    if peak_flops <= 0 or peak_bandwidth <= 0:
        raise ValueError("peak_flops and peak_bandwidth must be positive")
    if groups is not None:
        _check_lengths(points=points, groups=groups)
    ridge = peak_flops / peak_bandwidth
    intensities = [p[1] for p in points] or [ridge]
    lo = min(min(intensities), ridge) / 4
    hi = max(max(intensities), ridge) * 4
    xs = np.geomspace(lo, hi, 200)
    roof = np.minimum(peak_flops, xs * peak_bandwidth) / 1e12
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    ax.plot(xs, roof, color="k", lw=2, label="roofline")
    ax.axvline(ridge, color="0.6", ls=":", lw=1)
    ax.annotate(
        f"ridge {ridge:.0f} FLOP/B",
        (ridge, peak_flops / 1e12),
        fontsize=8,
        xytext=(4, -12),
        textcoords="offset points",
    )
    order = list(dict.fromkeys(groups)) if groups is not None else []
    for i, (label, intensity, achieved) in enumerate(points):
        g = order.index(groups[i]) if groups is not None else i
        style = series_style(g)
        first = groups is not None and groups.index(groups[i]) == i
        ax.scatter(
            [intensity],
            [achieved / 1e12],
            s=34,
            zorder=3,
            color=style["color"],
            marker=style["marker"],
            label=groups[i] if first else None,
        )
        left = groups is not None and g % 2 == 1
        ax.annotate(
            label,
            (intensity, achieved / 1e12),
            fontsize=7,
            xytext=(-5, -3) if left else (5, 2),
            ha="right" if left else "left",
            va="top" if left else "bottom",
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    _title(ax, fig, title)
    ax.grid(alpha=0.3, which="both")
    if groups is not None:
        ax.legend(fontsize=8, loc="lower right")
    return _finish(fig, footnote)


def roofline_chart(
    path: str | os.PathLike, points: Sequence[tuple[str, float, float]], **kwargs
) -> Path:
    """`roofline_figure` written to `path`."""
    return save_figure(roofline_figure(points, **kwargs), path)


def stacked_bar_figure(
    labels: Sequence[str],
    stacks: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    footnote: str | None = None,
) -> Figure:
    """One bar per label made of stacked parts (e.g. compute / exposed communication / other)."""
    for name, vals in stacks.items():
        if len(vals) != len(labels):
            raise ValueError(f"stack {name!r} has {len(vals)} values for {len(labels)} labels")
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(labels) + 2), 4.4))
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for i, (name, vals) in enumerate(stacks.items()):
        v = np.asarray(vals, dtype=float)
        ax.bar(x, v, bottom=bottom, label=name, color=COLORS[i % len(COLORS)])
        bottom += v
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    _title(ax, fig, title)
    y_axis_from_zero(ax, list(bottom), headroom=0.05 + 0.07 * min(len(stacks), 5))
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    return _finish(fig, footnote)


def stacked_bar_chart(
    path: str | os.PathLike, labels: Sequence[str], stacks: dict[str, Sequence[float]], **kwargs
) -> Path:
    """`stacked_bar_figure` written to `path`."""
    return save_figure(stacked_bar_figure(labels, stacks, **kwargs), path)
