"""`python -m project01_cuda_kernel [gemm|attention|all]`: benchmark, then profile (skipped with
one line when ncu is absent), then regenerate the README's tables from the results.

`--reports-dir DIR` sends every result to DIR/project01_cuda_kernel/ (default: the repo's
reports/); `--no-readme` leaves the README alone (`make demo` passes both: a run folder)."""

from __future__ import annotations

import sys

from shared.cli import ArgumentParser, main_guard, writable_dir

from . import bench, profile, report


@main_guard
def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m project01_cuda_kernel",
        description="Benchmark, profile (Nsight Compute) and report the project01 kernels.",
    )
    p.add_argument("which", nargs="?", default="all", choices=("gemm", "attention", "all"))
    p.add_argument("--skip-profile", action="store_true", help="benchmark and report only")
    p.add_argument("--reports-dir", default=None,
                   help="results go to <dir>/project01_cuda_kernel/ (default: the repo's reports/)")  # fmt: skip
    p.add_argument("--no-readme", action="store_true",
                   help="write the results and summary.md only; leave the README alone")  # fmt: skip
    args = p.parse_args(argv)
    if args.reports_dir is not None and not args.reports_dir.strip():
        p.error("--reports-dir: expected a folder, got an empty path")
    if args.reports_dir is not None:
        writable_dir("--reports-dir", args.reports_dir)  # before the benchmarks, not after
    out = ["--reports-dir", args.reports_dir] if args.reports_dir is not None else []
    rc = bench.main([args.which, *out])
    if not args.skip_profile:
        from .ncu import find_ncu

        if find_ncu() is None:
            print("profile skipped: ncu (Nsight Compute) was not found.")
        else:
            rc = max(rc, profile.main([args.which, *out]))
    rc = max(rc, report.main([*out, *(["--no-readme"] if args.no_readme else [])]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
