"""Nsight Compute profiles of project01: `python -m project01_cuda_kernel.profile
gemm|attention|all [options]`.

- gemm: occupancy (theoretical, achieved, and what limits it), DRAM and SM throughput of every
  ladder kernel and of cuBLAS (profile_gemm.py; `... profile gemm --help`).
- attention: the same figures for the FlashAttention kernels (profile_attention.py).
Needs `ncu` (clocks left alone: --clock-control none); without it, says so in one line.
"""

from __future__ import annotations

import sys

from shared.cli import main_guard

from .bench import dispatch

MODULES = {"gemm": "profile_gemm", "attention": "profile_attention"}


@main_guard
def main(argv: list[str] | None = None) -> int:
    return dispatch("profile", MODULES, argv)


if __name__ == "__main__":
    sys.exit(main())
