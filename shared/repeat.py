"""Repeated measurements: ours and its baselines interleaved, n times, each figure summarised as
its median with the min-max range.

One run on a shared GPU is not a figure someone else can reproduce: clocks, temperature and
neighbours move between runs, and the same benchmark run twice in an hour can differ by several
percent. A headline figure is therefore the median of n repetitions (default 5), printed and
stored with its range. Timing inside a repetition is whatever the benchmark already does
(`do_bench`, CUDA events, warm-up, L2 flush); this module only orders the repetitions and
summarises them.

- `interleave(fns, n)`: every measurement once per repetition, the order reversed on every
  other repetition (A B, B A, A B, ...), so that a drift of the GPU's state over the run falls
  on ours and the baseline alike. Returns a `Repeats` holding every value, paired by repetition.
- `Spread`: one figure's values with their median, min and max; `Spread.map(f)` derives a figure
  per repetition (tok/s from ms) and takes its range from the derived values, `ratio(a, b)` is
  the per-repetition ratio a_i / b_i (the median of ratios, not the ratio of medians).
- `flat(name, spread)`: the record fields `name` (the median), `name_min`, `name_max` and
  `name_reps` (every value): the median keeps the field's old name, so code reading records
  written before repetitions existed reads the new ones unchanged.
- `merge_runs(runs, fields, largest)`: repeated runs' records as one, each figure of `fields` its
  median with its range, each of `largest` its maximum, the rest the first run's.
- `repetition_order(names, rep)`: the order `interleave` calls its measurements in, for a
  benchmark that runs its own loop (a time budget, measurements that share a process's state).
- `ranged(row, name, fmt, f)`: a figure of a record as a table cell, the plain number for a
  record of one run (so tables of such records render as before) and "median (min–max)" for two
  or more repetitions; `spread_text(spread, fmt)` the same cell for a `Spread` (text always), and
  `range_text(median, lo, hi, fmt)` the text itself, the one place it is written. `fmt` is a
  function from a number to its text or a format spec (",.3g": `format(v, ",.3g")`).
- `row_ratio(num, den, name)`: the per-repetition ratio of figure `name` of two records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class Spread:
    """The values of one figure over repetitions, in repetition order."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a spread needs at least one value")
        for v in self.values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"a spread holds finite numbers, got {v!r}")

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        return cls(tuple(float(v) for v in values))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def rel_range(self) -> float:
        """(max - min) / |median|: how far apart the repetitions were (0 for a zero median)."""
        return (self.max - self.min) / abs(self.median) if self.median else 0.0

    def map(self, f: Callable[[float], float]) -> Spread:
        """f applied to each repetition's value (a decreasing f swaps which end is min)."""
        return Spread.of(f(v) for v in self.values)

    def to_dict(self) -> dict:
        return {
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "n": self.n,
            "values": list(self.values),
        }


def ratio(num: Spread, den: Spread) -> Spread:
    """num_i / den_i for each repetition i both sides have (they are paired by repetition)."""
    k = min(num.n, den.n)
    if any(d == 0 for d in den.values[:k]):
        raise ValueError("ratio: a denominator repetition is 0")
    return Spread.of(a / b for a, b in zip(num.values[:k], den.values[:k]))


def flat(name: str, spread: Spread | None) -> dict:
    """Record fields for `spread`: `name` = median, `name_min`, `name_max`, `name_reps`.
    None (nothing measured) gives `name: None` alone."""
    if spread is None:
        return {name: None}
    return {
        name: spread.median,
        f"{name}_min": spread.min,
        f"{name}_max": spread.max,
        f"{name}_reps": list(spread.values),
    }


def merge_runs(runs: list[Mapping], fields: Iterable[str], largest: Iterable[str] = ()) -> dict:
    """Repeated runs' records (in repetition order) as one: the first run's fields, each of
    `fields` that every run has replaced by `flat` of its values (the median under its name,
    with `_min`, `_max`, `_reps`), each of `largest` by its maximum. One run: a copy of it."""
    out = dict(runs[0])
    if len(runs) == 1:
        return out
    for key in fields:
        vals = [r.get(key) for r in runs]
        if all(v is not None for v in vals):
            out.update(flat(key, Spread.of(vals)))
    for key in largest:
        out[key] = max(r[key] for r in runs)
    return out


def read_flat(record: Mapping, name: str) -> Spread | None:
    """The spread stored by `flat` (its `_reps`), or a one-value spread for a record of one run,
    or None when the field is absent or empty."""
    reps = record.get(f"{name}_reps")
    if reps:
        return Spread.of(reps)
    v = record.get(name)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return Spread.of([v])
    return None


Fmt = Callable[[float], str] | str
"""How a number is written in a cell: a function, or a format spec for `format(v, spec)`."""


