"""Benchmark the GEMM ladder against cuBLAS, measured in the same process.

For each shape (square 512..8192 and transformer FFN shapes) and dtype, cuBLAS (torch.matmul,
TF32 off for float32) is timed first, then every ladder kernel that takes the dtype. Every
result is checked against a float64 reference before it is timed: a kernel passes when its
relative error is at most twice cuBLAS's own in the same dtype (plus a small floor).

Reported per kernel and shape: median latency (ms, with p20/p80), TFLOP/s, % of cuBLAS, achieved
bandwidth (GB/s over the minimum bytes: A and B read once, C written once) and the roofline
position against the GPU's datasheet peaks (shared.hardware).

    python -m project01_cuda_kernel bench-gemm                  # the full sweep
    python -m project01_cuda_kernel bench-gemm --quick          # small sizes, a smoke run

Writes <reports-dir>/project01_cuda_kernel/gemm.json; the charts gemm_*.png are drawn from it
(report.gemm).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..gemm import GEMM_KERNELS

PROJECT = "project01_cuda_kernel"
SQUARE_SIZES = (512, 1024, 2048, 4096, 8192)
# (M, N, K) with M = tokens: a 1B-class model's FFN up (d 2048 -> 5632) and down projections.
TRANSFORMER_SHAPES = ((8192, 5632, 2048), (8192, 2048, 5632))
# Slow early steps are only timed up to this many FLOPs (naive at 8192^3 takes seconds a call).
MAX_FLOPS = {1: 2 * 4096**3, 2: 2 * 4096**3, 3: 2 * 4096**3}
# Error slack where cuBLAS is near exact: float32 gets 2 sqrt(K) 2^-24 (a sequential K-term sum's
# rounding), bfloat16/float16 a fixed floor.
ERR_FLOOR = {"float32": "2*sqrt(K)*2^-24", "bfloat16": 1e-3, "float16": 1e-4}


def err_floor(dtype_name: str, k: int) -> float:
    return 2 * math.sqrt(k) * 2.0**-24 if dtype_name == "float32" else ERR_FLOOR[dtype_name]


DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GemmKernel = Literal[GEMM_KERNELS]  # the ladder's kernel names, as command-line choices


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
    warmup_ms: float = 25.0
    """warm-up time before each measurement, ms"""
    rep_ms: float = 100.0
    """time spent on the timed repetitions of each measurement, ms"""
    quick: bool = False
    """sizes 256 and 512 only (a smoke run)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: the repository's reports/)"""
    charts: bool = True
    """draw the charts from the record once it is written"""

    def __post_init__(self) -> None:
        for s in self.sizes:
            if s < 1:
                raise ValueError(f"--sizes: expected integers >= 1, got {s}")
        self.shape_list()
        for k in self.kernels or ():
            if k not in GEMM_KERNELS:
                raise ValueError(f"--kernels: unknown kernel {k!r}; choose from {GEMM_KERNELS}")
        for name in ("warmup_ms", "rep_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag}: expected a finite number > 0, got {v}")
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


def _row(kind, kernel, dtype_name, shape, timing, err, torch_err, spec, tdtype):
    from shared.flops import dtype_bytes, matmul_bytes, matmul_flops
    from shared.roofline import roofline

    m, n, k = shape
    flops = matmul_flops(m, n, k)
    nbytes = matmul_bytes(m, n, k, dtype_bytes(tdtype))
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
    if timing is not None:
        row.update(
            median_ms=timing.median_ms,
            p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms,
            n_timed=timing.n,
            timing_method=timing.method,
            tflops=timing.tflops(flops),
            gbps=timing.gbps(nbytes),
        )
        if spec is not None:
            rp = roofline(flops, nbytes, spec.peak_flops(tdtype), spec.bandwidth())
            row.update(
                intensity=rp.intensity,
                bound=rp.bound,
                attainable_tflops=rp.attainable_flops / 1e12,
                pct_of_roof=100 * rp.fraction_of_roof(flops / (timing.median_ms * 1e-3)),
            )
    return row


