"""`python -m project01_cuda_kernel <command> --help`: benchmark, profile, check, report.

python -m project01_cuda_kernel all                    # benchmarks, ncu profiles, README tables
python -m project01_cuda_kernel all --kernels gemm --reports-dir runs/<time> --no-readme
python -m project01_cuda_kernel bench-gemm --quick     # the ladder against cuBLAS
python -m project01_cuda_kernel bench-attention        # FlashAttention against SDPA's backends
python -m project01_cuda_kernel profile-gemm           # Nsight Compute (needs ncu)
python -m project01_cuda_kernel profile-attention
python -m project01_cuda_kernel compile-check          # no GPU: every .cu for sm_90a, ptxas
python -m project01_cuda_kernel sass-diff --base main  # no GPU: each kernel's SASS, main vs now
python -m project01_cuda_kernel report                 # tables and charts from the JSON alone
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from shared.cli import main_guard, run_subcommand

PROG = "python -m project01_cuda_kernel"
DESCRIPTION = (
    "CUDA C++ kernels for PyTorch, a matmul optimisation ladder and "
    "FlashAttention: benchmarks, Nsight Compute profiles, a compile check and the report."
)
Kernels = Literal["gemm", "attention"]


@dataclass
class AllConfig:
    """Benchmark, profile and report the project01 kernels in one run: bench-<kernels>, then
    profile-<kernels> (skipped with one line when ncu is absent), then report."""

    kernels: tuple[Kernels, ...] = ("gemm", "attention")
    """which kernels, in this order"""
    profile: bool = True
    """Nsight Compute profiles after the benchmarks (--no-profile: benchmark and report only)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: the repository's reports/)"""
    readme: bool = True
    """refresh the README's tables (--no-readme: the results and summary.md only)"""

    def __post_init__(self) -> None:
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("--reports-dir: expected a folder, got an empty path")


def commands() -> dict[str, tuple[type, Callable[..., int]]]:
    """Command name -> (its config class, the function that runs it and returns an exit code)."""
    from . import compile_check, report, sass_diff
    from .bench import attention as bench_attention
    from .bench import gemm as bench_gemm
    from .profile import attention as profile_attention
    from .profile import gemm as profile_gemm

    return {
        "all": (AllConfig, run_all),
        "bench-gemm": (bench_gemm.GemmBenchConfig, bench_gemm.main),
        "bench-attention": (bench_attention.AttentionBenchConfig, bench_attention.main),
        "profile-gemm": (profile_gemm.GemmProfileConfig, profile_gemm.main),
        "profile-attention": (profile_attention.AttentionProfileConfig, profile_attention.main),
        "compile-check": (compile_check.CompileCheckConfig, compile_check.main),
        "sass-diff": (sass_diff.SassDiffConfig, sass_diff.main),
        "report": (report.ReportConfig, report.main),
    }


def run_step(name: str, runner: Callable[..., int], cfg) -> int:
    """One command; a missing GPU, nvcc or CUDA build of torch is one line and exit code 2."""
    from ._build import CudaUnavailableError

    try:
        return int(runner(cfg) or 0)
    except CudaUnavailableError as e:
        print(f"{name}: skipped: {e}")
        return 2


def run_all(cfg: AllConfig) -> int:
    """`all`: every step for the chosen kernels; the exit code is the worst of the steps'."""
    from shared.cli import writable_dir

    from .profile.ncu import find_ncu

    if cfg.reports_dir is not None:
        writable_dir("--reports-dir", cfg.reports_dir)  # before the benchmarks, not after
    table = commands()
    steps = [f"bench-{k}" for k in cfg.kernels]
    if cfg.profile and find_ncu() is None:
        print("profile skipped: ncu (Nsight Compute) was not found.")
    elif cfg.profile:
        steps += [f"profile-{k}" for k in cfg.kernels]
    rc = 0
    for name in steps:
        cls, runner = table[name]
        rc = max(rc, run_step(name, runner, cls(reports_dir=cfg.reports_dir)))
    report_cls, report_main = table["report"]
    report_cfg = report_cls(reports_dir=cfg.reports_dir, readme=cfg.readme)
    return max(rc, run_step("report", report_main, report_cfg))


@main_guard
def main(argv: list[str] | None = None) -> int:
    return run_subcommand(
        commands(), prog=PROG, description=DESCRIPTION, argv=argv, runner=run_step
    )


if __name__ == "__main__":
    sys.exit(main())