def _formatter(fmt: Fmt) -> Callable[[float], str]:
    return (lambda v: format(v, fmt)) if isinstance(fmt, str) else fmt


def range_text(median: float, lo: float, hi: float, fmt: Fmt) -> str:
    """'median (lo–hi)', each of the three numbers written by `fmt` (an en dash between the
    ends, which are written in the order given)."""
    fmt = _formatter(fmt)
    return f"{fmt(median)} ({fmt(lo)}–{fmt(hi)})"


def spread_text(s: Spread | None, fmt: Fmt, missing: str = "n/a") -> str:
    """A spread as a cell: fmt(median) for one value, `range_text` of its median, min and max for
    two or more; `missing` for None."""
    if s is None:
        return missing
    if s.n < 2:
        return _formatter(fmt)(s.median)
    return range_text(s.median, s.min, s.max, fmt)


def ranged(row: Mapping | None, name: str, fmt: Fmt, f: Callable[[float], float] | None = None):
    """The table cell of figure `name` of record `row` (`flat`'s fields: `name` the median,
    `name_reps` the repetitions):

    - None when the row or its `name` is absent or None;
    - f(row[name]), a number left unformatted (the table formats it, as it did before
      repetitions existed), when the row holds one run (no `name_reps`, or one value in it);
    - 'fmt(f(median)) (fmt(f(min))–fmt(f(max)))' (`range_text`) for two or more repetitions,
      min and max taken over `name_reps`.

    `fmt`: a function from a number to its text, or a format spec (",.3g"). `f` (default: the
    value as it is) converts each value before it is written, e.g. ms to us; the ends are sorted
    after it, so a decreasing f (ms to tok/s) still writes the smaller end first."""
    value = (row or {}).get(name)
    if value is None:
        return None
    f = f or (lambda v: v)
    s = read_flat(row, name)
    if s is None or s.n < 2:
        return f(value)
    lo, hi = sorted((f(s.min), f(s.max)))
    return range_text(f(value), lo, hi, fmt)


def row_ratio(num: Mapping | None, den: Mapping | None, name: str) -> Spread | None:
    """num[name] / den[name] per repetition (the records' `name_reps`, paired by repetition,
    `ratio`), or the plain ratio for records of one run; None when either figure is missing or a
    denominator value is 0."""
    a, b = read_flat(num or {}, name), read_flat(den or {}, name)
    if a is None or b is None or any(v == 0 for v in b.values):
        return None
    return ratio(a, b)


def repetition_order(names: list[str], rep: int) -> list[str]:
    """The order of the measurements `names` in repetition `rep` (0-based): as given on even
    repetitions, reversed on odd ones (A B, B A, A B, ...)."""
    return list(names) if rep % 2 == 0 else list(names)[::-1]


@dataclass
class Repeats:
    """What `interleave` measured: each name's values in repetition order, the error that
    stopped a name (it is not called again), and the order of the calls in each repetition."""

    values: dict[str, list[float]]
    errors: dict[str, str] = field(default_factory=dict)
    order: list[list[str]] = field(default_factory=list)

    @property
    def repeats(self) -> int:
        return len(self.order)

    def spread(self, name: str) -> Spread | None:
        vals = self.values.get(name) or []
        return Spread.of(vals) if vals else None

    def ratio(self, num: str, den: str) -> Spread | None:
        a, b = self.spread(num), self.spread(den)
        return ratio(a, b) if a and b else None

    def to_dict(self) -> dict:
        return {
            "repeats": self.repeats,
            "interleaved": True,
            "spreads": {k: s.to_dict() for k in self.values if (s := self.spread(k))},
            "errors": dict(self.errors),
            "order": self.order,
        }


def interleave(
    fns: Mapping[str, Callable[[], float]],
    n: int = DEFAULT_REPEATS,
    *,
    catch: tuple[type[BaseException], ...] = (),
) -> Repeats:
    """Call each of `fns` (name -> a measurement returning a number) once per repetition, n
    repetitions, the order reversed on every other repetition. A measurement that raises one of
    `catch`, or returns None or a non-finite number, is recorded in `errors` and left out of
    the later repetitions; other exceptions propagate."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {n!r}")
    if not fns:
        raise ValueError("interleave: no measurements given")
    names = list(fns)
    out = Repeats(values={k: [] for k in names})
    for rep in range(n):
        order = [k for k in repetition_order(names, rep) if k not in out.errors]
        out.order.append(order)
        for name in order:
            try:
                v = fns[name]()
            except catch as e:
                out.errors[name] = f"repetition {rep + 1}: {type(e).__name__}: {e}"[:300]
                continue
            if (
                v is None
                or isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
            ):
                out.errors[name] = f"repetition {rep + 1}: no finite value (got {v!r})"
                continue
            out.values[name].append(float(v))
    return out
