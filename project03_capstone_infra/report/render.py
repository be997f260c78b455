"""`report`: every chart and summary.md again from the JSON records alone (nothing is rerun).

    python -m project03_capstone_infra report [--reports-dir DIR]

Each record under <reports-dir>/project03_capstone_infra/ that has a renderer gets its charts
redrawn by its experiment's module (`write_charts(record, out_dir)`), then summary.md is
rewritten. The Markdown report of each experiment is written by the run that makes the record,
by the same module and from the record alone (`render`: charts and Markdown).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import PROJECT
from . import chaos, checkpoint_bench, cost, data, reshard, tune
from .summary import write_summary

# record stem -> the charts of its experiment (record, out_dir) -> files written
CHARTS: dict[str, Callable[[dict, Path], list[Path]]] = {
    "cost": cost.write_charts,
    "chaos": chaos.write_charts,
    "chaos_gpu": chaos.write_charts,
    "checkpoint_bench": checkpoint_bench.write_charts,
    "data": data.write_charts,
    "tune": tune.write_charts,
    "reshard": reshard.write_charts,
}


@dataclass
class ReportConfig:
    """Redraw project03's charts and summary.md from the JSON records (nothing is rerun)."""

    reports_dir: str = ""
    """the reports root holding project03_capstone_infra/ (default: the repo's reports/)"""


def render_all(reports_dir: str | Path | None = None) -> list[Path]:
    """The charts of every record present, then summary.md; returns the files written."""
    from shared.results import REPORTS_DIR, load_result

    root = Path(reports_dir) if reports_dir else Path(REPORTS_DIR)
    d = root / PROJECT
    paths: list[Path] = []
    for stem, draw in CHARTS.items():
        if (d / f"{stem}.json").is_file():
            paths += draw(load_result(d / f"{stem}.json"), d)
    paths.append(write_summary(root))
    return paths


def command(cfg: ReportConfig) -> int:
    """`report`: every chart and summary.md from the records."""
    from shared.cli import input_dir

    if cfg.reports_dir:
        input_dir("--reports-dir", cfg.reports_dir)
    for p in render_all(cfg.reports_dir or None):
        print(f"wrote {p}")
    return 0
