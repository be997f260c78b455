"""The cost model: expected wall time of a job under interruptions, with the checkpoint interval
chosen by the Young/Daly formula, and a Monte Carlo of the same process.

The model (Daly 2006, exponential failures). The job needs W hours of useful work (tokens /
throughput). It saves a checkpoint after every tau hours of work, each save holding training for
C hours. Interruptions (spot preemptions of any of the job's nodes, plus hardware failures of any
of its GPUs) arrive as a Poisson process of rate lambda = 1/M per hour. After an interruption
the job needs R hours (new node, start-up, checkpoint load) before it trains again, and it
redoes the work since the last checkpoint. A segment of s = tau + C hours then takes, in
expectation,

    E(s) = M * exp(R / M) * (exp(s / M) - 1)

hours of wall time (an interruption during the restart also counts), and the job takes the sum
over its segments. The checkpoint interval that minimises it is close to Young's
tau = sqrt(2 * C * M); a numerical search of the formula's optimum is shown beside it.
The plans (plan.py) turn hours into cost: wall hours x GPUs x price per GPU-hour, the whole
allocation billed during restarts and lost work (the nodes that survived sit idle but paid for).

The Monte Carlo simulates the same process run by run (exponential inter-arrival times, or
inter-arrival times resampled from a trace) and gives the spread the mean hides: P50/P90/P99
completion time and cost. For exponential arrivals its mean must agree with the analytic E
within the stated tolerance (the tests check it); for a trace it is the better estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

# Hardware interruptions per GPU-hour: Llama 3 pre-training saw 419 unexpected interruptions in
# 54 days on 16,384 H100s ("The Llama 3 Herd of Models", Meta, 2024, section 3.3.4).
LLAMA3_GPU_FAILURES_PER_HOUR = 419 / (16_384 * 54 * 24)

# Relative tolerance of the Monte Carlo mean against the analytic expectation (exponential
# arrivals). The tests also require agreement within 4 standard errors of the mean.
MC_TOLERANCE = 0.02

Sampler = Callable[[np.random.Generator, int], np.ndarray]


# --- the analytic model ------------------------------------------------------------------------


def _check_nonneg(**values: float) -> None:
    for name, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise TypeError(f"{name} must be a finite number, got {v!r}")
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def segment_lengths(work_h: float, interval_h: float, save_h: float) -> np.ndarray:
    """Wall hours of each failure-free segment: floor(W / tau) of tau + C, then the rest + C.
    The last segment's save is the final checkpoint of the run."""
    _check_nonneg(work_h=work_h, interval_h=interval_h, save_h=save_h)
    if work_h <= 0:
        raise ValueError(f"work_h must be > 0, got {work_h}")
    if interval_h <= 0:
        raise ValueError(f"interval_h must be > 0, got {interval_h}")
    n_full = int(work_h // interval_h)
    if n_full > 10_000_000:
        raise ValueError(
            f"{n_full:,} checkpoints for {work_h:g} h of work every {interval_h:g} h: "
            "choose a longer checkpoint interval"
        )
    rest = work_h - n_full * interval_h
    segs = [interval_h + save_h] * n_full
    if rest > 1e-12 * work_h or not segs:
        segs.append(rest + save_h)
    return np.asarray(segs, dtype=float)


def expected_segment_hours(seg_h: np.ndarray | float, rate_per_h: float, restart_h: float):
    """E[wall hours] to finish a segment of seg_h failure-free hours: exact for Poisson
    interruptions of rate_per_h with a restart of restart_h after each (Daly 2006)."""
    _check_nonneg(rate_per_h=rate_per_h, restart_h=restart_h)
    seg_h = np.asarray(seg_h, dtype=float)
    if rate_per_h == 0:
        return seg_h
    # M e^{R/M} (e^{s/M} - 1), with expm1 for accuracy when s << M
    return np.exp(rate_per_h * restart_h) * np.expm1(rate_per_h * seg_h) / rate_per_h


def expected_hours(
    work_h: float, interval_h: float, save_h: float, rate_per_h: float, restart_h: float
) -> float:
    """Expected wall hours of the whole job (sum over its segments)."""
    segs = segment_lengths(work_h, interval_h, save_h)
    return float(expected_segment_hours(segs, rate_per_h, restart_h).sum())


def young_daly_interval(save_h: float, rate_per_h: float) -> float:
    """Young's first-order optimum tau = sqrt(2 C M), M = 1 / rate (hours of work between saves)."""
    _check_nonneg(save_h=save_h, rate_per_h=rate_per_h)
    if rate_per_h == 0:
        return math.inf
    if save_h == 0:
        raise ValueError("save_h must be > 0 for a Young/Daly interval (free saves: save always)")
    return math.sqrt(2.0 * save_h / rate_per_h)


def optimal_interval(
    work_h: float, save_h: float, rate_per_h: float, restart_h: float, *, points: int = 400
) -> float:
    """The interval minimising `expected_hours`: a log-spaced search, then a finer one around
    the best point. The expectation is not smooth in the interval (the last segment is partial,
    so the number of saves jumps), so Young/Daly's own interval is a candidate too."""
    if rate_per_h == 0:
        return work_h
    guess = min(young_daly_interval(save_h, rate_per_h), work_h)

    def hours(t: float) -> float:
        return expected_hours(work_h, t, save_h, rate_per_h, restart_h)

    best, best_h = guess, hours(guess)
    lo, hi = guess / 30, min(guess * 30, work_h)
    for _ in range(2):
        grid = np.geomspace(lo, max(hi, lo * 1.0001), points)
        costs = [hours(t) for t in grid]
        i = int(np.argmin(costs))
        if costs[i] < best_h:
            best, best_h = float(grid[i]), costs[i]
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, points - 1)]
    return best