def measure(args: GemmBenchConfig) -> dict:
    """cuBLAS and every ladder kernel at every shape and dtype of `args`, on this GPU: the
    record's results."""
    import torch

    from shared.hardware import detect_gpu
    from shared.progress import progress
    from shared.timing import benchmark

    from .. import gemm
    from .._build import require_cuda

    require_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS float32 on CUDA cores, like ours
    torch.backends.cudnn.allow_tf32 = False
    spec = detect_gpu()
    sizes = [256, 512] if args.quick else args.sizes
    shapes = [(s, s, s) for s in sizes] + ([] if args.quick else args.shape_list())
    kernels = args.kernels or list(gemm.available_kernels())
    half = [getattr(torch, DTYPE_NAMES[d]) for d in args.half_dtypes]
    dtypes = [torch.float32, *half]
    timing_kw = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)

    inputs: dict = {}  # (shape, dtype) -> (a, b, ref, cublas error)
    baseline: list[dict] = []
    t0 = time.perf_counter()
    ladder = [
        (kernel, dt, shape)
        for kernel in kernels
        for dt in gemm.kernel_dtypes(kernel)
        if dt in dtypes
        for shape in shapes
        if 2 * shape[0] * shape[1] * shape[2] <= MAX_FLOPS.get(gemm.step_of(kernel), float("inf"))
    ]
    print(
        f"cuBLAS baselines: {len(shapes)} shapes x {len(dtypes)} dtypes, then "
        f"{len(ladder)} ladder measurements",
        flush=True,
    )
    with progress(
        len(shapes) * len(dtypes) + len(ladder),
        "gemm",
        unit="measurement",
        every=max(1, len(ladder) // 10),
        stream=sys.stdout,
    ) as bar:
        for shape in shapes:
            m, n, k = shape
            for dt in dtypes:
                gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k * 17)
                a = torch.randn(m, k, device="cuda", generator=gen).to(dt)
                b = torch.randn(k, n, device="cuda", generator=gen).to(dt)
                ref = a.double() @ b.double()
                c = a @ b
                err = _rel_err(c, ref)
                inputs[(shape, dt)] = (a, b, ref, err)
                timing = benchmark(lambda a=a, b=b: torch.matmul(a, b), **timing_kw)
                dn = str(dt).removeprefix("torch.")
                baseline.append(_row("cublas", "cublas", dn, shape, timing, err, err, spec, dt))
                bar.log(
                    f"  cublas {dn:8s} {_shape_label(*shape):>16s} "
                    f"{baseline[-1]['tflops']:8.1f} TFLOP/s"
                )
                bar.advance(status=f"cuBLAS {dn} {_shape_label(*shape)}")

        cublas = {(r["shape"], r["dtype"]): r for r in baseline}
        rows: list[dict] = []
        # Kernel by kernel (ladder order), so a kernel that faults cannot poison earlier results.
        for kernel, dt, shape in ladder:
            dn = str(dt).removeprefix("torch.")
            m, n, k = shape
            a, b, ref, cublas_err = inputs[(shape, dt)]
            try:
                out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
                gemm.matmul(a, b, kernel=kernel, out=out)
                err = _rel_err(out, ref) if torch.isfinite(out).all() else float("inf")
                timing = None
                if err <= 2 * cublas_err + err_floor(dn, k):
                    timing = benchmark(
                        lambda a=a, b=b, out=out, kernel=kernel: gemm.matmul(
                            a, b, kernel=kernel, out=out
                        ),
                        **timing_kw,
                    )
                row = _row("ladder", kernel, dn, shape, timing, err, cublas_err, spec, dt)
            except Exception as e:  # record and go on: the report shows the failure
                row = {
                    "kind": "ladder",
                    "kernel": kernel,
                    "dtype": dn,
                    "shape": _shape_label(*shape),
                    "m": m,
                    "n": n,
                    "k": k,
                    "correct": False,
                    "error": f"{type(e).__name__}: {e}",
                }
            base = cublas[(row["shape"], dn)]
            if row.get("tflops") is not None:
                row["pct_of_cublas"] = 100 * row["tflops"] / base["tflops"]
            rows.append(row)
            status = (
                f"{row['tflops']:8.2f} TFLOP/s {row['pct_of_cublas']:6.1f}% of cuBLAS"
                if row.get("tflops") is not None
                else f"FAILED CHECK rel_err={row.get('rel_err')} {row.get('error', '')}"
            )
            bar.log(f"  {kernel:24s} {dn:8s} {row['shape']:>16s} {status}")
            bar.advance(status=f"{kernel} {dn} {row['shape']}")
    return {
        "rows": rows,
        "baseline": baseline,
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

    table = [
        {
            "kernel": r["kernel"],
            "dtype": r["dtype"],
            "shape": r["shape"],
            "ms": r.get("median_ms"),
            "TFLOP/s": r.get("tflops"),
            "% cuBLAS": r.get("pct_of_cublas"),
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
            "ms": r["median_ms"],
            "TFLOP/s": r["tflops"],
            "% cuBLAS": 100.0,
            "ok": True,
        }
        for r in result["baseline"]
        if r["shape"] in ("4096x4096x4096", "8192x8192x8192")
    ]
    print(markdown_table(table, floatfmt=".4g"))


def run(args: GemmBenchConfig) -> Path:
    """Measure and write <reports-dir>/project01_cuda_kernel/gemm.json (with the environment);
    returns its path."""
    from shared.cli import writable_dir
    from shared.results import REPORTS_DIR, save_result

    reports_dir = Path(args.reports_dir) if args.reports_dir is not None else REPORTS_DIR
    writable_dir("--reports-dir", reports_dir / PROJECT)  # before the GPU work, not after
    result = measure(args)
    config = {
        "sizes": list(args.sizes) if not args.quick else [256, 512],
        "shapes": result.pop("shapes"),
        "half_dtypes": list(args.half_dtypes),
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "tf32": False,
        "timing": "shared.timing.benchmark: median of do_bench repetitions, L2 flushed before each",
        "correctness": "rel. Frobenius error vs float64 <= 2 x cuBLAS's error + floor",
        "error_floor": ERR_FLOOR,
        "max_flops_per_step": MAX_FLOPS,
    }
    return save_result(
        PROJECT,
        "gemm",
        result,
        baseline="cuBLAS through torch.matmul (TF32 off), same process, same inputs",
        config=config,
        reports_dir=reports_dir,
    )


def main(args: GemmBenchConfig) -> int:
    """`bench-gemm`: run, then the charts from the record, and a summary table; exit code 1 when
    a kernel failed its correctness check."""
    from shared.results import load_result

    from ..report.gemm import render_charts

    path = run(args)
    print(f"wrote {path}")
    if args.charts:
        for p in render_charts(path):
            print(f"wrote {p}")
    result = load_result(path)["results"]
    print_summary(result)
    failed = [r for r in result["rows"] if not r.get("correct")]
    if failed:
        print(f"{len(failed)} kernel results FAILED the correctness check (see the table above)")
    return 1 if failed else 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["bench-gemm", *sys.argv[1:]]))
