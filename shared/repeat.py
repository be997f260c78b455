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
- `ranged(row, name, fmt)`: a table cell, the plain number for a record of one run (so tables of
  such records render as before) and "median (min–max)" for two or more repetitions.
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


def ranged(row: Mapping | None, name: str, fmt: Callable[[float], str], f=None):
    """The table cell of figure `name` of record row `row`: f(row[name]) as it is (None when
    absent) for a row of one run, or 'fmt(median) (fmt(min)–fmt(max))' with f applied to each
    (its ends sorted: a decreasing f swaps them) when the row holds two or more repetitions."""
    f = f or (lambda v: v)
    value = (row or {}).get(name)
    if value is None:
        return None
    s = read_flat(row, name)
    if s is None or s.n < 2:
        return f(value)
    lo, hi = sorted((f(s.min), f(s.max)))
    return f"{fmt(f(value))} ({fmt(lo)}–{fmt(hi)})"


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
