"""CPU tier: every CUDA source compiles for sm_90a, and the no-spill rule holds (needs nvcc, no
GPU). The ptxas-report parser is checked on a recorded report, so it runs even without nvcc."""

from __future__ import annotations

import json

import pytest

from project01_cuda_kernel import compile_check as cc
from project01_cuda_kernel import gemm

RECORDED = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90a'
ptxas info    : Function properties for _Z6kernelPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 33280 bytes smem
ptxas info    : Compiling entry function '_Z5otherv' for 'sm_90a'
ptxas info    : Function properties for _Z5otherv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""

NEEDS_NVCC = pytest.mark.skipif(
    cc.find_nvcc() is None, reason="nvcc not found: CUDA toolkit absent"
)


def test_parse_recorded_ptxas_report():
    ks = {k.mangled: k for k in cc.parse_ptxas(RECORDED)}
    assert set(ks) == {"_Z6kernelPf", "_Z5otherv"}
    k = ks["_Z6kernelPf"]
    assert (k.registers, k.smem_bytes, k.stack_frame_bytes) == (255, 33280, 16)
    assert (k.spill_store_bytes, k.spill_load_bytes, k.spills) == (8, 12, True)
    o = ks["_Z5otherv"]
    assert (o.registers, o.smem_bytes, o.spills) == (32, 0, False)


def test_spills_fail_only_in_files_marked_no_spill():
    kernels = cc.parse_ptxas(RECORDED)
    marked = cc.FileResult("gemm/x.cu", ok=True, no_spill=True, seconds=0.0, kernels=kernels)
    unmarked = cc.FileResult("gemm/y.cu", ok=True, no_spill=False, seconds=0.0, kernels=kernels)
    assert len(marked.failures) == 1 and "spills (8 B stored, 12 B loaded)" in marked.failures[0]
    assert unmarked.failures == []
    broken = cc.FileResult("gemm/z.cu", ok=False, no_spill=False, seconds=0.0, errors=["boom"])
    assert broken.failures == ["gemm/z.cu: compile error: boom"]


def test_top_ladder_kernels_carry_the_no_spill_marker():
    for name in (
        "sgemm_06_vectorized",
        "sgemm_07_warptiling",
        *gemm.TENSOR_CORE_KERNELS,
        "fp8gemm_10_wgmma_tma",
    ):
        text = (cc.CSRC / "gemm" / f"{name}.cu").read_text()
        assert cc.NO_SPILL_MARKER in text, name


def test_kernel_sources_include_no_torch_headers():
    """Kernel files must compile with plain nvcc in seconds: torch headers only in bindings."""
    for path in cc.sources():
        assert "torch/" not in path.read_text(), path


@NEEDS_NVCC
def test_a_compile_error_fails(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* x) { x[0] = undefined_name; }\n")
    (r,) = cc.run([bad], jobs=1)
    assert not r.ok and r.failures and "undefined_name" in " ".join(r.errors)


@NEEDS_NVCC
@pytest.mark.slow
def test_every_source_compiles_for_sm90a_without_spills_in_top_kernels(tmp_path):
    rc = cc.main(cc.CompileCheckConfig(reports_dir=str(tmp_path)))
    record = json.loads((tmp_path / "project01_cuda_kernel" / "compile.json").read_text())
    files = {r["file"]: r for r in record["results"]}
    assert rc == 0, [r["errors"] or r["kernels"] for r in record["results"] if not r["ok"]]
    assert set(files) == {p.relative_to(cc.CSRC).as_posix() for p in cc.sources()}
    for name in gemm.GEMM_KERNELS:
        r = files[f"gemm/{name}.cu"]
        assert r["ok"] and r["kernels"], name
        for k in r["kernels"]:
            assert k["registers"] > 0
            if r["no_spill"]:
                assert not k["spills"], (name, k)
    assert record["config"]["arch"] == "sm_90a"


HOPPER_BWD_SOURCES = [cc.CSRC / "attention" / f"flash_bwd_hopper_hdim{d}.cu" for d in (64, 128)]


@NEEDS_NVCC
def test_hopper_backward_compiles_for_sm90a_without_spills():
    """The Hopper backward (about 6-10 s per file on 2 cores): both dtypes' main kernels and the
    pre-pass, no spill (the files carry the no-spill marker). ptxas reports the launch bound,
    168 registers for 384 threads; setmaxnreg then gives the consumers 240."""
    results = cc.run(HOPPER_BWD_SOURCES, jobs=2)
    for r in results:
        assert r.ok and r.no_spill, (r.file, r.errors)
        assert not r.failures, r.failures
        mains = [k for k in r.kernels if "flash_bwd_hopper_kernel" in k.kernel]
        # bf16 and fp16, each with dQ by TMA reduce-adds (default) and by atomics (A/B form)
        assert len(mains) == 4, [k.kernel for k in r.kernels]
        for k in r.kernels:
            assert not k.spills and k.stack_frame_bytes == 0, (r.file, k)
        for k in mains:
            assert k.registers <= 168, (r.file, k)  # 65536 / 384 threads, rounded to 8
        assert not [w for w in r.warnings if "wgmma" in w.lower()], r.warnings  # no serialisation


@NEEDS_NVCC
def test_hopper_backward_compiles_for_sm80():
    """The extension still builds for an A100: the kernel body is guarded (sm_90a only)."""
    for r in cc.run(HOPPER_BWD_SOURCES, arch="80", jobs=2):
        assert r.ok, (r.file, r.errors)


FP8_SOURCE = cc.CSRC / "gemm" / "fp8gemm_10_wgmma_tma.cu"


@NEEDS_NVCC
def test_fp8_gemm_compiles_for_sm90a_without_spills_and_for_sm80():
    """The FP8 step (a few seconds on 2 cores): no spill, no stack, no wgmma serialisation, at
    most 168 registers (65536 / 384 threads, rounded to 8; setmaxnreg then gives the consumers
    232 for their 3 x 64 accumulators). On sm_80 its body is guarded and it still builds."""
    (r,) = cc.run([FP8_SOURCE], jobs=1)
    assert r.ok and r.no_spill and not r.failures, (r.errors, r.failures)
    assert len(r.kernels) == 2  # two k-tiles in flight (default), one (P01_FP8_PROMOTE=serial)
    for k in r.kernels:
        assert "fp8gemm_wgmma_kernel" in k.kernel
        assert not k.spills and k.stack_frame_bytes == 0 and 0 < k.registers <= 168, k
    assert not [w for w in r.warnings if "wgmma" in w.lower()], r.warnings
    (r80,) = cc.run([FP8_SOURCE], arch="80", jobs=1)
    assert r80.ok, r80.errors
