"""The results table of a README's front page, generated from the committed records.

A project lists its headline claims once (`<project>/headlines.py`: `CLAIMS`, a list of
`Claim`); `make readme` renders them between `<!-- results:<project> -->` markers in the root
README and in the project's own. Each row is one current value: the target, the figure read from
its record, met or missed and by how much, the record's date and GPU, and a link to the record.
A record measured on a tree with uncommitted changes says so beside its figure. A superseded
record stays in `reports/`; it simply has no claim pointing at it.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Claim:
    """One row of a front page's results table."""

    what: str
    """what is measured, in a few words (the shape, dtype and baseline where they matter)"""
    record: str
    """the record's file name under reports/<project>/"""
    measure: Callable[[dict], float | None]
    """the figure, read from the whole record (None: the record does not hold it)"""
    unit: str
    """the figure's unit as printed after it: "% of cuBLAS", "x SDPA FLASH", "ms/token" """
    target: float | None = None
    """the goal the figure is judged against (None: reported, not judged)"""
    higher_is_better: bool = True
    fmt: str = ",.3g"
    """format of the figure and the target"""
    root: bool = False
    """also shown in the repository README's table (its few headline claims)"""
    spread: Callable[[dict], tuple[float, float] | None] | None = None
    """the (min, max) of the figure over the record's repetitions, where it has them"""

    def goal_text(self) -> str:
        if self.target is None:
            return "n/a"
        return f"{'>=' if self.higher_is_better else '<='} {format(self.target, self.fmt)}"


def _points_unit(unit: str) -> bool:
    """A unit that is itself a percentage: margins are differences in points."""
    return unit.startswith("%")


def spread_of(d: dict | None, key: str, scale: float = 1.0) -> tuple[float, float] | None:
    """(min, max) of figure `key` over repetitions, from a record's `<key>_min` / `<key>_max`
    (scaled), or None for a figure measured once."""
    if not d or d.get(f"{key}_min") is None or d.get(f"{key}_max") is None:
        return None
    lo, hi = d[f"{key}_min"] * scale, d[f"{key}_max"] * scale
    return (min(lo, hi), max(lo, hi))


def verdict(claim: Claim, value: float | None, span: tuple[float, float] | None = None) -> str:
    """'met by ...' / 'missed by ...' (points for a percentage unit, otherwise relative to the
    target), 'reported' for a claim without a target, 'not measured' without a value. A range
    over repetitions that reaches the other side of the target is said beside the verdict."""
    text = _verdict(claim, value)
    if span is not None and claim.target is not None and value is not None:
        lo, hi = span
        if lo < claim.target < hi:
            text += " (range spans it)"
    return text


def _verdict(claim: Claim, value: float | None) -> str:
    if value is None:
        return "not measured"
    if claim.target is None:
        return "reported"
    gap = value - claim.target if claim.higher_is_better else claim.target - value
    met = gap >= 0
    if gap == 0:
        return "met"
    if _points_unit(claim.unit):
        by = f"{abs(gap):.2g} pts" if abs(gap) < 1 else f"{abs(gap):.1f} pts"
    elif claim.target:
        rel = abs(gap) / abs(claim.target) * 100
        by = f"{rel:.2g}%" if rel < 1 else f"{rel:.0f}%"
    else:
        by = format(abs(gap), claim.fmt)
    return f"{'met' if met else '**missed**'} by {by}"


def gpu_label(env: dict) -> str:
    """'H200', 'H100 80GB HBM3', or 'CPU (2 cores)': where the record was measured."""
    gpu = env.get("gpu")
    if gpu:
        return str(gpu).removeprefix("NVIDIA ").strip()
    return f"CPU ({env.get('cpu_count', '?')} cores)"


def is_dirty(env: dict) -> bool:
    """The record was measured on a tree with uncommitted changes."""
    return bool(env.get("git_dirty")) or str(env.get("git_commit") or "").endswith("+dirty")


def load_record(folder: Path, name: str) -> dict | None:
    path = folder / name
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def rows(claims: Sequence[Claim], folder: Path, link_prefix: str) -> list[dict]:
    """One dict per claim with every column of the table (figures formatted)."""
    out = []
    for c in claims:
        rec = load_record(folder, c.record)
        value = c.measure(rec) if rec is not None else None
        span = c.spread(rec) if rec is not None and c.spread and value is not None else None
        env = (rec or {}).get("environment", {})
        figure = "n/a" if value is None else format(value, c.fmt)
        if span is not None:
            figure += f" ({format(span[0], c.fmt)}–{format(span[1], c.fmt)})"
        if value is not None and is_dirty(env):
            figure += " (dirty tree)"
        out.append(
            {
                "claim": c.what,
                "target": c.goal_text(),
                "measured": figure,
                "unit": c.unit,
                "verdict": verdict(c, value, span),
                "date": (env.get("date") or "")[:10] or "n/a",
                "GPU": gpu_label(env) if rec is not None else "n/a",
                "record": f"[{c.record}]({link_prefix}{c.record})",
            }
        )
    return out


NOTE = (
    "_Generated by `make readme` from the records linked in the last column: medians, with the "
    "min–max over repetitions where the record has them; a figure marked (dirty tree) was "
    "measured on uncommitted changes._"
)


def render(claims: Sequence[Claim], folder: Path, link_prefix: str, *, note: bool = True) -> str:
    """The Markdown table of `claims` from the records in `folder`; record links start with
    `link_prefix` (the records' folder as seen from the page that shows the table); `note`
    adds the line that says how the table is made."""
    from shared.results import markdown_table

    table = markdown_table(rows(claims, folder, link_prefix))
    return table + ("\n\n" + NOTE if note else "")


def render_projects(groups: Sequence[tuple[str, Sequence[Claim], Path, str]]) -> str:
    """One table over several projects (the repository README): `groups` holds, per project,
    its name, its claims, its records' folder and that folder as seen from the page; each row
    starts with the project's name."""
    from shared.results import markdown_table

    table = [
        {"project": name, **row}
        for name, claims, folder, prefix in groups
        for row in rows(claims, folder, prefix)
    ]
    return markdown_table(table)


def link_prefix(page: Path, folder: Path) -> str:
    """The records' folder relative to the folder of the page that links to them."""
    rel = posixpath.relpath(folder.resolve().as_posix(), page.resolve().parent.as_posix())
    return rel.rstrip("/") + "/"
