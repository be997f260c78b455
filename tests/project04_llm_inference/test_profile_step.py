"""bench.profile_step's per-step figures from a profile's kernel events: kernels launched, busy
time on the critical path (overlapping kernels charged once) and the device's idle gaps."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from project04_llm_inference.bench.profile_step import print_critical_path


def _kernel(name, start, end):
    return NS(name=name, device_type=NS(name="CUDA"), time_range=NS(start=start, end=end))


def test_critical_path_counts_kernels_busy_and_idle_per_step():
    # two steps of: a (0-10 us), b overlapping a (5-20), a gap of 30, c (50-60); a CPU event
    events = []
    for base in (0, 100):
        events += [
            _kernel("a", base, base + 10),
            _kernel("b", base + 5, base + 20),
            _kernel("c", base + 50, base + 60),
        ]
    events.append(NS(name="cpu op", device_type=NS(name="CPU"), time_range=NS(start=0, end=99)))
    res = print_critical_path(NS(events=lambda: events), steps=2)
    assert res["kernels_per_decode_step"] == 3
    # busy per step: a 10 + b 10 (its overlap with a charged once) + c 10 = 30 us
    assert res["busy_ms_per_decode_step"] == pytest.approx(0.030)
    # idle: 30 us inside each step, and 40 us between the steps (counted once over 2 steps)
    assert res["idle_ms_per_decode_step"] == pytest.approx((30 + 40 + 30) / 2 / 1e3)
    assert res["idle_share"] == pytest.approx(100 / 160)
