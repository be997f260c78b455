"""Benchmark the GEMM ladder against cuBLAS, measured in the same process.

For each shape (square 512..8192 and transformer FFN shapes) and dtype, every ladder kernel
that takes the dtype is checked against a float64 reference before it is timed: a kernel passes
when its relative error is at most twice cuBLAS's own (torch.matmul, TF32 off for float32) in the
same dtype (plus a small floor). Then cuBLAS and the kernels that passed are timed `--repeats`
times (default 5), alternating (`shared.repeat.interleave`: cuBLAS, step 1, ..., step 9, then
the reverse), each repetition timed as a single run is (`shared.timing.benchmark`).

Reported per kernel and shape, each as the median over repetitions with `_min`, `_max` and
`_reps` beside it: latency (ms, with p20/p80 of each repetition), TFLOP/s, % of cuBLAS (the
median of the per-repetition ratios), achieved bandwidth (GB/s over the minimum bytes: A and B
read once, C written once) and the roofline position against the GPU's datasheet peaks
(shared.hardware). The record's environment holds the GPU's clocks, temperature and power at
the start and the end.

The FP8 step (fp8gemm_10_wgmma_tma, Hopper only) is measured the same way at its own square
sizes (`--fp8-sizes`, default 4096 and 8192) against `torch._scaled_mm` (cuBLASLt FP8) with
per-tensor scales and bfloat16 output (bench/fp8_gemm.py); its rows carry dtype
"float8_e4m3fn" and its baseline rows sit beside cuBLAS's.

    python -m project01_cuda_kernel bench-gemm                  # the full sweep
    python -m project01_cuda_kernel bench-gemm --quick          # small sizes, a smoke run

Writes <reports-dir>/project01_cuda_kernel/gemm.json; the charts gemm_*.png are drawn from it
(report.gemm).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from project01_cuda_kernel import PROJECT
from shared.repeat import DEFAULT_REPEATS, Spread, flat

from ..fp8_gemm import FP8_GEMM_KERNELS, REL_ERR_FLOOR
from ..gemm import GEMM_KERNELS
from .interleaved import time_interleaved, timing_fields

SQUARE_SIZES = (512, 1024, 2048, 4096, 8192)
# (M, N, K) with M = tokens: a 1B-class model's FFN up (d 2048 -> 5632) and down projections.
TRANSFORMER_SHAPES = ((8192, 5632, 2048), (8192, 2048, 5632))
# Slow early steps are only timed up to this many FLOPs (naive at 8192^3 takes seconds a call).
MAX_FLOPS = {1: 2 * 4096**3, 2: 2 * 4096**3, 3: 2 * 4096**3}
# Error slack where cuBLAS is near exact: float32 gets 2 sqrt(K) 2^-24 (a sequential K-term sum's
# rounding), bfloat16/float16 a fixed floor, the FP8 step (bfloat16 output) fp8_gemm's floor.
ERR_FLOOR = {
    "float32": "2*sqrt(K)*2^-24",
    "bfloat16": 1e-3,
    "float16": 1e-4,
    "float8_e4m3fn": REL_ERR_FLOOR,
}
FP8_SIZES = (4096, 8192)  # the FP8 step's square sizes against torch._scaled_mm
FP8_QUICK_SIZES = (512,)


def err_floor(dtype_name: str, k: int) -> float:
    return 2 * math.sqrt(k) * 2.0**-24 if dtype_name == "float32" else ERR_FLOOR[dtype_name]


DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ALL_KERNELS = GEMM_KERNELS + FP8_GEMM_KERNELS
GemmKernel = Literal[ALL_KERNELS]  # the ladder's kernel names, as command-line choices


@dataclass
class GemmBenchConfig:
    """Time every GEMM ladder kernel next to cuBLAS (same process), after checking each result
    against a float64 reference."""

    sizes: tuple[int, ...] = SQUARE_SIZES
    """square sizes M = N = K"""
    shapes: tuple[str, ...] = tuple(f"{m}x{n}x{k}" for m, n, k in TRANSFORMER_SHAPES)
    """extra MxNxK shapes; the default ones are a 1B-class model's FFN up and down projections"""
    kernels: tuple[GemmKernel, ...] | None = None
    """ladder kernels (None: every one that runs on this GPU)"""
    half_dtypes: tuple[Literal["bf16", "fp16"], ...] = ("bf16",)
    """dtypes of the tensor-core kernels"""
    fp8_sizes: tuple[int, ...] = FP8_SIZES
    """square sizes M = N = K of the FP8 step against torch._scaled_mm, each a multiple of 16
    (empty: no FP8 groups; --quick: 512); Hopper only"""
    warmup_ms: float = 25.0
    """warm-up time before each measurement, ms"""
    rep_ms: float = 100.0
    """time spent on the timed calls of each measurement, ms"""
    repeats: int = DEFAULT_REPEATS
    """repetitions per shape, cuBLAS and the ladder alternating; each figure is the median over
    them with its min-max range"""
    quick: bool = False
    """sizes 256 and 512 only (a smoke run)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: a new runs/<UTC time>/; reports/ only when named)"""
    charts: bool = True
    """draw the charts from the record once it is written"""

    def __post_init__(self) -> None:
        for s in self.sizes:
            if s < 1:
                raise ValueError(f"--sizes: expected integers >= 1, got {s}")
        self.shape_list()
        for s in self.fp8_sizes:
            if s < 16 or s % 16:
                raise ValueError(
                    f"--fp8-sizes: expected multiples of 16 (the FP8 kernel's K rule), got {s}"
                )
        for k in self.kernels or ():
            if k not in ALL_KERNELS:
                raise ValueError(f"--kernels: unknown kernel {k!r}; choose from {ALL_KERNELS}")
        for name in ("warmup_ms", "rep_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag}: expected a finite number > 0, got {v}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"--repeats: expected an integer >= 1, got {self.repeats}")
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("--reports-dir: expected a folder, got an empty path")

    def shape_list(self) -> list[tuple[int, int, int]]:
        """--shapes as (M, N, K) triples."""
        out = []
        for text in self.shapes:
            try:
                m, n, k = (int(x) for x in text.lower().split("x"))
            except ValueError:
                raise ValueError(
                    f"--shapes: shape must be MxNxK, e.g. 8192x5632x2048: {text!r}"
                ) from None
            if min(m, n, k) < 1:
                raise ValueError(f"--shapes: shape sizes must be >= 1: {text!r}")
            out.append((m, n, k))
        return out


def _rel_err(x, ref) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _shape_label(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


def _row(kind, kernel, dtype_name, shape, timings, err, torch_err, spec, tdtype):
    """One record row; `timings`: the kernel's `Timing` in each repetition (None: not timed)."""
    from shared.flops import dtype_bytes, matmul_bytes, matmul_flops
    from shared.roofline import roofline

    m, n, k = shape
    flops = matmul_flops(m, n, k)
    # FP8 inputs give a bfloat16 product (2 bytes); every other dtype writes its own.
    out_bytes = 2 if dtype_name.startswith("float8") else None
    nbytes = matmul_bytes(m, n, k, dtype_bytes(tdtype), out_bytes)
    row = {
        "kind": kind,
        "kernel": kernel,
        "dtype": dtype_name,
        "shape": _shape_label(m, n, k),
        "m": m,
        "n": n,
        "k": k,
        "flops": flops,
        "min_bytes": nbytes,
        "rel_err": err,
        "cublas_rel_err": torch_err,
        "correct": err <= 2 * torch_err + err_floor(dtype_name, k),
    }
    if timings:
        row.update(timing_fields(timings, flops, nbytes))
        if spec is not None:
            rp = roofline(flops, nbytes, spec.peak_flops(tdtype), spec.bandwidth())
            ms = Spread.of(t.median_ms for t in timings)
            row.update(
                intensity=rp.intensity,
                bound=rp.bound,
                attainable_tflops=rp.attainable_flops / 1e12,
                **flat(
                    "pct_of_roof", ms.map(lambda t: 100 * rp.fraction_of_roof(flops / (t * 1e-3)))
                ),
            )
    return row


def _failed_row(kernel: str, dtype_name: str, shape: tuple[int, int, int], error: str) -> dict:
    m, n, k = shape
    return {
        "kind": "ladder",
        "kernel": kernel,
        "dtype": dtype_name,
        "shape": _shape_label(*shape),
        "m": m,
        "n": n,
        "k": k,
        "correct": False,
        "error": error,
    }


def time_shape(
    shape: tuple[int, int, int],
    tdtype,
    checked: Mapping[str, float | str],
    timers: Mapping[str, Callable[[], object]],
    repeats: int,
    *,
    cublas_err: float,
    spec=None,
) -> tuple[dict, list[dict]]:
    """cuBLAS and the ladder kernels at one shape and dtype, timed `repeats` times alternating:
    (cuBLAS's row, the kernels' rows in `checked`'s order).

    checked: kernel -> its relative error against float64 (float) or why its check run failed
    (str), in ladder order. timers: "cublas" and each kernel to time -> a callable timing it
    once (returning a `shared.timing.Timing`); a kernel that failed its check has none. A kernel
    whose timing raises is recorded as failed; cuBLAS failing stops the run."""
    dn = str(tdtype).removeprefix("torch.")
    timed = time_interleaved(timers, repeats, catch=(Exception,))
    if not timed.ok("cublas"):
        raise RuntimeError(f"cuBLAS {dn} {_shape_label(*shape)}: {timed.error('cublas')}")
    base = _row(
        "cublas", "cublas", dn, shape, timed.timings["cublas"], cublas_err, cublas_err, spec, tdtype
    )
    rows = []
    for kernel, err in checked.items():
        if isinstance(err, str):
            rows.append(_failed_row(kernel, dn, shape, err))
            continue
        if kernel in timers and not timed.ok(kernel):
            rows.append(_failed_row(kernel, dn, shape, timed.error(kernel) or "not timed"))
            continue
        timings = timed.timings[kernel] if kernel in timers else None
        row = _row("ladder", kernel, dn, shape, timings, err, cublas_err, spec, tdtype)
        pct = timed.ratio("cublas", kernel) if timings else None  # cuBLAS time / ours, per rep
        if pct is not None:
            row.update(flat("pct_of_cublas", pct.map(lambda r: 100 * r)))
        rows.append(row)
    return base, rows


def _span(row: dict, key: str, fmt: str) -> str:
    """'668.2' or '668.2 (655.0-671.3)' when the row holds two or more repetitions."""
    text = format(row[key], fmt)
    if len(row.get(f"{key}_reps") or ()) < 2:
        return text
    return f"{text} ({row[f'{key}_min']:{fmt}}-{row[f'{key}_max']:{fmt}})"


def _measure_group(shape, dt, kernels: list[str], args: GemmBenchConfig, spec):
    """cuBLAS and `kernels` at one shape and dtype on this GPU: each kernel checked against a
    float64 reference first (ladder order), then cuBLAS and those that passed timed
    (`time_shape`)."""
    import torch

    from shared.timing import benchmark

    from .. import gemm

    m, n, k = shape
    dn = str(dt).removeprefix("torch.")
    timing_kw = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k * 17)
    a = torch.randn(m, k, device="cuda", generator=gen).to(dt)
    b = torch.randn(k, n, device="cuda", generator=gen).to(dt)
    ref = a.double() @ b.double()
    cublas_err = _rel_err(a @ b, ref)
    timers = {"cublas": lambda: benchmark(lambda: torch.matmul(a, b), **timing_kw)}
    checked: dict[str, float | str] = {}
    for kernel in kernels:
        try:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
            gemm.matmul(a, b, kernel=kernel, out=out)
            err = _rel_err(out, ref) if torch.isfinite(out).all() else float("inf")
        except Exception as e:  # record and go on: the report shows the failure
            checked[kernel] = f"{type(e).__name__}: {e}"
            continue
        checked[kernel] = err
        if err <= 2 * cublas_err + err_floor(dn, k):
            # Timed: the kernel launch itself (inputs checked by the call above), without the
            # custom operator's Python dispatch, which small shapes would otherwise measure.
            timers[kernel] = lambda out=out, kernel=kernel: benchmark(
                lambda: gemm.launch(a, b, kernel, out), **timing_kw
            )
    del ref
    return time_shape(shape, dt, checked, timers, args.repeats, cublas_err=cublas_err, spec=spec)


def fp8_sizes_of(args: GemmBenchConfig) -> list[int]:
    """The FP8 step's square sizes in this run: none unless its kernel is selected."""
    if args.kernels is not None and not set(args.kernels) & set(FP8_GEMM_KERNELS):
        return []
    return list(FP8_QUICK_SIZES if args.quick else args.fp8_sizes)


def measure(args: GemmBenchConfig) -> dict:
    """cuBLAS and every ladder kernel at every shape and dtype of `args`, on this GPU: the
    record's results."""
    import torch

    from shared.hardware import detect_gpu
    from shared.progress import progress

    from .. import fp8_gemm, gemm
    from .._build import require_cuda
    from .fp8_gemm import measure_fp8_group

    require_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS float32 on CUDA cores, like ours
    torch.backends.cudnn.allow_tf32 = False
    spec = detect_gpu()
    sizes = [256, 512] if args.quick else args.sizes
    shapes = [(s, s, s) for s in sizes] + ([] if args.quick else args.shape_list())
    kernels = [k for k in args.kernels or gemm.available_kernels() if k in GEMM_KERNELS]
    half = [getattr(torch, DTYPE_NAMES[d]) for d in args.half_dtypes]
    dtypes = [torch.float32, *half]

    def ladder_at(shape, dt) -> list[str]:
        if dt == fp8_gemm.IN_DTYPE:
            return [fp8_gemm.KERNEL]
        flops = 2 * shape[0] * shape[1] * shape[2]
        return [
            kernel
            for kernel in kernels
            if dt in gemm.kernel_dtypes(kernel)
            and flops <= MAX_FLOPS.get(gemm.step_of(kernel), float("inf"))
        ]

    groups = [(shape, dt) for shape in shapes for dt in dtypes]
    fp8_groups = [(s, s, s) for s in fp8_sizes_of(args)]
    if fp8_groups and not fp8_gemm.available():
        print(f"{fp8_gemm.KERNEL}: skipped: needs compute capability 9.0 (Hopper)", flush=True)
        fp8_groups = []
    groups += [(shape, fp8_gemm.IN_DTYPE) for shape in fp8_groups]
    n_ladder = sum(len(ladder_at(shape, dt)) for shape, dt in groups)
    t0 = time.perf_counter()
    print(
        f"{len(groups)} shape x dtype groups, each cuBLAS and its ladder kernels "
        f"({n_ladder} in all) timed {args.repeats} times, alternating",
        flush=True,
    )
    baseline: list[dict] = []
    rows: list[dict] = []
    with progress(len(groups), "gemm", unit="group", every=1, stream=sys.stdout) as bar:
        for shape, dt in groups:
            dn = str(dt).removeprefix("torch.")
            measure_group = measure_fp8_group if dt == fp8_gemm.IN_DTYPE else _measure_group
            try:
                base, ladder = measure_group(shape, dt, ladder_at(shape, dt), args, spec)
            except Exception as e:  # a fault poisons what follows, never what was measured
                why = f"not measured: {type(e).__name__}: {e}"[:300]
                base, ladder = (
                    None,
                    [_failed_row(kn, dn, shape, why) for kn in ladder_at(shape, dt)],
                )
                bar.log(f"  cublas {dn:8s} {_shape_label(*shape):>16s} {why}")
            torch.cuda.empty_cache()  # the group's inputs are gone: give their memory back
            if base is not None:
                baseline.append(base)
                bar.log(
                    f"  cublas {dn:8s} {base['shape']:>16s} {_span(base, 'tflops', '.1f')} TFLOP/s"
                )
            rows += ladder
            for row in ladder:
                status = (
                    f"{_span(row, 'tflops', '.2f')} TFLOP/s "
                    f"{_span(row, 'pct_of_cublas', '.1f')}% of cuBLAS"
                    if row.get("pct_of_cublas") is not None
                    else f"FAILED CHECK rel_err={row.get('rel_err')} {row.get('error', '')}"
                )
                bar.log(f"  {row['kernel']:24s} {dn:8s} {row['shape']:>16s} {status}")
            bar.advance(status=f"{dn} {_shape_label(*shape)}")
    return {
        "rows": rows,
        "baseline": baseline,
        "repeats": args.repeats,
        "gpu_spec": None
        if spec is None
        else {
            "key": spec.key,
            "peak_tflops": {d: f.value for d, f in spec.peak_tflops.items()},
            "bandwidth_gbs": spec.mem_bandwidth_gbs.value,
            "source": spec.mem_bandwidth_gbs.source,
        },
        "seconds": time.perf_counter() - t0,
        "shapes": [_shape_label(*s) for s in shapes],
    }


def print_summary(result: dict) -> None:
    from shared.results import markdown_table

    def cell(r: dict, key: str) -> str | None:
        return _span(r, key, ".4g") if r.get(key) is not None else None

    table = [
        {
            "kernel": r["kernel"],
            "dtype": r["dtype"],
            "shape": r["shape"],
            "ms": cell(r, "median_ms"),
            "TFLOP/s": cell(r, "tflops"),
            "% cuBLAS": cell(r, "pct_of_cublas"),
            "ok": r.get("correct"),
        }
        for r in result["rows"]
        if r["shape"] in ("4096x4096x4096", "8192x8192x8192") or not r.get("correct")
    ]
    table += [
        {
            "kernel": "cuBLAS",
            "dtype": r["dtype"],
            "shape": r["shape"],
            "ms": cell(r, "median_ms"),
            "TFLOP/s": cell(r, "tflops"),
            "% cuBLAS": "100",
            "ok": True,
        }
        for r in result["baseline"]
        if r["shape"] in ("4096x4096x4096", "8192x8192x8192")
    ]
    print(markdown_table(table))
    repeats = result.get("repeats", 1)
    if repeats > 1:
        print(
            f"medians of {repeats} repetitions (min-max); % of cuBLAS: median of the "
            "per-repetition ratios"
        )


def run(args: GemmBenchConfig) -> Path:
    """Measure and write <reports-dir>/project01_cuda_kernel/gemm.json (with the environment and
    the GPU's state at the start and the end); returns its path."""
    from shared.cli import writable_dir
    from shared.gpu_state import gpu_state, state_line
    from shared.results import output_root, save_result

    from .._build import require_cuda

    reports_dir = output_root(args.reports_dir)
    writable_dir("--reports-dir", reports_dir / PROJECT)  # before the GPU work, not after
    require_cuda()  # no GPU: one line, before anything else is printed
    start = gpu_state()
    print(f"GPU at start: {state_line(start)}", flush=True)
    result = measure(args)
    config = {
        "sizes": list(args.sizes) if not args.quick else [256, 512],
        "shapes": result.pop("shapes"),
        "kernels": list(args.kernels) if args.kernels else None,
        "half_dtypes": list(args.half_dtypes),
        "fp8_sizes": fp8_sizes_of(args),
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "repeats": args.repeats,
        "tf32": False,
        "timing": "shared.timing.benchmark: median of do_bench repetitions, L2 flushed before "
        "each; repeated --repeats times per shape, cuBLAS and the ladder alternating "
        "(shared.repeat.interleave); figures are medians over repetitions with _min/_max/_reps",
        "correctness": "rel. Frobenius error vs float64 <= 2 x cuBLAS's error + floor",
        "error_floor": ERR_FLOOR,
        "max_flops_per_step": MAX_FLOPS,
    }
    return save_result(
        PROJECT,
        "gemm",
        result,
        baseline="cuBLAS through torch.matmul (TF32 off); for the FP8 step cuBLASLt through "
        "torch._scaled_mm (per-tensor scales, bfloat16 output); same process, same inputs, "
        "alternating with the ladder",
        config=config,
        reports_dir=reports_dir,
        gpu_state_start=start,
    )


def main(args: GemmBenchConfig) -> int:
    """`bench-gemm`: run, then the charts from the record, and a summary table; exit code 1 when
    a kernel failed its correctness check."""
    from shared.gpu_state import state_line
    from shared.results import load_result

    from ..report.gemm import render_charts

    path = run(args)
    print(f"wrote {path}")
    if args.charts:
        for p in render_charts(path):
            print(f"wrote {p}")
    record = load_result(path)
    result = record["results"]
    print_summary(result)
    print(f"GPU at end: {state_line(record['environment'].get('gpu_state', {}).get('end'))}")
    failed = [r for r in result["rows"] if not r.get("correct")]
    if failed:
        print(f"{len(failed)} kernel results FAILED the correctness check (see the table above)")
    return 1 if failed else 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["bench-gemm", *sys.argv[1:]]))
