"""CPU tier: sass-diff's reading of cuobjdump listings (on a recorded listing, so without nvcc),
and, with nvcc and cuobjdump (slow), that it calls a refactor identical and a real change not."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from project01_cuda_kernel import sass_diff as sd
from shared.cuda_build import find_nvcc

# Trimmed from `cuobjdump -sass` of an sm_90a cubin: an anonymous-namespace kernel, addresses and
# encodings, a reconvergence point (BSSY) and branches.
RECORDED = """\
\tcode for sm_90a
\t\tFunction : _ZN54_GLOBAL__N__7a93bfdb_21_hgemm_09_wgmma_tma_cu_135aaaa118hgemm_wgmma_kernelI6__halfEEvPT_
\t.headerflags\t@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000ff00000000800 */
        /*0010*/                   BSSY B0, 0x50 ;                        /* 0x0000029000007945 */
                                                                          /* 0x000fe20003800000 */
        /*0020*/               @P0 BRA 0x40 ;                             /* 0x0000000000840947 */
                                                                          /* 0x018fea0003800000 */
        /*0030*/                   UMOV UR4, 0x400 ;                      /* 0x0000040000047882 */
                                                                          /* 0x000fe20000000000 */
        /*0040*/                   BSYNC B0 ;                             /* 0x0000000000007941 */
                                                                          /* 0x000fea0003800000 */
        /*0050*/                   EXIT ;                                 /* 0x000000000000794d */
                                                                          /* 0x000fea0003800000 */
        /*0060*/                   BRA 0x60;                              /* 0xfffffffc00fc7947 */
                                                                          /* 0x000fc0000383ffff */
\t\t..........
"""


def test_a_listing_is_read_without_addresses_encodings_or_path_hashes():
    (name, lines), *rest = sd.parse_sass(RECORDED).items()
    assert rest == []
    assert name == "_ZN11_GLOBAL__N_18hgemm_wgmma_kernelI6__halfEEvPT_"
    assert lines == [
        "LDC R1, c[0x0][0x28]",
        "BSSY B0, L1",  # 0x50
        "@P0 BRA L0",  # 0x40
        "UMOV UR4, 0x400",  # an immediate, not a target: kept
        "L0:",
        "BSYNC B0",
        "L1:",
        "EXIT",
        "L2:",
        "BRA L2",
    ]


def test_an_inserted_instruction_is_one_line_of_difference():
    base = [(0x00, "BRA 0x30"), (0x10, "IADD3 R1, R1, 0x1, RZ"), (0x20, "EXIT"), (0x30, "EXIT")]
    head = [(0x00, "BRA 0x40"), (0x10, "NOP"), (0x20, "IADD3 R1, R1, 0x1, RZ")]
    head += [(0x30, "EXIT"), (0x40, "EXIT")]
    a, b = sd.normalise(base), sd.normalise(head)
    assert a[0] == b[0] == "BRA L0"
    diff = sd.compare(_listing(a), _listing(b))
    (d,) = diff
    assert (d.status, d.lines_added, d.lines_removed) == ("differs", 1, 0)
    assert d.diff[1:] == [" BRA L0", "+NOP", " IADD3 R1, R1, 0x1, RZ"]  # after the @@ line


def test_the_anonymous_namespace_is_unhashed_at_each_level():
    mangled = "_ZN54_GLOBAL__N__7a93bfdb_21_hgemm_09_wgmma_tma_cu_135aaaa11kE"
    assert sd.unanonymise(mangled) == "_ZN11_GLOBAL__N_1kE"
    assert sd.unanonymise("_Z6kernelPf") == "_Z6kernelPf"


def test_registers_and_spills_growing_is_flagged():
    res = {"registers": 168, "stack_frame_bytes": 0, "spill_store_bytes": 0,
           "spill_load_bytes": 0}  # fmt: skip
    same = sd.KernelDiff("f.cu", "k", "identical", base=res, head=dict(res))
    assert not same.grew
    assert sd.KernelDiff("f.cu", "k", "differs", base=res, head=res | {"registers": 176}).grew
    assert sd.KernelDiff("f.cu", "k", "differs", base=res, head=res | {"spill_load_bytes": 4}).grew
    assert not sd.KernelDiff("f.cu", "k", "differs", base=res, head=res | {"registers": 160}).grew


def test_a_file_missing_at_one_revision_is_reported_not_compared():
    (d,) = sd.compare(sd.Listing("a.cu", ok=False, error="absent at this revision"), _listing([]))
    assert d.status == "not compiled" and "base: absent" in d.diff[0]


def _listing(lines: list[str]) -> sd.Listing:
    return sd.Listing("gemm/x.cu", ok=True, sass={"_Z1kv": lines})


NEEDS_TOOLS = pytest.mark.skipif(
    find_nvcc() is None or sd.find_cuobjdump(find_nvcc()) is None,
    reason="nvcc or cuobjdump not found: CUDA toolkit (or Triton's bundled tools) absent",
)

KERNEL = """\
__device__ __forceinline__ float twice(float x) { return 2.f * x; }
__global__ void k(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = %s;
}
"""


@NEEDS_TOOLS
@pytest.mark.slow
def test_a_forceinline_refactor_is_identical_and_a_real_change_is_not(tmp_path):
    """Compiles three versions of one small kernel (a few seconds with nvcc)."""
    nvcc = find_nvcc()
    cuobjdump = sd.find_cuobjdump(nvcc)
    listings = {}
    for name, body in (("plain", "2.f * x[i]"), ("helper", "twice(x[i])"), ("other", "x[i] + 1.f")):
        root = tmp_path / name
        (root / "k").mkdir(parents=True)
        (root / "k" / "k.cu").write_text(KERNEL % body)
        out = tmp_path / f"obj_{name}"
        out.mkdir()
        listings[name] = sd.compile_listing(root, "k/k.cu", nvcc, cuobjdump, "90a", out)
        assert listings[name].ok, listings[name].error
    (same,) = sd.compare(listings["plain"], listings["helper"])
    assert same.status == "identical" and same.insns_base > 0
    assert same.base is not None and same.base["registers"] > 0
    (changed,) = sd.compare(listings["plain"], listings["other"])
    assert changed.status == "differs" and changed.lines_added > 0


@pytest.mark.skipif(shutil.which("git") is None, reason="git not found")
def test_an_unknown_revision_is_one_clear_error():
    with pytest.raises(ValueError, match="not a git revision"):
        sd.resolve("no-such-revision-anywhere")


def _in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=sd.CSRC, capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="not a git checkout: no revision to read")
def test_a_revision_of_csrc_is_written_out_whole(tmp_path):
    root = sd.checkout_csrc("HEAD", tmp_path)
    assert (root / "common" / "sm90.cuh").is_file()
    assert {p.name for p in root.rglob("*.cu")} >= {"hgemm_09_wgmma_tma.cu", "sgemm_01_naive.cu"}
