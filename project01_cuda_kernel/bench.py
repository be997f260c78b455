"""Benchmarks of project01: `python -m project01_cuda_kernel.bench gemm|attention|all [options]`.

- gemm: the matmul ladder against cuBLAS (bench_gemm.py; `... bench gemm --help`).
- attention: FlashAttention forward/backward against SDPA's backends (bench_attention.py).
Results go to reports/project01_cuda_kernel/ as JSON and PNG.

`dispatch` is also the command line of profile.py: each side is a module with `main(argv) -> int`,
imported only when asked for; a missing module or GPU is reported in one line.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from shared.cli import ArgumentParser, main_guard

from ._build import CudaUnavailableError

SIDES = ("gemm", "attention")


def run_side(side: str, module: str, argv: list[str]) -> int:
    name = f"{__package__}.{module}"
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        print(f"{side}: not available ({name} is missing from this checkout); skipped.")
        return 0
    try:
        return int(mod.main(argv) or 0)
    except CudaUnavailableError as e:
        print(f"{side}: skipped: {e}")
        return 2


def dispatch(verb: str, modules: dict[str, str], argv: list[str] | None) -> int:
    p = ArgumentParser(
        prog=f"python -m project01_cuda_kernel.{verb}",
        description=f"{verb} the project01 kernels: `gemm`, `attention` or `all` (both, in that "
        f"order). Options after the choice go to that side's own command line (see "
        f"`python -m project01_cuda_kernel.{verb} gemm --help`); with `all`, use only options "
        f"both sides take (e.g. --reports-dir).",
    )
    p.add_argument("which", choices=(*SIDES, "all"))
    p.add_argument("args", nargs=argparse.REMAINDER, help="options for that side")
    ns = p.parse_args(sys.argv[1:] if argv is None else argv)
    sides = SIDES if ns.which == "all" else (ns.which,)
    rc = 0
    for side in sides:
        rc = max(rc, run_side(side, modules[side], list(ns.args)))
    return rc


MODULES = {"gemm": "bench_gemm", "attention": "bench_attention"}


@main_guard
def main(argv: list[str] | None = None) -> int:
    return dispatch("bench", MODULES, argv)


if __name__ == "__main__":
    sys.exit(main())
