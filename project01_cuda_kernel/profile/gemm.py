"""Nsight Compute figures for the GEMM ladder and cuBLAS at one square size.

A child process (`worker`, under ncu) runs cuBLAS float32, the float32 ladder, cuBLAS
bfloat16 and the tensor-core ladder once each inside an NVTX range named `profile` (after one
warm-up call outside it); `ncu --clock-control none` profiles exactly those launches. Per kernel:
theoretical and achieved occupancy, what limits the resident blocks per SM (registers, shared
memory, block size), DRAM and SM throughput (% of peak), registers, shared memory, duration.

    python -m project01_cuda_kernel profile-gemm [--size 4096]

Writes <reports-dir>/project01_cuda_kernel/profile_gemm.json (through `profile.ncu`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from project01_cuda_kernel import PROJECT

from ..bench.gemm import GemmKernel
from . import ncu as ncu_tool

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


@dataclass
class GemmProfileConfig:
    """Nsight Compute (--clock-control none) over every GEMM ladder kernel and cuBLAS at one
    square size: occupancy and what limits it, DRAM and SM throughput."""

    size: int = 4096
    """M = N = K"""
    kernels: tuple[GemmKernel, ...] | None = None
    """ladder kernels (None: every one that runs on this GPU)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: a new runs/<UTC time>/; reports/ only when named)"""

    def __post_init__(self) -> None:
        from ..gemm import GEMM_KERNELS

        if self.size < 1:
            raise ValueError(f"--size: expected an integer >= 1, got {self.size}")
        unknown = [k for k in self.kernels or () if k not in GEMM_KERNELS]
        if unknown:
            raise ValueError(f"--kernels: unknown kernels {unknown}; choose from {GEMM_KERNELS}")
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("--reports-dir: expected a folder, got an empty path")


def worker(size: int, kernels: list[str]) -> None:
    """The profiled process: each kernel once inside the NVTX range 'profile'."""
    import torch

    from .. import gemm

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


def run(cfg: GemmProfileConfig) -> Path:
    """Profile and write <reports-dir>/project01_cuda_kernel/profile_gemm.json; returns its
    path. Raises NcuError when ncu is missing or fails."""
    from shared.cli import writable_dir
    from shared.results import output_root, save_result

    from .. import gemm
    from .._build import require_cuda

    reports_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", reports_dir / PROJECT)
    require_cuda()
    if ncu_tool.find_ncu() is None:
        raise ncu_tool.NcuError("ncu (Nsight Compute) was not found: nothing profiled.")
    kernels = list(cfg.kernels or gemm.available_kernels())
    gemm._ext()  # build the extension here, so the profiled child only loads it
    child = [
        sys.executable,
        "-c",
        f"from {__name__} import worker; worker({cfg.size}, {kernels!r})",
    ]
    t0 = time.perf_counter()
    rows = label_rows(ncu_tool.profile_command(child, nvtx_include="profile/"), kernels)
    return save_result(
        PROJECT,
        "profile_gemm",
        rows,
        baseline="cuBLAS (torch.matmul, TF32 off) profiled in the same process",
        config={
            "size": cfg.size,
            "tool": "ncu --clock-control none --csv --page raw",
            "metrics": ncu_tool.OCCUPANCY_METRICS,
            "seconds": round(time.perf_counter() - t0, 1),
        },
        reports_dir=reports_dir,
    )


def main(cfg: GemmProfileConfig) -> int:
    """`profile-gemm`: run, then print the table the README shows."""
    from shared.results import load_result, markdown_table

    from ..report.gemm import profile_rows

    try:
        path = run(cfg)
    except ncu_tool.NcuError as e:
        print(f"gemm profile: {e}")
        return 1
    print(markdown_table(profile_rows(load_result(path)["results"]), floatfmt=".3g"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["profile-gemm", *sys.argv[1:]]))
