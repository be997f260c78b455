"""`report`: every chart, Markdown report and summary.md again from the JSON records alone
(nothing is rerun).

    python -m project03_capstone_infra report [--reports-dir DIR]

Each record under <reports-dir>/project03_capstone_infra/ that has a renderer is rendered by its
experiment's module (`render(record, out_dir)`: its charts and its Markdown, from the record
alone, as the run that made the record wrote them), then summary.md is rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import PROJECT
from . import chaos, checkpoint_bench, cost, data, reshard, tune
from .summary import write_summary

# record stem -> its experiment's renderer (record, out_dir) -> files written
RENDERERS: dict[str, Callable[[dict, Path], list[Path]]] = {
    "cost": cost.render,
    "chaos": chaos.render,
    "chaos_gpu": chaos.render,
    "checkpoint_bench": checkpoint_bench.render,
    "checkpoint_bench_ws2": checkpoint_bench.render,
    "data": data.render,
    "tune": tune.render,
    "reshard": reshard.render,
}


@dataclass
class ReportConfig:
    """Redraw project03's charts, Markdown reports and summary.md from the JSON records (nothing
    is rerun)."""

    reports_dir: str = ""
    """the reports root holding project03_capstone_infra/ (default: the repo's reports/)"""


def render_all(reports_dir: str | Path | None = None) -> list[Path]:
    """Every record present rendered (charts and Markdown), then summary.md; returns the files
    written."""
    from shared.results import REPORTS_DIR, load_result

    root = Path(reports_dir) if reports_dir else Path(REPORTS_DIR)
    d = root / PROJECT
    paths: list[Path] = []
    for stem, render in RENDERERS.items():
        if (d / f"{stem}.json").is_file():
            paths += render(load_result(d / f"{stem}.json"), d)
    paths.append(write_summary(root))
    return paths


def command(cfg: ReportConfig) -> int:
    """`report`: every chart, Markdown report and summary.md from the records."""
    from shared.cli import input_dir

    if cfg.reports_dir:
        input_dir("--reports-dir", cfg.reports_dir)
    for p in render_all(cfg.reports_dir or None):
        print(f"wrote {p}")
    return 0
