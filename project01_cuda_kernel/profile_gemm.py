"""Nsight Compute figures for the GEMM ladder and cuBLAS at one square size.

A child process (this module with --worker) runs cuBLAS float32, the float32 ladder, cuBLAS
bfloat16 and the tensor-core ladder once each inside an NVTX range named `profile` (after one
warm-up call outside it); `ncu --clock-control none` profiles exactly those launches. Per kernel:
theoretical and achieved occupancy, what limits the resident blocks per SM (registers, shared
memory, block size), DRAM and SM throughput (% of peak), registers, shared memory, duration.

    python -m project01_cuda_kernel.profile gemm [--size 4096]

Writes reports/project01_cuda_kernel/profile_gemm.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from shared.cli import main_guard

PROJECT = "project01_cuda_kernel"
# __global__ function name of each ladder step (what ncu reports).
KERNEL_FUNCTIONS = {
    "sgemm_01_naive": "sgemm_naive_kernel",
    "sgemm_02_coalesced": "sgemm_coalesced_kernel",
    "sgemm_03_smem_tiling": "sgemm_smem_kernel",
    "sgemm_04_1d_blocktiling": "sgemm_1d_kernel",
    "sgemm_05_2d_blocktiling": "sgemm_2d_kernel",
    "sgemm_06_vectorized": "sgemm_vec_kernel",
    "sgemm_07_warptiling": "sgemm_warptile_kernel",
    "hgemm_08_mma_sync": "hgemm_mma_kernel",
    "hgemm_09_wgmma_tma": "hgemm_wgmma_kernel",
}


def worker(size: int, kernels: list[str]) -> None:
    """The profiled process: each kernel once inside the NVTX range 'profile'."""
    import torch

    from . import gemm

    torch.backends.cuda.matmul.allow_tf32 = False
    plan = [("cublas", torch.float32)]
    plan += [(k, torch.float32) for k in kernels if k in gemm.FLOAT32_KERNELS]
    plan += [("cublas", torch.bfloat16)]
    plan += [(k, torch.bfloat16) for k in kernels if k in gemm.TENSOR_CORE_KERNELS]
    data = {}
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(size, size, device="cuda").to(dt)
        b = torch.randn(size, size, device="cuda").to(dt)
        data[dt] = (a, b, torch.empty(size, size, device="cuda", dtype=dt))
    for name, dt in plan:
        a, b, out = data[dt]
        if name == "cublas":
            fn = lambda a=a, b=b, out=out: torch.matmul(a, b, out=out)  # noqa: E731
        else:
            fn = lambda a=a, b=b, out=out, name=name: gemm.matmul(a, b, kernel=name, out=out)  # noqa: E731
        fn()  # warm-up (and the one-time build/attribute calls) outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("profile")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def label_rows(rows: list[dict], kernels: list[str]) -> list[dict]:
    """Name each profiled launch: a ladder kernel by its function name, anything else as cuBLAS
    (float32 before the first float32 ladder kernel's launch... in plan order, see worker)."""
    by_function = {KERNEL_FUNCTIONS[k]: k for k in kernels}
    seen_fp32_ladder = False
    out = []
    for r in rows:
        name = next((k for f, k in by_function.items() if f in r["kernel"]), None)
        if name is not None:
            seen_fp32_ladder = seen_fp32_ladder or name.startswith("sgemm_")
            r = r | {"label": name, "dtype": "float32" if name.startswith("sgemm_") else "bfloat16"}
        else:
            dt = "bfloat16" if seen_fp32_ladder else "float32"
            r = r | {"label": f"cuBLAS {dt}", "dtype": dt}
        out.append(r)
    return out


def short_name(kernel: str) -> str:
    """'void <unnamed>::hgemm_mma_kernel<__nv_bfloat16, true>(const T *, ...)' ->
    'hgemm_mma_kernel<__nv_bfloat16, true>' (the function and template arguments only)."""
    name = (
        kernel.removeprefix("void ")
        .replace("<unnamed>::", "")
        .replace("(anonymous namespace)::", "")
    )
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += {"<": 1, ">": -1}.get(ch, 0)
        out.append(ch)
    return "".join(out)[:60]


def summary_rows(rows: list[dict]) -> list[dict]:
    def num(v):
        return v if isinstance(v, float) else None

    def whole(v):
        return int(v) if isinstance(v, float) else None

    return [
        {
            "kernel": r["label"],
            "CUDA kernel": f"`{short_name(r['kernel'])}`",
            "regs": whole(r.get("registers_per_thread")),
            "smem KiB": ((r.get("static_smem_bytes") or 0) + (r.get("dynamic_smem_bytes") or 0))
            / 1024,
            "block": whole(r.get("block_size_threads")),
            "theor. occ. %": num(r.get("theoretical_occupancy_pct")),
            "achieved occ. %": num(r.get("achieved_occupancy_pct")),
            "limited by": r.get("occupancy_limiter"),
            "DRAM %": num(r.get("dram_throughput_pct")),
            "SM %": num(r.get("sm_throughput_pct")),
            "time (us)": whole(r["duration_ns"] / 1e3)
            if isinstance(r.get("duration_ns"), float)
            else None,
        }
        for r in rows
    ]


@main_guard
def main(argv: list[str] | None = None) -> int:
    from shared.cli import ArgumentParser, nonempty_path, positive_int, writable_dir

    p = ArgumentParser(
        prog="python -m project01_cuda_kernel.profile gemm",
        description="Nsight Compute (--clock-control none) over every GEMM ladder kernel and "
        "cuBLAS: occupancy and its limiter, DRAM and SM throughput.",
    )
    p.add_argument("--size", type=positive_int, default=4096, help="M = N = K (default 4096)")
    p.add_argument("--kernels", nargs="+", default=None, help="default: all that run here")
    p.add_argument("--reports-dir", type=nonempty_path, default=None)
    p.add_argument("--out", type=nonempty_path, default=None, help="also copy the JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.size < 1:
        p.error("--size must be >= 1")

    from . import gemm

    kernels = args.kernels or list(gemm.available_kernels())
    unknown = [k for k in kernels if k not in gemm.GEMM_KERNELS]
    if unknown:
        p.error(f"unknown kernels {unknown}; choose from {gemm.GEMM_KERNELS}")
    if args.worker:
        worker(args.size, kernels)
        return 0
    from shared.results import REPORTS_DIR

    writable_dir("--reports-dir", Path(args.reports_dir or REPORTS_DIR) / PROJECT)
    if args.out is not None:
        writable_dir("--out", args.out)

    from . import ncu
    from ._build import require_cuda

    require_cuda()
    if ncu.find_ncu() is None:
        print("gemm profile skipped: ncu (Nsight Compute) was not found.")
        return 0
    # Build the extension once here, so the profiled child only loads it.
    gemm._ext()
    cmd = [sys.executable, "-m", "project01_cuda_kernel.profile_gemm", "--worker",
           "--size", str(args.size), "--kernels", *kernels]  # fmt: skip
    t0 = time.perf_counter()
    try:
        rows = ncu.profile_command(cmd, nvtx_include="profile/")
    except ncu.NcuError as e:
        print(f"gemm profile failed: {e}")
        return 1
    rows = label_rows(rows, kernels)

    from shared.results import markdown_table, save_result

    path = save_result(
        PROJECT,
        "profile_gemm",
        rows,
        baseline="cuBLAS (torch.matmul, TF32 off) profiled in the same process",
        config={
            "size": args.size,
            "tool": "ncu --clock-control none --csv --page raw",
            "metrics": ncu.OCCUPANCY_METRICS,
            "seconds": round(time.perf_counter() - t0, 1),
        },
        reports_dir=args.reports_dir,
    )
    print(markdown_table(summary_rows(rows), floatfmt=".3g"))
    print(f"wrote {path}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, args.out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