# --- the Monte Carlo ---------------------------------------------------------------------------


def exponential_sampler(rate_per_h: float) -> Sampler:
    _check_nonneg(rate_per_h=rate_per_h)

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        if rate_per_h == 0:
            return np.full(n, np.inf)
        return rng.exponential(1.0 / rate_per_h, n)

    return draw


def trace_sampler(inter_arrival_h: np.ndarray) -> Sampler:
    """Inter-arrival times resampled (with replacement) from an observed trace."""
    gaps = np.asarray(inter_arrival_h, dtype=float)
    if gaps.ndim != 1 or gaps.size < 2:
        raise ValueError("a preemption trace needs at least 2 inter-arrival times")
    if not np.all(np.isfinite(gaps)) or np.any(gaps <= 0):
        raise ValueError("preemption trace inter-arrival times must be finite and > 0 hours")

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(gaps, size=n, replace=True)

    return draw


def simulate_hours(
    work_h: float,
    interval_h: float,
    save_h: float,
    restart_h: float,
    sampler: Sampler,
    *,
    runs: int,
    seed: int = 0,
) -> np.ndarray:
    """Wall hours of `runs` simulated jobs. Each node lives for a drawn time; a segment that
    ends before the node dies is kept; otherwise the time until the interruption is lost, a
    replacement is started (R hours, itself interruptible) and the segment is redone."""
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive int, got {runs!r}")
    _check_nonneg(restart_h=restart_h)
    segs = segment_lengths(work_h, interval_h, save_h)
    rng = np.random.default_rng(seed)
    wall = np.zeros(runs)
    life = sampler(rng, runs)  # hours the current allocation has left before an interruption
    for s in segs:
        pending = np.arange(runs)
        while pending.size:
            done = life[pending] >= s
            ok = pending[done]
            wall[ok] += s
            life[ok] -= s
            failed = pending[~done]
            wall[failed] += life[failed]
            # restart until one replacement survives its own start-up
            need = failed
            while need.size:
                fresh = sampler(rng, need.size)
                up = fresh >= restart_h
                wall[need[up]] += restart_h
                life[need[up]] = fresh[up] - restart_h
                wall[need[~up]] += fresh[~up]
                need = need[~up]
            pending = failed
    return wall
