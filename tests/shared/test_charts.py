"""CPU tier: the house rules of shared.charts, read off the Figure objects (Agg backend), not
off pixels: integer x ticks, y axes from 0, distinct series styles, footers passed through."""

from __future__ import annotations

import matplotlib
import pytest

from shared import charts

plt = charts.plt


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _line(series, **kw):
    kw.setdefault("title", "t")
    kw.setdefault("xlabel", "x")
    kw.setdefault("ylabel", "y")
    return charts.line_figure(series, **kw)


def _text(fig) -> str:
    """Every figure-level text (the footer), its wrapping undone."""
    return " ".join(" ".join(t.get_text().split()) for t in fig.texts)


def test_the_backend_needs_no_display():
    assert matplotlib.get_backend().lower() == "agg"


def test_integer_world_sizes_get_a_tick_at_each_measured_value_only():
    fig = _line({"measured": ([1, 2], [78_000.0, 148_000.0])})
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [1, 2]  # no 1.2, 1.4, ... GPUs
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    fig = _line({"measured": ([1, 2, 4, 8], [1.0, 1.9, 3.7, 7.0])}, logx=True)
    assert list(fig.axes[0].get_xticks()) == [1, 2, 4, 8]


def test_power_of_two_sizes_on_a_log_axis_are_labelled_as_integers():
    fig = _line({"k": ([512, 1024, 16384], [1.0, 2.0, 3.0])}, logx=True)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert list(ax.get_xticks()) == [512, 1024, 16384]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["512", "1,024", "16,384"]
    assert list(ax.xaxis.get_minorticklocs()) == []


def test_many_integer_steps_get_whole_number_ticks():
    fig = _line(
        {"loss": (list(range(1, 61)), [5.0 - 0.01 * s for s in range(60)])}, y_from_zero=False
    )
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) < 15 and all(float(t).is_integer() for t in ticks)


def test_fractional_x_values_keep_matplotlib_ticks():
    ax = plt.subplots()[1]
    assert not charts.integer_xticks(ax, [0.5, 1.0, 2.0])
    assert charts.integer_xticks(ax, [1.0, 2.0, None])  # None (not measured) is skipped


def test_a_rate_axis_starts_at_zero_unless_told_otherwise():
    series = {"measured": ([1, 2], [100.0, 95.0])}
    lo, hi = _line(series).axes[0].get_ylim()
    assert lo == 0 and hi >= 100  # 5% reads as 5%, not as a cliff
    assert _line(series, y_from_zero=False).axes[0].get_ylim()[0] > 90
    assert _line(series, ylim=(0, 105)).axes[0].get_ylim() == (0, 105)
    assert _line(series, logy=True).axes[0].get_ylim()[0] > 0  # a log axis has no 0
    assert _line({"d": ([1, 2], [-1.0, 2.0])}).axes[0].get_ylim()[0] < 0  # never hides data


def test_bars_start_at_zero_with_room_for_labels():
    fig = charts.grouped_bar_figure(
        ["a", "b"], {"x": [90.0, 95.0], "y": [92.0, None]}, title="t", ylabel="%"
    )
    lo, hi = fig.axes[0].get_ylim()
    assert lo == 0 and hi > 95
    fig = charts.stacked_bar_figure(["1", "2"], {"a": [1, 2], "b": [3, 1]}, title="t", ylabel="ms")
    assert fig.axes[0].get_ylim()[0] == 0 and fig.axes[0].get_ylim()[1] > 4


def test_every_series_has_its_own_colour_and_marker():
    series = {f"trial {i}": ([1, 2, 3], [3.0 - i / 10, 2.0, 1.0]) for i in range(12)}
    lines = _line(series, y_from_zero=False).axes[0].get_lines()
    styles = {(ln.get_color(), ln.get_marker()) for ln in lines}
    assert len(styles) == 12
    assert len({charts.series_style(i)["color"] for i in range(10)}) == 10


def test_footer_text_is_passed_through():
    foot = (
        "NVIDIA H200, driver 580, torch 2.11, CUDA 13.0, Python 3.12, 2026-11-29, commit abc " * 3
    )
    for fig in (
        _line({"a": ([1, 2], [1.0, 2.0])}, footnote=foot),
        charts.bar_figure(["a"], [1.0], title="t", ylabel="y", footnote=foot),
        charts.grouped_bar_figure(["a"], {"s": [1.0]}, title="t", ylabel="y", footnote=foot),
        charts.stacked_bar_figure(["a"], {"s": [1.0]}, title="t", ylabel="y", footnote=foot),
        charts.roofline_figure(
            [("k", 100.0, 2e14)], peak_flops=989e12, peak_bandwidth=4.8e12, title="t", footnote=foot
        ),
    ):
        assert _text(fig) == " ".join(foot.split())  # wrapped to the width, nothing lost
    assert _text(_line({"a": ([1, 2], [1.0, 2.0])})) == ""  # no footer unless given


