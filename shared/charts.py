"""Charts for reports: PNGs readable in a README (title, axes with units, baseline lines).

Every function writes one PNG (parent folders created) and returns its path. Matplotlib runs
with the Agg backend, so no display is needed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_DPI = 130


def _save(fig, path: str | os.PathLike, footnote: str | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if footnote:
        fig.text(0.01, 0.005, footnote, fontsize=7, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03 if footnote else 0, 1, 1))
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=_DPI)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _check_lengths(**seqs: Sequence) -> None:
    lengths = {k: len(v) for k, v in seqs.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"lengths differ: {lengths}")


def bar_chart(
    path: str | os.PathLike,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    baseline_label: str | None = None,
    annotate: bool = True,
    footnote: str | None = None,
) -> Path:
    """Vertical bars, one per label, with an optional horizontal baseline (e.g. cuBLAS)."""
    _check_lengths(labels=labels, values=values)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(labels) + 2), 4.2))
    x = np.arange(len(labels))
    bars = ax.bar(x, values, color="#4C72B0")
    if baseline is not None:
        ax.axhline(baseline, color="#C44E52", ls="--", lw=1.5, label=baseline_label or "baseline")
        ax.legend(loc="upper left")
    if annotate:
        for b, v in zip(bars, values):
            ax.annotate(
                f"{v:.3g}",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path, footnote)


def grouped_bar_chart(
    path: str | os.PathLike,
    groups: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    baseline_label: str | None = None,
    footnote: str | None = None,
) -> Path:
    """Groups along x (e.g. sequence lengths), one bar per series in each (e.g. implementations)."""
    for name, vals in series.items():
        if len(vals) != len(groups):
            raise ValueError(f"series {name!r} has {len(vals)} values for {len(groups)} groups")
    n = max(len(series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(groups) * n + 2), 4.2))
    x = np.arange(len(groups))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x - 0.4 + width * (i + 0.5), [np.nan if v is None else v for v in vals], width,
               label=name)  # fmt: skip
    if baseline is not None:
        ax.axhline(baseline, color="k", ls="--", lw=1, label=baseline_label or "baseline")
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path, footnote)


def line_chart(
    path: str | os.PathLike,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ideal: tuple[Sequence[float], Sequence[float]] | None = None,
    ideal_label: str = "ideal",
    logx: bool = False,
    logy: bool = False,
    footnote: str | None = None,
) -> Path:
    """One line per series of (x, y); `ideal` is drawn dashed (e.g. linear scaling)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, (xs, ys) in series.items():
        _check_lengths(x=xs, y=ys)
        ax.plot(xs, ys, marker="o", label=name)
    if ideal is not None:
        ax.plot(ideal[0], ideal[1], ls="--", color="0.4", label=ideal_label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, footnote)


def roofline_chart(
    path: str | os.PathLike,
    points: Sequence[tuple[str, float, float]],
    *,
    peak_flops: float,
    peak_bandwidth: float,
    title: str,
    footnote: str | None = None,
) -> Path:
    """Log-log roofline: points are (label, FLOP/byte, achieved FLOP/s); roofs from the peaks
    (FLOP/s and bytes/s). Axes are shown in TFLOP/s."""
    if peak_flops <= 0 or peak_bandwidth <= 0:
        raise ValueError("peak_flops and peak_bandwidth must be positive")
    ridge = peak_flops / peak_bandwidth
    intensities = [p[1] for p in points] or [ridge]
    lo = min(min(intensities), ridge) / 4
    hi = max(max(intensities), ridge) * 4
    xs = np.geomspace(lo, hi, 200)
    roof = np.minimum(peak_flops, xs * peak_bandwidth) / 1e12
    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    ax.plot(xs, roof, color="k", lw=2, label="roofline")
    ax.axvline(ridge, color="0.6", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak_flops / 1e12), fontsize=8,
                xytext=(4, -12), textcoords="offset points")  # fmt: skip
    for label, intensity, achieved in points:
        ax.scatter([intensity], [achieved / 1e12], s=30, zorder=3)
        ax.annotate(label, (intensity, achieved / 1e12), fontsize=7, xytext=(4, 2),
                    textcoords="offset points")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path, footnote)


def stacked_bar_chart(
    path: str | os.PathLike,
    labels: Sequence[str],
    stacks: dict[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    footnote: str | None = None,
) -> Path:
    """One bar per label made of stacked parts (e.g. compute / exposed communication / other)."""
    for name, vals in stacks.items():
        if len(vals) != len(labels):
            raise ValueError(f"stack {name!r} has {len(vals)} values for {len(labels)} labels")
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(labels) + 2), 4.2))
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for name, vals in stacks.items():
        v = np.asarray(vals, dtype=float)
        ax.bar(x, v, bottom=bottom, label=name)
        bottom += v
    ax.set_xticks(x, labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path, footnote)
