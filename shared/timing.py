"""One timing interface for GPU and CPU code.

- CUDA: `triton.testing.do_bench` when Triton is installed (CUDA events, L2 flushed before each
  run, warm-up and repeat budgets in milliseconds), else the same method written with CUDA events.
- CPU: `torch.utils.benchmark.Timer.blocked_autorange`.

Both return a `Timing` with the median and the spread (20th/80th percentiles), in milliseconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    mean_ms: float
    n: int  # timed repetitions
    method: str  # "do_bench", "cuda_events" or "torch.utils.benchmark"

    def tflops(self, flops: float) -> float:
        """Achieved TFLOP/s at the median time."""
        return flops / (self.median_ms * 1e-3) / 1e12

    def gbps(self, nbytes: float) -> float:
        """Achieved GB/s (1e9 bytes/s) at the median time."""
        return nbytes / (self.median_ms * 1e-3) / 1e9

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative noise of this measurement."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _percentile(sorted_ms: list[float], q: float) -> float:
    if len(sorted_ms) == 1:
        return sorted_ms[0]
    pos = q * (len(sorted_ms) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(sorted_ms) - 1)
    return sorted_ms[lo] + (sorted_ms[hi] - sorted_ms[lo]) * (pos - lo)


def summarize(times_ms: list[float], method: str) -> Timing:
    if not times_ms:
        raise ValueError("no timings to summarize")
    s = sorted(times_ms)
    return Timing(
        median_ms=statistics.median(s),
        p20_ms=_percentile(s, 0.2),
        p80_ms=_percentile(s, 0.8),
        min_ms=s[0],
        mean_ms=statistics.fmean(s),
        n=len(s),
        method=method,
    )


def _is_cuda(device) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def benchmark(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    flush_l2: bool = True,
    device: str | torch.device | None = None,
    use_triton: bool = True,
) -> Timing:
    """Time `fn()` (no arguments) and return the median with its spread.

    device: where `fn` runs; default CUDA when available. On CUDA, `flush_l2` writes a 256 MB
    buffer before each timed call so inputs come from device memory, not the L2.
    """
    if not _is_cuda(device):
        return _benchmark_cpu(fn, min_run_time_s=max(rep_ms / 1e3, 0.05))
    if use_triton and flush_l2:  # do_bench always flushes the L2
        try:
            from triton.testing import do_bench
        except ImportError:
            pass
        else:
            # return_mode="all": every timed repetition, in ms.
            times = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
            return summarize(list(times), "do_bench")
    return _benchmark_cuda_events(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, flush_l2=flush_l2)


def _benchmark_cuda_events(
    fn: Callable[[], object], *, warmup_ms: float, rep_ms: float, flush_l2: bool
) -> Timing:
    cache = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda") if flush_l2 else None
    fn()
    torch.cuda.synchronize()
    # Estimate one call's time to size the warm-up and timed loops.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        if cache is not None:
            cache.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    n_warmup = max(1, int(warmup_ms / estimate))
    n_rep = max(5, int(rep_ms / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for _ in range(n_warmup):
        fn()
    for i in range(n_rep):
        if cache is not None:
            cache.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) for s, e in zip(starts, ends)], "cuda_events")


def _benchmark_cpu(fn: Callable[[], object], *, min_run_time_s: float) -> Timing:
    """Blocks of calls timed by torch.utils.benchmark (which handles threads and warm-up);
    each block lasts at least 1 ms, and at least 10 blocks are timed for a median and spread."""
    from torch.utils.benchmark import Timer

    timer = Timer(stmt="fn()", globals={"fn": fn})
    number = 1
    while True:
        per_call = timer.timeit(number).mean  # seconds; also warms up
        if per_call * number >= 1e-3 or number >= 10**6:
            break
        number *= 10
    reps = int(min(1000, max(10, min_run_time_s / (per_call * number))))
    times_ms = [timer.timeit(number).mean * 1e3 for _ in range(reps)]
    return summarize(times_ms, "torch.utils.benchmark")


class CudaTimer:
    """Context manager timing a region on the current CUDA stream with events (ms).

    with CudaTimer() as t: work()
    t.elapsed_ms  # read after the block; synchronizes on the end event
    """

    def __enter__(self) -> CudaTimer:
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._start.record()
        return self

    def __exit__(self, *exc) -> None:
        self._end.record()

    @property
    def elapsed_ms(self) -> float:
        self._end.synchronize()
        return self._start.elapsed_time(self._end)
