"""Repetitions for the benchmarks: each measurement of one shape timed `repeats` times, ours and
its baselines alternating (`shared.repeat.interleave`), and the repetitions summarised into a
record row.

Inside one repetition a measurement is timed exactly as a single run always was
(`shared.timing.benchmark`: `do_bench`, L2 flushed, warm-up and repetition budgets); this module
only orders the repetitions and writes the summary:

- `time_interleaved(timers, repeats)`: each timer (a callable returning a `Timing`) once per
  repetition, the order reversed on every other one; keeps every `Timing`.
- `timing_fields(timings, flops, nbytes)`: `median_ms`, `p20_ms`, `p80_ms`, `tflops` (and
  `gbps`) as the median over repetitions with `_min`, `_max` and `_reps` beside each
  (`shared.repeat.flat`), so a reader of single-run records reads these unchanged.
- `Timed.ratio(num, den)`: the per-repetition ratio of two measurements' times, whose median is
  the figure (the median of ratios, not the ratio of medians).

Nothing here touches a GPU: the timers are the caller's, so a CPU test drives it with fake ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.repeat import Repeats, Spread, flat, interleave


class TimingLike(Protocol):
    """What a timer returns: `shared.timing.Timing` (or a test's stand-in)."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    method: str


@dataclass
class Timed:
    """What `time_interleaved` measured: the median ms of each repetition per name (with the
    errors and call order, `shared.repeat.Repeats`) and every `Timing` in repetition order."""

    reps: Repeats
    timings: dict[str, list[TimingLike]]

    @property
    def repeats(self) -> int:
        return self.reps.repeats

    def ok(self, name: str) -> bool:
        """`name` was timed in every repetition without an error."""
        return name not in self.reps.errors and len(self.reps.values.get(name) or ()) > 0

    def error(self, name: str) -> str | None:
        return self.reps.errors.get(name)

    def ratio(self, num: str, den: str) -> Spread | None:
        """time(num) / time(den) per repetition (= throughput of den over num); None unless both
        were timed."""
        if not (self.ok(num) and self.ok(den)):
            return None
        return self.reps.ratio(num, den)


def time_interleaved(
    timers: Mapping[str, Callable[[], TimingLike]],
    repeats: int,
    *,
    catch: tuple[type[BaseException], ...] = (RuntimeError,),
) -> Timed:
    """Call every timer once per repetition, `repeats` repetitions, alternating the order. A
    timer that raises one of `catch` (or times nothing finite) is recorded in the errors and not
    called again; the caller decides what its row says."""
    timings: dict[str, list[TimingLike]] = {name: [] for name in timers}

    def once(name: str) -> Callable[[], float]:
        def measure() -> float:
            t = timers[name]()
            timings[name].append(t)
            return t.median_ms

        return measure

    reps = interleave({name: once(name) for name in timers}, repeats, catch=catch)
    return Timed(reps, timings)


def timing_fields(timings: Sequence[TimingLike], flops: float, nbytes: float | None = None) -> dict:
    """A row's timing figures over repetitions: each the median with `_min`/`_max`/`_reps`.
    TFLOP/s and GB/s are computed per repetition from that repetition's median time."""
    if not timings:
        raise ValueError("timing_fields: no timings")
    ms = Spread.of(t.median_ms for t in timings)
    counts = [int(t.n) for t in timings]
    out = {
        **flat("median_ms", ms),
        **flat("p20_ms", Spread.of(t.p20_ms for t in timings)),
        **flat("p80_ms", Spread.of(t.p80_ms for t in timings)),
        "n_timed": int(statistics.median_low(counts)),
        "n_timed_reps": counts,
        "timing_method": timings[0].method,
        **flat("tflops", ms.map(lambda v: flops / (v * 1e-3) / 1e12)),
    }
    if nbytes is not None:
        out.update(flat("gbps", ms.map(lambda v: nbytes / (v * 1e-3) / 1e9)))
    return out