def test_footers_name_the_records_hardware_not_the_drawing_machine():
    env = {
        "gpu": "NVIDIA H200",
        "driver": "580.1",
        "torch": "2.11.0",
        "cuda": "13.0",
        "python": "3.12.3",
        "date": "2026-11-29T10:00:00+00:00",
        "git_commit": "abc1234",
        "cpu_count": 2,
    }
    line = charts.footer(env, "1b, batch 8")
    assert line.startswith("1b, batch 8; NVIDIA H200") and "2026-11-29" in line
    assert "CPU" not in line
    cpu = charts.footer({**env, "gpu": None}, None)
    assert cpu.startswith("CPU (2 cores)")
    proj = charts.projection_footer(
        "8x h200-sxm",
        ["reports/p/a.json", "reports/p/a.json", "reports/q/b.json"],
        date="2026-11-29T1",
    )
    assert proj == "PROJECTED for 8x h200-sxm from reports/p/a.json, reports/q/b.json; 2026-11-29"


def test_bars_coloured_by_family_with_a_legend_and_their_own_labels():
    fig = charts.bar_figure(
        ["s07", "h08", "h09"],
        [82.1, 47.9, 90.9],
        title="t",
        ylabel="% of cuBLAS",
        groups=["float32", "bfloat16", "bfloat16"],
        bar_labels=["82.1%", "47.9%", "90.9%"],
        baseline=100.0,
        baseline_label="cuBLAS",
    )
    ax = fig.axes[0]
    colours = [p.get_facecolor() for p in ax.patches[:3]]
    assert colours[0] != colours[1] and colours[1] == colours[2]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["float32", "bfloat16", "cuBLAS"]
    assert {"82.1%", "47.9%", "90.9%"} <= {t.get_text() for t in ax.texts}
    with pytest.raises(ValueError, match="lengths differ"):
        charts.bar_figure(["a", "b"], [1, 2], title="t", ylabel="y", groups=["x"])


def test_family_baselines_span_only_their_bars():
    fig = charts.bar_figure(
        ["s1", "s2", "h1"],
        [10.0, 40.0, 600.0],
        title="t",
        ylabel="TFLOP/s",
        groups=["fp32", "fp32", "bf16"],
        group_baselines={"fp32": (50.0, "cuBLAS fp32"), "bf16": (700.0, "cuBLAS bf16")},
    )
    ax = fig.axes[0]
    segs = {c.get_label(): c.get_segments()[0] for c in ax.collections}
    assert segs["cuBLAS fp32"][0][0] < 0 < 1 < segs["cuBLAS fp32"][1][0] < 2
    assert 1 < segs["cuBLAS bf16"][0][0] < 2 < segs["cuBLAS bf16"][1][0]
    assert ax.get_ylim()[1] > 700


def test_a_labelled_peak_line():
    fig = _line(
        {"ours": ([512, 1024], [400.0, 600.0])},
        logx=True,
        hlines=[(989.0, "dense bf16 peak: 989 TFLOP/s")],
    )
    ax = fig.axes[0]
    assert "dense bf16 peak: 989 TFLOP/s" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "dense bf16 peak: 989 TFLOP/s" in [t.get_text() for t in ax.texts]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 989


def test_large_values_read_as_k_and_m():
    assert [charts.fmt_number(v) for v in (0.498, 41.9, 148_568.0, 4.08e6)] == [
        "0.498",
        "41.9",
        "149k",
        "4.08M",
    ]


def test_the_writers_still_write_pngs_and_return_the_path(tmp_path):
    p = charts.line_chart(
        tmp_path / "sub" / "l.png",
        {"a": ([1, 2], [1.0, 2.0])},
        title="t",
        xlabel="x",
        ylabel="y",
        footnote="H200",
    )
    assert p == tmp_path / "sub" / "l.png" and p.read_bytes()[:4] == b"\x89PNG"
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    q = charts._save(fig, tmp_path / "hand.png", "a footer")  # figures built by hand
    assert q.read_bytes()[:4] == b"\x89PNG"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["hand.png", "sub"]  # no temp files
