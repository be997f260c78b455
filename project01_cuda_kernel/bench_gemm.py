"""Benchmark the GEMM ladder against cuBLAS, measured in the same process.

For each shape (square 512..8192 and transformer FFN shapes) and dtype, cuBLAS (torch.matmul,
TF32 off for float32) is timed first, then every ladder kernel that takes the dtype. Every
result is checked against a float64 reference before it is timed: a kernel passes when its
relative error is at most twice cuBLAS's own in the same dtype (plus a small floor).

Reported per kernel and shape: median latency (ms, with p20/p80), TFLOP/s, % of cuBLAS, achieved
bandwidth (GB/s over the minimum bytes: A and B read once, C written once) and the roofline
position against the GPU's datasheet peaks (shared.hardware).

    python -m project01_cuda_kernel.bench gemm                  # the full sweep
    python -m project01_cuda_kernel.bench gemm --quick          # small sizes, a smoke run
    python -m project01_cuda_kernel.bench gemm --help

Writes reports/project01_cuda_kernel/gemm.json and gemm_*.png (and copies them to --out).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

from shared.cli import (
    ArgumentParser,
    main_guard,
    nonempty_path,
    positive_float,
    positive_int,
    writable_dir,
)

PROJECT = "project01_cuda_kernel"
SQUARE_SIZES = (512, 1024, 2048, 4096, 8192)
# (M, N, K) with M = tokens: a 1B-class model's FFN up (d 2048 -> 5632) and down projections.
TRANSFORMER_SHAPES = ((8192, 5632, 2048), (8192, 2048, 5632))
LADDER_SIZE = 4096  # the ladder chart's square size
# Slow early steps are only timed up to this many FLOPs (naive at 8192^3 takes seconds a call).
MAX_FLOPS = {1: 2 * 4096**3, 2: 2 * 4096**3, 3: 2 * 4096**3}
# Error slack where cuBLAS is near exact: float32 gets 2 sqrt(K) 2^-24 (a sequential K-term sum's
# rounding), bfloat16/float16 a fixed floor.
ERR_FLOOR = {"float32": "2*sqrt(K)*2^-24", "bfloat16": 1e-3, "float16": 1e-4}


def err_floor(dtype_name: str, k: int) -> float:
    return 2 * math.sqrt(k) * 2.0**-24 if dtype_name == "float32" else ERR_FLOOR[dtype_name]


DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"shape must be MxNxK, e.g. 8192x5632x2048: {text!r}"
        ) from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"shape sizes must be >= 1: {text!r}")
    return m, n, k


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="python -m project01_cuda_kernel.bench gemm",
        description="Time every GEMM ladder kernel next to cuBLAS (same process), after checking "
        "each result against a float64 reference.",
    )
    p.add_argument("--sizes", type=positive_int, nargs="+", default=list(SQUARE_SIZES),
                   help="square sizes M = N = K")  # fmt: skip
    p.add_argument("--shapes", type=_parse_shape, nargs="*", default=list(TRANSFORMER_SHAPES),
                   help="extra MxNxK shapes (default: transformer FFN shapes)")  # fmt: skip
    p.add_argument("--kernels", nargs="+", default=None, help="ladder kernels (default: all here)")
    p.add_argument("--half-dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"],
                   help="dtypes for the tensor-core kernels")  # fmt: skip
    p.add_argument("--warmup-ms", type=positive_float, default=25.0)
    p.add_argument("--rep-ms", type=positive_float, default=100.0)
    p.add_argument("--quick", action="store_true", help="sizes 256 and 512 only (smoke run)")
    p.add_argument("--reports-dir", type=nonempty_path, default=None,
                   help="default: the repo's reports/")  # fmt: skip
    p.add_argument("--out", type=nonempty_path, default=None,
                   help="also copy the JSON and PNGs here")  # fmt: skip
    p.add_argument("--no-charts", action="store_true")
    return p


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


def run(args) -> dict:
    import torch

    from shared.hardware import detect_gpu
    from shared.progress import progress
    from shared.timing import benchmark

    from . import gemm
    from ._build import require_cuda

    require_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS float32 on CUDA cores, like ours
    torch.backends.cudnn.allow_tf32 = False
    spec = detect_gpu()
    sizes = [256, 512] if args.quick else args.sizes
    shapes = [(s, s, s) for s in sizes] + ([] if args.quick else list(args.shapes))
    kernels = args.kernels or list(gemm.available_kernels())
    half = [getattr(torch, DTYPE_NAMES[d]) for d in args.half_dtypes]
    dtypes = [torch.float32, *half]
    timing_kw = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)

    inputs: dict = {}  # (shape, dtype) -> (a, b, ref, cublas error)
    baseline: list[dict] = []
    t0 = time.perf_counter()
    ladder = [(kernel, dt, shape) for kernel in kernels for dt in gemm.kernel_dtypes(kernel)
              if dt in dtypes for shape in shapes
              if 2 * shape[0] * shape[1] * shape[2] <= MAX_FLOPS.get(gemm.step_of(kernel), float("inf"))]  # fmt: skip
    print(f"cuBLAS baselines: {len(shapes)} shapes x {len(dtypes)} dtypes, then "
          f"{len(ladder)} ladder measurements", flush=True)  # fmt: skip
    with progress(len(shapes) * len(dtypes) + len(ladder), "gemm", unit="measurement",
                  every=max(1, len(ladder) // 10), stream=sys.stdout) as bar:  # fmt: skip
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
                bar.log(f"  cublas {dn:8s} {_shape_label(*shape):>16s} "
                        f"{baseline[-1]['tflops']:8.1f} TFLOP/s")  # fmt: skip
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
                row = {"kind": "ladder", "kernel": kernel, "dtype": dn,
                       "shape": _shape_label(*shape), "m": m, "n": n, "k": k,
                       "correct": False, "error": f"{type(e).__name__}: {e}"}  # fmt: skip
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


def gemm_step(kernel: str) -> int:
    """'sgemm_07_warptiling' -> 7; 0 for anything that is not a ladder kernel."""
    parts = kernel.split("_")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _short_label(r: dict) -> str:
    name = "cuBLAS" if r["kind"] == "cublas" else f"step {gemm_step(r['kernel'])}"
    return f"{name} @{r['m']}"


LADDER_FAMILIES = {  # the ladder chart's bar colours and legend, by dtype
    "float32": "float32 steps (CUDA cores)",
    "bfloat16": "bfloat16 steps (tensor cores)",
}


def make_charts(result: dict, out_dir: Path, footnote: str) -> list[Path]:
    from shared.charts import bar_chart, line_chart, roofline_chart

    rows = [r for r in result["rows"] if r.get("tflops") is not None]
    base = {(r["shape"], r["dtype"]): r for r in result["baseline"]}
    paths = []
    ladder_shape = _shape_label(LADDER_SIZE, LADDER_SIZE, LADDER_SIZE)
    # Ladder: % of cuBLAS in the kernel's own dtype (float32 kernels vs cuBLAS float32, tensor-
    # core kernels vs cuBLAS bfloat16) at 4096^3. The two families are coloured apart: the
    # bfloat16 steps start again below 100% of a much faster cuBLAS, not a regression.
    ladder = [r for r in rows if r["shape"] == ladder_shape and r["dtype"] in LADDER_FAMILIES]
    if ladder:
        labels = [r["kernel"] for r in ladder]
        groups = [LADDER_FAMILIES[r["dtype"]] for r in ladder]
        pct = [r["pct_of_cublas"] for r in ladder]
        paths.append(
            bar_chart(
                out_dir / "gemm_ladder.png",
                labels,
                pct,
                title=f"GEMM ladder at {ladder_shape}: % of cuBLAS in the kernel's own dtype",
                ylabel="% of cuBLAS, same dtype",
                groups=groups,
                bar_labels=[f"{p:.1f}%" for p in pct],
                baseline=100.0,
                baseline_label="cuBLAS in the bar's dtype, same run (100%)",
                footnote=footnote,
            )
        )
        cublas = {
            LADDER_FAMILIES[dt]: (base[(ladder_shape, dt)]["tflops"],
                                  f"cuBLAS {dt}: {base[(ladder_shape, dt)]['tflops']:.3g} TFLOP/s")
            for dt in LADDER_FAMILIES if (ladder_shape, dt) in base
        }  # fmt: skip
        paths.append(
            bar_chart(
                out_dir / "gemm_ladder_tflops.png",
                labels,
                [r["tflops"] for r in ladder],
                title=f"GEMM ladder at {ladder_shape}: TFLOP/s (and % of cuBLAS, same dtype)",
                ylabel="TFLOP/s",
                groups=groups,
                bar_labels=[f"{r['tflops']:.3g} ({r['pct_of_cublas']:.0f}%)" for r in ladder],
                group_baselines=cublas,
                footnote=footnote,
            )
        )
    # TFLOP/s against size for the top kernels and cuBLAS.
    squares = sorted({r["m"] for r in result["baseline"] if r["m"] == r["n"] == r["k"]})
    series = {}
    for name, dt in (("sgemm_07_warptiling", "float32"), ("hgemm_08_mma_sync", "bfloat16"),
                     ("hgemm_09_wgmma_tma", "bfloat16")):  # fmt: skip
        pts = [(r["m"], r["tflops"]) for r in rows
               if r["kernel"] == name and r["dtype"] == dt and r["m"] == r["n"] == r["k"]]  # fmt: skip
        if pts:
            series[f"{name} ({dt})"] = ([p[0] for p in pts], [p[1] for p in pts])
    for dt in ("float32", "bfloat16"):
        pts = [(s, base[(_shape_label(s, s, s), dt)]["tflops"]) for s in squares
               if (_shape_label(s, s, s), dt) in base]  # fmt: skip
        if pts:
            series[f"cuBLAS ({dt})"] = ([p[0] for p in pts], [p[1] for p in pts])
    if series:
        paths.append(
            line_chart(
                out_dir / "gemm_sizes.png",
                series,
                title="Square GEMM: TFLOP/s against size (M = N = K)",
                xlabel="M = N = K",
                ylabel="TFLOP/s",
                logx=True,
                logy=True,
                footnote=footnote,
            )
        )
    spec = result.get("gpu_spec")
    if spec:
        bw = spec["bandwidth_gbs"] * 1e9
        for dt, key in (("bfloat16", "bf16"), ("float32", "fp32")):
            chosen = [
                r
                for r in rows + result["baseline"]
                if r["dtype"] == dt
                and r["m"] == r["n"] == r["k"]
                and r.get("intensity")
                and (r["kind"] == "cublas" or gemm_step(r["kernel"]) >= 7)
            ]
            pts = [(f"{r['m']}", r["intensity"], r["tflops"] * 1e12) for r in chosen]
            if pts:
                paths.append(
                    roofline_chart(
                        out_dir / f"gemm_roofline_{key}.png",
                        pts,
                        groups=[_short_label(r).split(" @")[0] for r in chosen],
                        peak_flops=spec["peak_tflops"][key] * 1e12,
                        peak_bandwidth=bw,
                        title=f"Roofline, {dt}, points labelled M = N = K "
                        f"({spec['key']} datasheet peaks)",
                        footnote=footnote,
                    )
                )
    return paths


def redraw_charts(json_path: str | Path) -> list[Path]:
    """The charts again from a saved gemm.json, next to it (no GPU needed)."""
    from shared.charts import footer
    from shared.results import load_result

    record = load_result(json_path)
    return make_charts(record["results"], Path(json_path).parent, footer(record["environment"]))


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
        {"kernel": "cuBLAS", "dtype": r["dtype"], "shape": r["shape"], "ms": r["median_ms"],
         "TFLOP/s": r["tflops"], "% cuBLAS": 100.0, "ok": True}
        for r in result["baseline"] if r["shape"] in ("4096x4096x4096", "8192x8192x8192")
    ]  # fmt: skip
    print(markdown_table(table, floatfmt=".4g"))


def check_args(args) -> None:
    """Everything about the command line that can be checked before a GPU is needed."""
    from shared.results import REPORTS_DIR

    from . import gemm

    for k in args.kernels or ():
        if k not in gemm.GEMM_KERNELS:
            raise ValueError(f"--kernels: unknown kernel {k!r}; choose from {gemm.GEMM_KERNELS}")
    writable_dir("--reports-dir", Path(args.reports_dir or REPORTS_DIR) / PROJECT)
    if args.out is not None:
        writable_dir("--out", args.out)


@main_guard
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from shared.results import REPORTS_DIR, environment, environment_line, save_result

    check_args(args)
    result = run(args)
    env = environment()
    reports_dir = args.reports_dir or REPORTS_DIR
    config = {
        "sizes": args.sizes if not args.quick else [256, 512],
        "shapes": result.pop("shapes"),
        "half_dtypes": args.half_dtypes,
        "warmup_ms": args.warmup_ms,
        "rep_ms": args.rep_ms,
        "tf32": False,
        "timing": "shared.timing.benchmark: median of do_bench repetitions, L2 flushed before each",
        "correctness": "rel. Frobenius error vs float64 <= 2 x cuBLAS's error + floor",
        "error_floor": ERR_FLOOR,
        "max_flops_per_step": MAX_FLOPS,
    }
    path = save_result(
        PROJECT,
        "gemm",
        result,
        baseline="cuBLAS through torch.matmul (TF32 off), same process, same inputs",
        config=config,
        reports_dir=reports_dir,
        env=env,
    )
    written = [path]
    print(f"wrote {path}")
    if not args.no_charts:
        written += make_charts(result, path.parent, environment_line(env))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for p in written:
            shutil.copy2(p, args.out / p.name)
    print_summary(result)
    failed = [r for r in result["rows"] if not r.get("correct")]
    if failed:
        print(f"{len(failed)} kernel results FAILED the correctness check (see the table above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
