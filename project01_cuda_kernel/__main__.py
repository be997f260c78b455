"""`python -m project01_cuda_kernel [gemm|attention|all]`: benchmark, then profile (skipped with
one line when ncu is absent), then regenerate the README's tables from the results."""

from __future__ import annotations

import argparse
import sys

from . import bench, profile, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m project01_cuda_kernel",
        description="Benchmark, profile (Nsight Compute) and report the project01 kernels.",
    )
    p.add_argument("which", nargs="?", default="all", choices=("gemm", "attention", "all"))
    p.add_argument("--skip-profile", action="store_true", help="benchmark and report only")
    args = p.parse_args(argv)
    rc = bench.main([args.which])
    if not args.skip_profile:
        from .ncu import find_ncu

        if find_ncu() is None:
            print("profile skipped: ncu (Nsight Compute) was not found.")
        else:
            rc = max(rc, profile.main([args.which]))
    rc = max(rc, report.main([]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
