"""CPU tier (no GPU, no nvcc): which shared-memory element every wgmma operand of the Hopper
kernels reads, checked against the matrix element the math needs.

A small exact model, in numpy, of
  (a) TMA's 128-byte swizzle: where cp.async.bulk.tensor (CU_TENSOR_MAP_SWIZZLE_128B) puts element
      (row, col) of a box of 128-byte rows (64 16-bit columns): the byte address of the unswizzled
      layout with its bits 4..6 XORed with its bits 7..9 (CuTe's Swizzle<3,4,3> on the address);
  (b) the wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format", "Shared
      Memory Matrix Layout", "Strides", "Canonical Layouts"): start address, leading- and
      stride-dimension byte offsets (LBO, SBO), base offset (0: the swizzle pattern starts on a
      1024-byte boundary), swizzle mode 1 (128 bytes); the canonical layouts for 16-bit elements
      in units of 16-byte vectors (T = 8 elements), MN extent i, K extent k (0..15):
        K-major  ((8,m),2):((8,SBO),1)     row i%8 at 128 B, 8-row group i//8 at SBO, k//8 at 16 B
        MN-major ((8,m),(8,2)):((1,LBO),(8,SBO))  i//8 % 8 at 16 B, i//64 at LBO, k%8 at 128 B,
                                                   k//8 at SBO
      then the same swizzle as (a) applied to the resulting byte address; imm-trans-a/-b = 0 selects
      K-major, 1 MN-major (A and B alike);
  (c) the register fragments of m64nNk16 (CuTe's CLayout_64xN and ALayout_64x16, thread x value
      -> (m, n) / (m, k)): the float accumulator and the 16-bit A operand of the rs forms.

The model is validated on the kernels that pass their GPU tests on an H200: the GEMM
(hgemm_09_wgmma_tma.cu: A K-major with +32-byte k-steps inside the swizzled rows, B N-major over
four 64-column boxes, LBO = the box stride) and the Hopper forward (flash_fwd_hopper.cuh, head
dims 64 and 128: S = Q K^T K-major/K-major with +32-byte k-steps and a box change at k = 64,
O += P V with P from registers and V N-major). Alternatives that those GPU runs rule out (the
swizzle taken relative to the descriptor's start address; LBO and SBO swapped for MN-major) fail
here on those kernels, so the checks are not vacuous. Then every operand of the backward
(flash_bwd_hopper.cuh) is checked the same way, with the consumers' generic-proxy stores of dS^T
into its swizzled tile simulated store by store.

What the validated kernels do not pin, and the model therefore assumes (see NOTES.md, "Hopper
backward", risks): imm-trans-a = 1 (an M-major A from shared memory: no validated kernel of ours
uses it; PTX defines one MN-major layout for A and B); an MN-major start address 64 bytes into a
128-byte swizzled row (head dim 64's dQ B operand; the address-bit XOR is pinned only by the
K-major k-steps); and that TMA's swizzle is exactly the XOR the consumers write with (the
validated kernels only pin that TMA and wgmma agree).

The kernel constants below (tile sizes, shared-memory offsets, descriptor arguments, transpose
flags, fragment packing, the dS^T store) MIRROR flash_bwd_hopper.cuh, flash_fwd_hopper.cuh,
hgemm_09_wgmma_tma.cu, common/sm90.cuh and common/wgmma.cuh, and must be updated with them;
test_sources_still_match_the_model fails when one of the mirrored lines changes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

CSRC = Path(__file__).resolve().parents[2] / "project01_cuda_kernel" / "csrc"

# ---- the model ---------------------------------------------------------------------------------

ELEM = 2  # bytes: bf16 / f16
ROW = 128  # bytes in one swizzled row (64 elements)


def swizzle128(addr, relative_to=None):
    """Swizzle<3,4,3> on byte addresses: bits 4..6 ^= bits 7..9 (repeats every 1024 bytes).

    relative_to: the alternative the GPU-validated kernels rule out, the swizzle applied to the
    offset from that address (the descriptor's start) instead of to the address itself."""
    addr = np.asarray(addr, dtype=np.int64)
    if relative_to is not None:
        off = addr - relative_to
        return relative_to + (off ^ (((off >> 7) & 7) << 4))
    return addr ^ (((addr >> 7) & 7) << 4)


def tag(tensor: int, row, col):
    """The identity of one matrix element, stored in its 16-bit slot of the simulated smem."""
    return tensor * (1 << 20) + np.asarray(row) * (1 << 10) + np.asarray(col)


def untag(t: int) -> str:
    return f"{TENSOR_NAMES.get(t >> 20, '?')}[{(t >> 10) & 1023}][{t & 1023}]" if t >= 0 else "-"


TENSOR_NAMES: dict[int, str] = {}


def tensor_id(name: str) -> int:
    for k, v in TENSOR_NAMES.items():
        if v == name:
            return k
    TENSOR_NAMES[len(TENSOR_NAMES) + 1] = name
    return len(TENSOR_NAMES)


class Smem:
    """Shared memory as 16-bit slots, each holding the tag of the element written there (-1:
    nothing written; 64 KiB of slack past the end catch reads that run off the tiles)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.stores = 0
        self.slots = np.full((nbytes + 65536) // ELEM, -1, dtype=np.int64)

    def tma_box(self, dst: int, name: str, row0: int, col0: int, rows: int):
        """cp.async.bulk.tensor of a box of `rows` x 64 elements, 128-byte swizzle, at dst."""
        assert dst % 1024 == 0, "128-byte swizzled TMA destinations are 1024-byte aligned here"
        r, c = np.meshgrid(np.arange(rows), np.arange(64), indexing="ij")
        phys = swizzle128(dst + r * ROW + c * ELEM)
        self.slots[phys // ELEM] = tag(tensor_id(name), row0 + r, col0 + c)

    def store_u32(self, addr: int, lo: int, hi: int):
        """A generic-proxy 32-bit store of two packed 16-bit elements (lo at the lower address)."""
        assert addr % 4 == 0
        self.stores += 1
        self.slots[addr // ELEM] = lo
        self.slots[addr // ELEM + 1] = hi


def make_desc(addr: int, lbo: int, sbo: int) -> int:
    """common/sm90.cuh make_desc: 128-byte swizzle (layout type 1), base offset 0."""
    d = ((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) | (((sbo & 0x3FFFF) >> 4) << 32)
    return d | (1 << 62)


@dataclass(frozen=True)
class Desc:
    start: int
    lbo: int
    sbo: int
    base_offset: int
    swizzle: int

    @staticmethod
    def decode(d: int) -> Desc:
        return Desc(
            start=(d & 0x3FFF) << 4,
            lbo=((d >> 16) & 0x3FFF) << 4,
            sbo=((d >> 32) & 0x3FFF) << 4,
            base_offset=(d >> 49) & 7,
            swizzle=(d >> 62) & 3,
        )


class Undetermined(Exception):
    """The operand falls outside what the model claims to know."""


def operand_addresses(
    desc: int,
    major: str,
    mn: int,
    operand: str = "B",
    *,
    model_swizzle: str = "absolute",
    swap_mn_lbo_sbo: bool = False,
    swap_a_mn_lbo_sbo: bool = False,
) -> np.ndarray:
    """Byte addresses (mn x 16) the wgmma operand reads: A (M x K) or B (N x K), 16-bit, k16.

    major: "K" (imm-trans = 0) or "MN" (imm-trans = 1); operand: "A" or "B".
    The keyword arguments select alternative models, for the tests that show which of them the
    GPU-validated kernels rule out: model_swizzle "relative" (the XOR taken on the offset from
    the start address) or "relative-mn" (that for MN-major operands only); swap_mn_lbo_sbo (LBO
    and SBO exchanged for MN-major operands), swap_a_mn_lbo_sbo (for MN-major A operands only)."""
    d = Desc.decode(desc)
    if d.swizzle != 1 or d.base_offset != 0:
        raise Undetermined(f"only 128-byte swizzle with base offset 0 is modelled: {d}")
    if d.start % 16:
        raise Undetermined("start address not 16-byte aligned")
    swap = major == "MN" and (swap_mn_lbo_sbo or (swap_a_mn_lbo_sbo and operand == "A"))
    lbo, sbo = (d.sbo, d.lbo) if swap else (d.lbo, d.sbo)
    i, k = np.meshgrid(np.arange(mn), np.arange(16), indexing="ij")
    row_start = d.start % ROW
    if major == "K":
        # ((8,m),2):((8,SBO),1) in 16-byte units, T = 8 elements inside each unit.
        if row_start + 16 * ELEM > ROW:
            raise Undetermined("K-major k16 slice crosses a 128-byte row")
        off = (i % 8) * ROW + (i // 8) * sbo + (k // 8) * 16 + (k % 8) * ELEM
    elif major == "MN":
        # ((8,m),(8,2)):((1,LBO),(8,SBO)) in 16-byte units, T = 8 elements inside each unit.
        if row_start + min(mn, 64) * ELEM > ROW:
            raise Undetermined("MN-major slice crosses a 128-byte row")
        off = (
            ((i // 8) % 8) * 16 + (i // 64) * lbo + (k % 8) * ROW + (k // 8) * sbo + (i % 8) * ELEM
        )
    else:
        raise ValueError(major)
    addr = d.start + off
    relative = model_swizzle == "relative" or (model_swizzle == "relative-mn" and major == "MN")
    return swizzle128(addr, relative_to=d.start if relative else None)


def read_operand(smem: Smem, desc: int, major: str, mn: int, operand: str, **model) -> np.ndarray:
    return smem.slots[operand_addresses(desc, major, mn, operand, **model) // ELEM]


def mismatches(read: np.ndarray, want: np.ndarray, limit: int = 4) -> str:
    bad = np.argwhere(read != want)
    if len(bad) == 0:
        return ""
    shown = ", ".join(
        f"({i},{k}) reads {untag(int(read[i, k]))} wants {untag(int(want[i, k]))}"
        for i, k in bad[:limit]
    )
    return f"{len(bad)} of {read.size} elements wrong: {shown}"


# ---- register fragments of m64nNk16 (CuTe's layouts, thread x value -> offset) -----------------


def cute_eval(shape, stride, coord: int) -> int:
    """Evaluate a flat CuTe layout (colexicographic coordinates) at a 1-D coordinate."""
    off = 0
    for s, d in zip(shape, stride):
        off += (coord % s) * d
        coord //= s
    return off


def acc_rc(tid: int, v: int, n: int) -> tuple[int, int]:
    """CLayout_64xN = ((4,8,4),(2,2,N/8)):((128,1,16),(64,8,512)) over m + 64 n."""
    off = cute_eval((4, 8, 4), (128, 1, 16), tid) + cute_eval((2, 2, n // 8), (64, 8, 512), v)
    return off % 64, off // 64


def afrag_rk(tid: int, a: int) -> tuple[int, int]:
    """ALayout_64x16 = ((4,8,4),(2,2,2)):((128,1,16),(64,8,512)) over m + 64 k; a = 2 reg + half."""
    off = cute_eval((4, 8, 4), (128, 1, 16), tid) + cute_eval((2, 2, 2), (64, 8, 512), a)
    return off % 64, off // 64


def check_rs_a_from_accumulator(n_acc: int):
    """The kernels' A fragments: a[kk][i] = pack(acc[8kk + 2i], acc[8kk + 2i + 1]) (the forward's
    convert_p, the backward's pa and da). Element (m, k) of k16 step kk must be accumulator
    element (m, 16 kk + k)."""
    bad = []
    for tid, kk, i, h in itertools.product(range(128), range(n_acc // 16), range(4), range(2)):
        m, k = afrag_rk(tid, 2 * i + h)
        row, col = acc_rc(tid, 8 * kk + 2 * i + h, n_acc)
        if (row, col) != (m, 16 * kk + k):
            bad.append((tid, kk, i, h, (m, 16 * kk + k), (row, col)))
    return bad


# ---- the kernels, as the model sees them (constants mirror the sources) ----------------------


@dataclass
class Operand:
    """One wgmma operand: what it reads vs what the math needs."""

    name: str
    read: np.ndarray
    want: np.ndarray


def gemm_operands(base: int = 0, **model) -> list[Operand]:
    """hgemm_09_wgmma_tma.cu: one stage, both consumer warpgroups, the four k16 steps."""
    kBM, kBN, kBK = 128, 256, 64
    kABytes = kBM * kBK * 2
    kBBoxBytes = kBK * 64 * 2
    smem = Smem(base + kABytes + kBN * kBK * 2)
    st = base
    smem.tma_box(st, "A", 0, 0, kBM)  # tma_load_2d(st, &tma_a, kt * kBK, tm * kBM): m rows, k cols
    for j in range(kBN // 64):  # B boxes: k rows, n columns 64 j ..
        smem.tma_box(st + kABytes + j * kBBoxBytes, "B", 0, j * 64, kBK)
    ops = []
    i, k = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    n, kb = np.meshgrid(np.arange(kBN), np.arange(16), indexing="ij")
    for cw, kk in itertools.product(range(2), range(kBK // 16)):
        a_base = st + cw * 64 * 128
        b_base = st + kABytes
        da = make_desc(a_base + kk * 32, 16, 1024)
        db = make_desc(b_base + kk * 16 * 128, kBBoxBytes, 1024)
        # wgmma_ss_m64nNk16_kn<T, 256>: imm-trans-a = 0, imm-trans-b = 1
        ops.append(
            Operand(
                f"gemm A cw{cw} kk{kk}",
                read_operand(smem, da, "K", 64, "A", **model),
                tag(tensor_id("A"), cw * 64 + i, 16 * kk + k),
            )
        )
        ops.append(
            Operand(
                f"gemm B cw{cw} kk{kk}",
                read_operand(smem, db, "MN", kBN, "B", **model),
                tag(tensor_id("B"), 16 * kk + kb, n),
            )
        )
    return ops


def fwd_config(d: int) -> dict:
    consumers = 3 if d == 64 else 2
    c = dict(D=d, kConsumers=consumers, kBM=64 * consumers, kBN=128)
    c["kStages"] = 2 if d == 128 else 4
    c["kChunks"] = d // 64
    c["kQBytes"] = c["kBM"] * d * 2
    c["kKVBytes"] = c["kBN"] * d * 2
    return c


def fwd_operands(d: int, base: int = 0, **model) -> list[Operand]:
    """flash_fwd_hopper.cuh: Q buffer 0, K/V stage 0, every consumer warpgroup and k16 step."""
    c = fwd_config(d)
    kBM, kBN = c["kBM"], c["kBN"]
    q = base
    k = base + 2 * c["kQBytes"]
    v = k + c["kStages"] * c["kKVBytes"]
    smem = Smem(v + c["kStages"] * c["kKVBytes"])
    for ch in range(c["kChunks"]):
        smem.tma_box(q + ch * kBM * 128, "Q", 0, ch * 64, kBM)
        smem.tma_box(k + ch * kBN * 128, "K", 0, ch * 64, kBN)
        smem.tma_box(v + ch * kBN * 128, "V", 0, ch * 64, kBN)
    ops = []
    i, kq = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    n, kn = np.meshgrid(np.arange(kBN), np.arange(16), indexing="ij")
    nd, kd = np.meshgrid(np.arange(d), np.arange(16), indexing="ij")
    for cw in range(c["kConsumers"]):
        q_base = q + cw * 64 * 128
        for kk in range(d // 16):  # issue_qk
            ch, off = kk // 4, (kk % 4) * 32
            da = make_desc(q_base + ch * kBM * 128 + off, 16, 1024)
            db = make_desc(k + ch * kBN * 128 + off, 16, 1024)
            # wgmma_ss_m64nNk16_kk<T, 128>: imm-trans-a = imm-trans-b = 0
            ops.append(
                Operand(
                    f"fwd{d} S=QK^T A=Q cw{cw} kk{kk}",
                    read_operand(smem, da, "K", 64, "A", **model),
                    tag(tensor_id("Q"), cw * 64 + i, 16 * kk + kq),
                )
            )
            ops.append(
                Operand(
                    f"fwd{d} S=QK^T B=K^T cw{cw} kk{kk}",
                    read_operand(smem, db, "K", kBN, "B", **model),
                    tag(tensor_id("K"), n, 16 * kk + kn),
                )
            )
    for kk in range(kBN // 16):  # issue_pv (B only; A is P from registers)
        db = make_desc(v + kk * 16 * 128, kBN * 128, 1024)
        # wgmma_rs_m64nNk16: imm-trans-b = 1
        ops.append(
            Operand(
                f"fwd{d} O+=PV B=V kk{kk}",
                read_operand(smem, db, "MN", d, "B", **model),
                tag(tensor_id("V"), 16 * kk + kd, nd),
            )
        )
    return ops


def bwd_config(d: int) -> dict:
    c = dict(D=d, kConsumers=2, kBN=128, kBM=64, kStages=2, kChunks=d // 64)
    c["kKVBytes"] = c["kBN"] * d * 2
    c["kQBytes"] = c["kBM"] * d * 2
    c["kDsBytes"] = c["kBN"] * c["kBM"] * 2
    c["kDqCols"] = d // c["kConsumers"]
    return c


def bwd_smem(d: int, base: int) -> dict:
    """Smem<D>'s constructor: K, V, the Q and dO rings, two dS^T tiles (then lse, D, barriers)."""
    c = bwd_config(d)
    k = base
    v = k + c["kKVBytes"]
    q = v + c["kKVBytes"]
    do = q + c["kStages"] * c["kQBytes"]
    ds = do + c["kStages"] * c["kQBytes"]
    return dict(k=k, v=v, q=q, dO=do, ds=ds, end=ds + 2 * c["kDsBytes"])


def bwd_ds_stores(smem: Smem, ds_tile: int, store_xor: bool = True):
    """The consumers' dS^T stores (both warpgroups, every thread), as flash_bwd_hopper.cuh writes
    them. The value of accumulator element st[v] of thread tid of warpgroup cw is dS^T[key row
    cw * 64 + r][query col c] for (r, c) = acc_rc(tid, v); da[kk][i] = pack(st[8kk + 2i], +1)."""
    ds_t = tensor_id("dS^T")
    for cw, tid in itertools.product(range(2), range(128)):
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4

        def elem(v, cw=cw, tid=tid):
            r, col = acc_rc(tid, v, 64)
            return int(tag(ds_t, cw * 64 + r, col))

        da = [
            [(elem(8 * kk + 2 * i), elem(8 * kk + 2 * i + 1)) for i in range(4)] for kk in range(4)
        ]
        row = cw * 64 + warp * 16 + g
        for j in range(8):
            chunk = ((j ^ (row & 7)) if store_xor else j) * 16 + 4 * t
            smem.store_u32(ds_tile + row * 128 + chunk, *da[j // 2][(j & 1) * 2])
            smem.store_u32(ds_tile + (row + 8) * 128 + chunk, *da[j // 2][(j & 1) * 2 + 1])


def bwd_operands(
    d: int,
    base: int = 0,
    *,
    k_dq_offset_bytes=None,
    ds_lbo=1024,
    ds_sbo=1024,
    store_xor=True,
    **model,
) -> list[Operand]:
    """flash_bwd_hopper.cuh: both consumer warpgroups, both ring stages and both dS^T buffers,
    every k16 step of the five products. The keyword arguments are mutations for the tests."""
    c = bwd_config(d)
    kBM, kBN, kChunks, kDqCols = c["kBM"], c["kBN"], c["kChunks"], c["kDqCols"]
    sm = bwd_smem(d, base)
    smem = Smem(sm["end"])
    for ch in range(kChunks):  # producer: K and V once, Q and dO per stage
        smem.tma_box(sm["k"] + ch * kBN * 128, "K", 0, ch * 64, kBN)
        smem.tma_box(sm["v"] + ch * kBN * 128, "V", 0, ch * 64, kBN)
        for s in range(c["kStages"]):
            smem.tma_box(sm["q"] + s * c["kQBytes"] + ch * kBM * 128, f"Q{s}", 0, ch * 64, kBM)
            smem.tma_box(sm["dO"] + s * c["kQBytes"] + ch * kBM * 128, f"dO{s}", 0, ch * 64, kBM)
    for buf in range(2):
        bwd_ds_stores(smem, sm["ds"] + buf * c["kDsBytes"], store_xor=store_xor)

    ops = []
    i, kx = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    nd, kd = np.meshgrid(np.arange(d), np.arange(16), indexing="ij")
    nq, kq = np.meshgrid(np.arange(kDqCols), np.arange(16), indexing="ij")
    for cw, s in itertools.product(range(2), range(c["kStages"])):
        k_wg = sm["k"] + cw * 64 * 128
        v_wg = sm["v"] + cw * 64 * 128
        q_base = sm["q"] + s * c["kQBytes"]
        do_base = sm["dO"] + s * c["kQBytes"]
        Q, dO = tensor_id(f"Q{s}"), tensor_id(f"dO{s}")
        for kk in range(d // 16):  # S^T = K_cw Q^T, dP^T = V_cw dO^T: ss m64n64k16, trans 0/0
            ch, off = kk // 4, (kk % 4) * 32
            for nm, a_t, a_base, b_t, b_base in (
                ("S^T=KQ^T", "K", k_wg, Q, q_base),
                ("dP^T=VdO^T", "V", v_wg, dO, do_base),
            ):
                da = make_desc(a_base + ch * kBN * 128 + off, 16, 1024)
                db = make_desc(b_base + ch * kBM * 128 + off, 16, 1024)
                ops.append(
                    Operand(
                        f"bwd{d} {nm} A cw{cw} s{s} kk{kk}",
                        read_operand(smem, da, "K", 64, "A", **model),
                        tag(tensor_id(a_t), cw * 64 + i, 16 * kk + kx),
                    )
                )
                ops.append(
                    Operand(
                        f"bwd{d} {nm} B cw{cw} s{s} kk{kk}",
                        read_operand(smem, db, "K", 64, "B", **model),
                        tag(b_t, i, 16 * kk + kx),
                    )
                )
        for kk in range(kBM // 16):  # dV += P^T dO, dK += dS^T Q: rs m64nDk16, trans-b 1
            for nm, b_t, b_base in (("dV+=P^TdO", dO, do_base), ("dK+=dS^TQ", Q, q_base)):
                db = make_desc(b_base + kk * 16 * 128, kBM * 128, 1024)
                ops.append(
                    Operand(
                        f"bwd{d} {nm} B cw{cw} s{s} kk{kk}",
                        read_operand(smem, db, "MN", d, "B", **model),
                        tag(b_t, 16 * kk + kd, nd),
                    )
                )
    for cw, buf in itertools.product(range(2), range(2)):
        # dQ[:, cw * kDqCols ..] = dS K: ss m64n{kDqCols}k16, trans-a = trans-b = 1
        k_dq = sm["k"] + (cw * kBN * 128 if kChunks == 2 else cw * kDqCols * 2)
        if k_dq_offset_bytes is not None and kChunks == 1:
            k_dq = sm["k"] + cw * k_dq_offset_bytes
        ds_base = sm["ds"] + buf * c["kDsBytes"]
        for kk in range(kBN // 16):
            da = make_desc(ds_base + kk * 16 * 128, ds_lbo, ds_sbo)
            db = make_desc(k_dq + kk * 16 * 128, kBN * 128, 1024)
            ops.append(
                Operand(
                    f"bwd{d} dQ=dSK A=dS(M-major) cw{cw} buf{buf} kk{kk}",
                    read_operand(smem, da, "MN", 64, "A", **model),
                    tag(tensor_id("dS^T"), 16 * kk + kx, i),
                )
            )
            ops.append(
                Operand(
                    f"bwd{d} dQ=dSK B=K cw{cw} buf{buf} kk{kk}",
                    read_operand(smem, db, "MN", kDqCols, "B", **model),
                    tag(tensor_id("K"), 16 * kk + kq, cw * kDqCols + nq),
                )
            )
    return ops


def failures(ops: list[Operand]) -> list[str]:
    return [f"{op.name}: {m}" for op in ops if (m := mismatches(op.read, op.want))]


# ---- validation on the kernels that pass on an H200 -------------------------------------------

BASES = [0, 1024 * 37]  # any 1024-aligned start of the dynamic shared memory


@pytest.mark.parametrize("base", BASES)
def test_known_good_gemm_reads_what_it_multiplies(base):
    assert failures(gemm_operands(base)) == []


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("d", [64, 128])
def test_known_good_forward_reads_what_it_multiplies(d, base):
    assert failures(fwd_operands(d, base)) == []


def test_known_good_rs_a_fragments_match_the_accumulator():
    """The forward's convert_p (P from the S accumulator, n128) and the backward's pa / da (from
    the S^T accumulator, n64) use the same packing; the forward is validated."""
    assert check_rs_a_from_accumulator(128) == []
    assert check_rs_a_from_accumulator(64) == []


def test_accumulator_layout_is_the_one_the_kernels_index():
    """d[4j + e] = row 16 warp + g + 8 (e >> 1), column 8j + 2t + (e & 1) (the comment and the
    index arithmetic of all three kernels: masks, lse/D columns, dq atomics, dk/dv stores)."""
    for tid, v in itertools.product(range(128), range(64)):
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        j, e = v // 4, v % 4
        assert acc_rc(tid, v, 128) == (16 * warp + g + 8 * (e >> 1), 8 * j + 2 * t + (e & 1))


def test_model_alternatives_are_ruled_out_by_the_known_good_kernels():
    """Not vacuous: a swizzle relative to the start address breaks the forward's and the GEMM's
    +32-byte k-steps; LBO/SBO exchanged for MN-major breaks the GEMM's B and the forward's V."""
    assert failures(fwd_operands(64, model_swizzle="relative"))
    assert failures(fwd_operands(128, model_swizzle="relative"))
    assert failures(gemm_operands(model_swizzle="relative"))
    assert failures(gemm_operands(swap_mn_lbo_sbo=True))
    assert failures(fwd_operands(64, swap_mn_lbo_sbo=True))
    assert failures(fwd_operands(128, swap_mn_lbo_sbo=True))


def names(fails: list[str]) -> set[str]:
    """The operands (warpgroup, stage, buffer and k-step dropped) of a list of failures."""
    return {f.split(" cw")[0] + " cw" + f.split(" cw")[1][0] for f in fails}


def test_what_the_known_good_kernels_leave_open():
    """Two alternatives the validated kernels cannot rule out (none of their operands depends on
    them), and the backward operands that depend on them: exactly the NOTES' two risks.

    1. The XOR taken relative to the start address for MN-major operands only: every validated
       MN-major read starts on a 1024-byte boundary. Only head dim 64's dQ B operand of warpgroup
       1 (K columns 32..63, start +64 bytes into the swizzled rows) would read other elements.
    2. An M-major A with LBO/SBO exchanged with respect to B's: no validated kernel has
       imm-trans-a = 1. The dS operand of dQ (both head dims) would read other elements."""
    for alt in ({"model_swizzle": "relative-mn"}, {"swap_a_mn_lbo_sbo": True}):
        assert failures(gemm_operands(**alt)) == []
        assert failures(fwd_operands(64, **alt)) == []
        assert failures(fwd_operands(128, **alt)) == []
    assert failures(bwd_operands(128, model_swizzle="relative-mn")) == []
    assert names(failures(bwd_operands(64, model_swizzle="relative-mn"))) == {
        "bwd64 dQ=dSK B=K cw1"
    }
    for d in (64, 128):
        # the kernel's hedge: dS's LBO = its SBO, so the exchanged reading is the same
        assert failures(bwd_operands(d, swap_a_mn_lbo_sbo=True)) == []
        # without it (the LBO the B operands pass, 16 KiB), that operand alone would break
        assert names(failures(bwd_operands(d, ds_lbo=16384, swap_a_mn_lbo_sbo=True))) == {
            f"bwd{d} dQ=dSK A=dS(M-major) cw0",
            f"bwd{d} dQ=dSK A=dS(M-major) cw1",
        }


# ---- the backward ------------------------------------------------------------------------------


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("d", [64, 128])
def test_backward_reads_what_it_multiplies(d, base):
    ops = bwd_operands(d, base)
    assert len(ops) == (4 * 2 * d // 16 * 2) + (4 * 2 * 4) + (4 * 2 * 8)
    assert failures(ops) == []


@pytest.mark.parametrize("d", [64, 128])
def test_backward_ds_stores_are_the_tma_swizzle_and_fill_the_tile(d):
    """Every dS^T element lands where a TMA box of 128 key rows x 64 query columns would put it,
    each slot written exactly once (the 256 threads of both consumer warpgroups)."""
    c = bwd_config(d)
    smem = Smem(c["kDsBytes"])
    bwd_ds_stores(smem, 0)
    want = Smem(c["kDsBytes"])
    want.tma_box(0, "dS^T", 0, 0, 128)
    assert (smem.slots[: c["kDsBytes"] // ELEM] >= 0).all()
    assert smem.stores * 2 == 128 * 64  # so each slot exactly once
    assert (smem.slots == want.slots).all()


def test_backward_mutations_are_caught():
    """The checks see the mistakes a descriptor or store could make."""
    assert failures(bwd_operands(64, ds_sbo=2048))  # dS: next 8 keys at 2048 bytes
    assert failures(bwd_operands(128, store_xor=False))  # dS^T stored unswizzled
    assert failures(bwd_operands(64, k_dq_offset_bytes=32))  # K columns 16.. instead of 32..


def test_model_refuses_what_it_does_not_know():
    """Forms outside the documented canonical layouts are "could not determine", not a verdict."""
    with pytest.raises(Undetermined):  # an MN-major row of 64 elements starting mid-row
        operand_addresses(make_desc(64, 16384, 1024), "MN", 64)
    with pytest.raises(Undetermined):  # a K-major k16 slice running past its 128-byte row
        operand_addresses(make_desc(112, 16, 1024), "K", 64)
    with pytest.raises(Undetermined):  # a non-zero base offset
        operand_addresses(make_desc(0, 16, 1024) | (3 << 49), "K", 64)


def test_backward_head_dim_64_dq_b_is_half_a_swizzled_row():
    """The one form no validated kernel uses: N = 32, MN-major, start 64 bytes into each 128-byte
    row. The model reads it correctly (absolute-address XOR), and says what it assumes."""
    sm = bwd_smem(64, 0)
    d = Desc.decode(make_desc(sm["k"] + 32 * 2, 128 * 128, 1024))
    assert d.start % 128 == 64 and d.start % 1024 == 64
    addrs = operand_addresses(make_desc(sm["k"] + 32 * 2, 128 * 128, 1024), "MN", 32)
    # Row k of the operand stays in 128-byte row k of the tile, in its upper half before the XOR.
    assert ((addrs - sm["k"]) // 128 == np.arange(16)[None, :]).all()


# ---- drift guard: the mirrored source lines ----------------------------------------------------

MIRRORED = {
    "common/sm90.cuh": [
        "d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);",
        "d |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;",
        "d |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;",
        "d |= 1ull << 62;",
    ],
    "common/wgmma.cuh": [
        # the transpose immediates (imm-trans-a, imm-trans-b) of each form and N
        '", %" #DA ", %" #DB ", p, 1, 1, " TRANS ";\\n}\\n"',
        '", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, 1;\\n}\\n"',  # rs: 1
        "P01_WGMMA_SS(wgmma_ss_m64nNk16_kk, T, PTX, 64, P01_WGMMA_REGS_32, "
        'P01_WGMMA_OUT32(d, 0), 32, 33, 34, "0, 0")',
        "P01_WGMMA_SS(wgmma_ss_m64nNk16_kk, T, PTX, 128, P01_WGMMA_REGS_64, "
        'P01_WGMMA_OUT64(d, 0), 64, 65, 66, "0, 0")',
        "P01_WGMMA_SS(wgmma_ss_m64nNk16_kn, T, PTX, 256, P01_WGMMA_REGS_128, "
        'P01_WGMMA_OUT128(d), 128, 129, 130, "0, 1")',
        "P01_WGMMA_SS(wgmma_ss_m64nNk16_mn, T, PTX, 32, P01_WGMMA_REGS_16, "
        'P01_WGMMA_OUT16(d), 16, 17, 18, "1, 1")',
        "P01_WGMMA_SS(wgmma_ss_m64nNk16_mn, T, PTX, 64, P01_WGMMA_REGS_32, "
        'P01_WGMMA_OUT32(d, 0), 32, 33, 34, "1, 1")',
    ],
    "gemm/hgemm_09_wgmma_tma.cu": [
        "constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4;",
        "tma_load_2d(smem_u32(st), tma_a, kt * kBK, tm * kBM, bar);",
        "tma_load_2d(smem_u32(st + kABytes + j * kBBoxBytes), tma_b, tn * kBN + j * 64, kt * kBK,",
        "const uint32_t a_base = smem_u32(tiles + s * kStageBytes + cw * 64 * 128);",
        "const uint64_t da = make_desc(a_base + kk * 32, 16, 1024);",
        "const uint64_t db = make_desc(b_base + kk * 16 * 128, kBBoxBytes, 1024);",
    ],
    "attention/flash_fwd_hopper.cuh": [
        "static constexpr int kConsumers = D == 64 ? 3 : 2;",
        "static constexpr int kBN = 128;",
        "k = tiles + 2 * C::kQBytes;",
        "v = tiles + 2 * C::kQBytes + C::kStages * C::kKVBytes;",
        "tma_load_4d(smem_u32(sm.q + qb * C::kQBytes + c * kBM * 128), tma_q, c * 64,",
        "tma_load_4d(smem_u32(ring + s * C::kKVBytes + c * kBN * 128), map, c * 64, n * kBN,",
        "const uint32_t q_base = smem_u32(sm.q + qb * C::kQBytes + cw * 64 * 128);",
        "const uint64_t da = make_desc(q_base + c * kBM * 128 + off, 16, 1024);",
        "const uint64_t db = make_desc(k_base + c * kBN * 128 + off, 16, 1024);",
        "const uint64_t db = make_desc(v_base + kk * 16 * 128, kBN * 128, 1024);",
        "pa[kk][i] = TypeTraits<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);",
    ],
    "attention/flash_bwd_hopper.cuh": [
        "static constexpr int kBN = 64 * kConsumers;",
        "static constexpr int kBM = 64;",
        "v = k + C::kKVBytes;",
        "q = v + C::kKVBytes;",
        "dO = q + C::kStages * C::kQBytes;",
        "ds = dO + C::kStages * C::kQBytes;",
        "tma_load_4d(smem_u32(sm.k + c * kBN * 128), tma_k, c * 64, n_block * kBN, head_k, batch,",
        "tma_load_4d(smem_u32(sm.q + s * C::kQBytes + c * kBM * 128), tma_q, c * 64, mb * kBM,",
        "tma_load_4d(smem_u32(sm.dO + s * C::kQBytes + c * kBM * 128), tma_do, c * 64, mb * kBM,",
        "const uint32_t k_wg = smem_u32(sm.k + cw * 64 * 128);",
        "const uint32_t v_wg = smem_u32(sm.v + cw * 64 * 128);",
        "smem_u32(sm.k) + (kChunks == 2 ? cw * kBN * 128 : cw * kDqCols * 2);",
        "make_desc(k_wg + c * kBN * 128 + off, 16, 1024),",
        "make_desc(q_base + c * kBM * 128 + off, 16, 1024), kk > 0);",
        "make_desc(v_wg + c * kBN * 128 + off, 16, 1024),",
        "make_desc(do_base + c * kBM * 128 + off, 16, 1024), kk > 0);",
        "pa[kk][i] = TypeTraits<T>::pack(st[8 * kk + 2 * i], st[8 * kk + 2 * i + 1]);",
        "make_desc(b_base + kk * 16 * 128, kBM * 128, 1024), 1);",  # dV: b_base = do_base
        "issue_rs_product<T, D>(dv, pa, do_base);",
        "da[kk][i] = TypeTraits<T>::pack(st[8 * kk + 2 * i], st[8 * kk + 2 * i + 1]);",
        "issue_rs_product<T, D>(dk, da, q_base);",
        "const int row = cw * 64 + warp * 16 + g;",
        "store_dst(ds_tile + row * 128, ds_tile + (row + 8) * 128, row & 7, t, da);",
        "const int chunk = (j ^ swz) * 16 + 4 * t;",
        "*reinterpret_cast<uint32_t*>(row_g + chunk) = da[j / 2][(j & 1) * 2];",
        "*reinterpret_cast<uint32_t*>(row_g8 + chunk) = da[j / 2][(j & 1) * 2 + 1];",
        "unsigned char* ds_tile = sm.ds + (it & 1) * C::kDsBytes;",
        "wgmma_ss_m64nNk16_mn<T, kDqCols>(dq, make_desc(ds_base + kk * 16 * 128, 1024, 1024),",
        "make_desc(k_dq + kk * 16 * 128, kBN * 128, 1024), kk > 0);",
    ],
}


def test_backward_stores_ds_before_the_rs_product_that_takes_it():
    """PTX ISA (wgmma.wait_group): accessing the A-fragment registers of a wgmma.mma_async before
    a wait_group that covers it is undefined behaviour, reads included. The dS^T stores read da,
    the A operand of dK += dS^T Q, so they come before that product is issued (as in
    FlashAttention-3); the wait after dQ (issue_dq_wait_all) covers dK before da is touched
    again."""
    text = (CSRC / "attention" / "flash_bwd_hopper.cuh").read_text()
    consumer = text[text.index("__device__ __forceinline__ void consumer(") :]
    pack = consumer.index("compute_dst<T>(dpt, dpre2, st, da);")  # writes da
    store = consumer.index("store_dst(ds_tile + row * 128,")  # reads da
    dk = consumer.index("issue_rs_product<T, D>(dk, da, q_base);")  # dK's A operand is da
    wait = consumer.index("issue_dq_wait_all<T, D>(", dk)
    assert pack < store < dk < wait
    assert "da" not in consumer[dk + 40 : wait].replace("da[4][4]", "")
    wait_fn = text[text.index("void issue_dq_wait_all(") :]
    wait_fn = wait_fn[: wait_fn.index("\n}\n")]
    assert wait_fn.index("wgmma_wait<0>();") < wait_fn.index("fence_regs(da);")
    store_fn = text[text.index("void store_dst(") :]
    assert "wgmma" not in store_fn[: store_fn.index("\n}\n")]  # plain stores, no product


def test_sources_still_match_the_model():
    """The model mirrors these lines; when one changes, update the model with it."""
    for rel, lines in MIRRORED.items():
        text = (CSRC / rel).read_text()
        missing = [line for line in lines if line not in text]
        assert missing == [], f"{rel}: changed since the model was written: {missing}"


if __name__ == "__main__":  # a per-operand verdict for humans
    for title, ops in (
        ("GEMM (validated)", gemm_operands()),
        ("forward d64 (validated)", fwd_operands(64)),
        ("forward d128 (validated)", fwd_operands(128)),
        ("backward d64", bwd_operands(64)),
        ("backward d128", bwd_operands(128)),
    ):
        bad = failures(ops)
        print(f"{title}: {len(ops) - len(bad)} of {len(ops)} operand reads correct")
        for b in bad:
            print("  ", b)
