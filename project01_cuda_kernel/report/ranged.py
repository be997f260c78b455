"""A figure's table cell: the plain value for a record of one run, "median (min–max)" for a
record holding two or more repetitions (`shared.repeat.flat`: `name`, `name_min`, `name_max`,
`name_reps` beside each other in a row).

A single-run record renders exactly as it did before repetitions existed, so the committed
reports regenerate byte for byte; a repeated one shows how far apart its repetitions were.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.repeat import Spread, ratio, read_flat


def repeats(row: dict | None, key: str) -> int:
    """How many repetitions `row` holds for figure `key` (1 for a single-run value)."""
    if not row:
        return 0
    return len(row.get(f"{key}_reps") or ()) or (1 if row.get(key) is not None else 0)


def ranged(row: dict | None, key: str, fmt: Callable[[float], str]):
    """row[key] as it was (None when absent), or 'median (min–max)' formatted with `fmt` when
    the row holds two or more repetitions of it."""
    if not row:
        return None
    value = row.get(key)
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    if value is None or lo is None or hi is None or repeats(row, key) < 2:
        return value
    return f"{fmt(value)} ({fmt(lo)}–{fmt(hi)})"


def spread_text(s: Spread | None, fmt: Callable[[float], str]) -> str:
    """A spread as `fmt` of its median, with '(min–max)' when it holds two or more values."""
    if s is None:
        return "n/a"
    if s.n < 2:
        return fmt(s.median)
    return f"{fmt(s.median)} ({fmt(s.min)}–{fmt(s.max)})"


def row_ratio(num: dict | None, den: dict | None, key: str) -> Spread | None:
    """num[key] / den[key] per repetition (the rows' `_reps`, paired by repetition), or the
    plain ratio for rows of one run; None when either is missing or the denominator is 0."""
    a, b = read_flat(num or {}, key), read_flat(den or {}, key)
    if a is None or b is None or any(v == 0 for v in b.values):
        return None
    return ratio(a, b)


def number(fmt: str) -> Callable[[float], str]:
    """A formatter for `ranged`: format(v, fmt)."""
    return lambda v: format(v, fmt)
