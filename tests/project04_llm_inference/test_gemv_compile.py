"""CPU tier (needs nvcc, no GPU): csrc/gemv.cu compiles for sm_90a (the H200), sm_89 (the first
with e4m3 conversions) and sm_80 (the oldest target of bf16 mma.sync) with the extension build's
device flags, and no kernel spills registers: the SIMT kernel for one and two tokens (16-bit
and FP8 weights) and the tensor-core kernel for three to eight, for both dtypes and every fold. On sm_80 the FP8 instantiations
compile to a trap (no e4m3 conversion instruction before sm_89; the caller never launches them
there), so the build for an older GPU still succeeds."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from shared.cuda_build import find_nvcc

CSRC = Path(__file__).resolve().parents[2] / "project04_llm_inference" / "csrc"
FLAGS = ("-std=c++17", "-O3", "--use_fast_math", "-lineinfo")  # shared.cuda_build's, less torch

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def ptxas_report(text: str) -> dict[str, dict[str, int]]:
    """Mangled kernel name -> registers, stack frame and spill bytes, from `-Xptxas -v`."""
    kernels, name = {}, None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            name = m.group(1)
            kernels[name] = {"registers": 0, "frame": 0, "spill_stores": 0, "spill_loads": 0}
        elif name and (m := _SPILL.search(line)):
            kernels[name].update(
                frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
        elif name and (m := _USED.search(line)):
            kernels[name]["registers"] = int(m.group(1))
    return kernels


def test_the_report_parser_reads_registers_and_spills():
    text = """\
ptxas info    : Compiling entry function '_Z1av' for 'sm_90a'
ptxas info    : Function properties for _Z1av
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 33280 bytes smem
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90a'
ptxas info    : Function properties for _Z1bv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""
    assert ptxas_report(text) == {
        "_Z1av": {"registers": 255, "frame": 16, "spill_stores": 8, "spill_loads": 12},
        "_Z1bv": {"registers": 32, "frame": 0, "spill_stores": 0, "spill_loads": 0},
    }


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found: CUDA toolkit absent")
@pytest.mark.slow  # ~20 s per architecture on two cores
@pytest.mark.parametrize("arch", ["90a", "89", "80"])  # 89: Ada, the first with e4m3
def test_gemv_compiles_without_spills(arch, tmp_path):
    cmd = [find_nvcc(), *FLAGS, f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v"]
    cmd += [f"-I{CSRC}", "-c", str(CSRC / "gemv.cu"), "-o", str(tmp_path / "gemv.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kernels = ptxas_report(proc.stdout + proc.stderr)
    simt = {n: k for n, k in kernels.items() if "11gemv_kernel" in n}
    fp8 = {n: k for n, k in simt.items() if "13__nv_fp8_e4m3" in n}
    mma = {n: k for n, k in kernels.items() if "15gemv_mma_kernel" in n}
    # 2 activation dtypes x 2 row counts x 7 (norm, residual, epilogue) variants, each with
    # 16-bit and with FP8 weights
    assert len(simt) == 56 and len(fp8) == 28
    assert len(mma) == 14  # 2 dtypes x 7 variants (16-bit weights only)
    spilled = {n: k for n, k in kernels.items() if k["spill_stores"] or k["spill_loads"]}
    assert not spilled
    # __launch_bounds__(256, 2): two CTAs of the tensor-core kernel fit an SM's registers
    assert all(0 < k["registers"] <= 128 for k in mma.values()), mma
