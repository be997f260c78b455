// FlashAttention backward for Hopper (sm_90a): wgmma + TMA, a producer warpgroup and two consumer
// warpgroups, in the FlashAttention-3 style (Shah et al., 2024). Semantics are those of the
// FlashAttention-2 backward (flash_bwd_kernel.cuh), which stays the reference and the path for
// everything this kernel does not take (other GPUs, head dim 256, varlen, windows, softcap).
//
// One CTA per (key block of kBN = 128 keys, query head, batch). K and V of the block stay in
// shared memory; the CTA walks the query blocks (kBM = 64 rows) that see its keys, loaded by TMA
// into a 2-stage ring of Q and dO tiles (with the forward's log-sum-exp and the pre-pass's
// D = rowsum(dO * O), staged into shared memory by one producer warp). Consumer warpgroup cw owns
// keys cw * 64 .. cw * 64 + 63 of the block and holds their dK and dV (64 x D each, float32) in
// registers for the whole kernel. Per query block, each consumer warpgroup computes (all wgmma,
// M = 64 rows per warpgroup):
//   S^T  = K_cw Q^T        ss m64n64k16  (K and Q K-major in shared memory)
//   dP^T = V_cw dO^T       ss m64n64k16  (V and dO K-major)
//   P^T  = exp(scale S^T - lse)            (registers; masked on the causal diagonal / key end)
//   dV  += P^T dO          rs m64nDk16   (P^T from registers: the accumulator layout of S^T is
//                                         the A-fragment layout; dO N-major in shared memory)
//   dS^T = P^T (dP^T - D)                  (registers, float32)
//   dK  += dS^T Q          rs m64nDk16   (dS^T from registers; Q N-major)
//   dS^T -> shared memory (bf16/f16, 128-byte swizzled, double-buffered), a named barrier over the
//           two consumer warpgroups, then
//   dQ[:, cw half] = dS K  ss m64n(D/2)k16 (dS read M-major, "transposed", from the dS^T tile;
//                                          K N-major), over all 128 keys of the block,
//   scaled and written into a float32 tile in shared memory (64 rows x D, 128-byte-swizzled
//   boxes of 32 columns) that a producer thread adds to dq_accum with TMA reduce-adds
//   (cp.reduce.async.bulk.tensor ... add: the FlashAttention-2 backward's buffer and its final
//   conversion, flash_binding.cpp). The earlier form, float2 atomics straight from the consumers'
//   registers, stays as the kDqTma = false instance (P01_HOPPER_BWD_DQ=atomic picks it at launch,
//   for A/B measurements).
// Working on S^T (keys as the M dimension) keeps P^T and dS^T in registers for the dV and dK
// products; only dS makes a round trip through shared memory, as the A operand of dQ.
//
// Grouped-query attention as in the FlashAttention-2 backward: the CTA of query head h reads
// K/V of head h / h_h_k_ratio (the TMA maps span the Hk k/v heads) and writes dK/dV to query
// head h of (B, H, Sk, D) buffers the binding sums per group. Causal (top-left or bottom-right
// through causal_offset): key j is seen by rows i >= j - causal_offset, so the CTA starts at the
// query block holding row n0 - causal_offset (none left: dK = dV = 0). Rows past Sq get
// lse = +inf in shared memory (P = 0 there, no row mask needed); keys past Sk are masked in the
// last key block only (the TMA zero-fills them, but exp(0 - lse) can overflow).
//
// Structure, as in the forward (flash_fwd_hopper.cuh): `Smem` (the shared-memory layout and its
// barriers), `producer` (the TMA loads, lse/D staging and the dQ writer), the consumer's steps of
// one query block (issue_st_dpt, softmax_pt, issue_rs_product for dV and dK, compute_dst,
// store_dst, issue_dq_wait_all), its dQ accumulation (store_dq_tile, or dq_atomic_add) and
// `epilogue` (dK and dV), called in order from `consumer`. Splitting the former single consumer
// body into these left the machine code byte for byte the same (sass-diff, sm_90a, both head
// dims, dtypes and dQ forms); forms of the split that did not (the thread's indices in a struct,
// a helper owning the whole dS^T store or dQ tile write) were not taken.
//
// Registers (setmaxnreg): producer 24, consumers 240. A consumer thread holds dV and dK (D / 2
// floats each), S^T and dP^T (32 floats each), P^T as A fragments (16), dS^T as A fragments (16),
// and dQ's accumulator (D / 4 floats) once S^T and dP^T are dead.
//
// Not done (FlashAttention-3 has them): intra- and inter-warpgroup overlap of the softmax with
// the products (here the products of one query block are issued in dependency order, the two
// consumer warpgroups interleave naturally); a deterministic mode.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstdlib>
#include <cstring>

#include "attention/flash_api.h"
#include "attention/flash_bwd_kernel.cuh"  // the D = rowsum(dO * O) pre-pass, atomic_add_f32x2
#include "attention/flash_common.cuh"
#include "attention/flash_fwd_hopper.cuh"  // make_map (the TMA tensor maps), FLASH_SM90A
#include "common/sm90.cuh"
#include "common/wgmma.cuh"

namespace flash::hopper_bwd {

// mbarrier, TMA, setmaxnreg, proxy-fence and wgmma wrappers; ld_shared_f32x2 and
// named_barrier_sync (common/sm80.cuh, re-exported by sm90.cuh). No PTX is written here.
using namespace p01::sm90;

template <int D>
struct Config {
  static constexpr int kConsumers = 2;    // consumer warpgroups, 64 keys each
  static constexpr int kBN = 64 * kConsumers;  // keys per CTA
  static constexpr int kBM = 64;          // query rows per step
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kStages = 2;         // Q/dO ring depth
  static constexpr int kChunks = D / 64;    // 64-column (128-byte) TMA boxes along D
  static constexpr int kKVBytes = kBN * D * 2;  // one K or one V tile
  static constexpr int kQBytes = kBM * D * 2;   // one Q or one dO tile
  static constexpr int kDsBytes = kBN * kBM * 2;  // one dS^T tile (kBN rows of 128 bytes)
  static constexpr int kDqCols = D / kConsumers;  // dQ columns per consumer warpgroup
  static constexpr int kDqBoxCols = 32;             // float32 columns per 128-byte dQ box
  static constexpr int kDqBoxBytes = kBM * 128;     // one dQ box: kBM rows of 128 bytes
  static constexpr int kDqBytes = kBM * D * 4;      // the dQ tile: D / 32 boxes
  static constexpr int kTileBytes = 2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDsBytes +
                                    kDqBytes + 2 * kStages * kBM * 4;
  // kv_full, q_full[kStages], do_full[kStages], q_empty[kStages], dq_full, dq_empty
  static constexpr int kBarriers = 1 + 3 * kStages + 2;
  static constexpr int kSmemBytes = kTileBytes + 1024 + kBarriers * 8;  // + 1024-byte alignment
  static_assert(kBM == 64, "one wgmma M (64) of query rows per step");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536);
  static_assert(kSmemBytes <= 227 * 1024);
  static_assert(kDqCols == 32 || kDqCols == 64, "dQ wgmma forms: n32 and n64");
};

// Shared memory: K, V (kChunks boxes of kBN rows each), the Q and dO rings (kChunks boxes of kBM
// rows per stage), two dS^T tiles (kBN rows x kBM columns, 128-byte swizzled like a TMA box),
// the float32 dQ tile (D / 32 boxes of kBM rows x 32 columns, 128-byte swizzled), lse * log2(e)
// and D per stage, and the mbarriers.
template <int D>
struct Smem {
  using C = Config<D>;
  unsigned char* k;
  unsigned char* v;
  unsigned char* q;   // kStages Q tiles
  unsigned char* dO;  // kStages dO tiles
  unsigned char* ds;  // 2 dS^T tiles
  unsigned char* dq;  // the dQ tile of one query block (float32)
  float* lse;         // kStages x kBM: lse * log2(e), +inf past Sq
  float* dpre;        // kStages x kBM: rowsum(dO * O), 0 past Sq
  uint64_t* bars;

  __device__ __forceinline__ explicit Smem(unsigned char* raw) {
    unsigned char* tiles = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    k = tiles;
    v = k + C::kKVBytes;
    q = v + C::kKVBytes;
    dO = q + C::kStages * C::kQBytes;
    ds = dO + C::kStages * C::kQBytes;
    dq = ds + 2 * C::kDsBytes;
    lse = reinterpret_cast<float*>(dq + C::kDqBytes);
    dpre = lse + C::kStages * C::kBM;
    bars = reinterpret_cast<uint64_t*>(dpre + C::kStages * C::kBM);
  }
  __device__ __forceinline__ uint32_t kv_full() const { return smem_u32(bars); }
  __device__ __forceinline__ uint32_t q_full(int s) const { return smem_u32(bars + 1 + s); }
  __device__ __forceinline__ uint32_t do_full(int s) const {
    return smem_u32(bars + 1 + C::kStages + s);
  }
  __device__ __forceinline__ uint32_t q_empty(int s) const {
    return smem_u32(bars + 1 + 2 * C::kStages + s);
  }
  __device__ __forceinline__ uint32_t dq_full() const {
    return smem_u32(bars + 1 + 3 * C::kStages);
  }
  __device__ __forceinline__ uint32_t dq_empty() const {
    return smem_u32(bars + 2 + 3 * C::kStages);
  }

  // q_full / do_full: the TMA thread's expect_tx arrive and the 32 lanes of the lse/D warp;
  // q_empty and dq_full: every consumer thread; dq_empty: the dQ writer.
  __device__ __forceinline__ void init_barriers() const {
    mbar_init(kv_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(q_full(s), 1 + 32);
      mbar_init(do_full(s), 1 + 32);
      mbar_init(q_empty(s), C::kConsumers * 128);
    }
    mbar_init(dq_full(), C::kConsumers * 128);
    mbar_init(dq_empty(), 1);
    fence_mbarrier_init();
  }
};

// The query blocks a CTA of keys n0 .. n0 + kBN - 1 walks: [m_begin, m_blocks).
template <int D>
__device__ __forceinline__ int first_query_block(const BwdParams& p, int n0) {
  return p.causal ? max(0, n0 - p.causal_offset) / Config<D>::kBM : 0;
}

// ---- producer ---------------------------------------------------------------------------------
// Warp 0, lane 0: K and V once, then Q and dO of each query block through the ring. Warp 1: the
// block's lse (times log2 e; +inf past Sq) and D (0 past Sq) into shared memory, 2 rows a lane.
// Warp 2, lane 0 (kDqTma): the dQ writer. Once both consumer warpgroups have written a block's dQ
// tile, it adds the tile's boxes to dq_accum with TMA reduce-adds (rows past Sq are out of the
// tensor map's bounds and skipped), waits until the TMA has read the tile, and frees it.
template <int D, bool kDqTma>
__device__ __forceinline__ void producer(const Smem<D>& sm, const BwdParams& p, int n_block,
                                         int head, int batch, int m_begin, int m_blocks,
                                         const CUtensorMap* tma_q, const CUtensorMap* tma_k,
                                         const CUtensorMap* tma_v, const CUtensorMap* tma_do,
                                         const CUtensorMap* tma_dq) {
  using C = Config<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kChunks = C::kChunks, kStages = C::kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0 && lane == 0) {
    const int head_k = kv_head_of(head, p.h_h_k_ratio_inv);  // grouped-query attention
    mbar_expect_tx(sm.kv_full(), 2 * C::kKVBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      tma_load_4d(smem_u32(sm.k + c * kBN * 128), tma_k, c * 64, n_block * kBN, head_k, batch,
                  sm.kv_full());
      tma_load_4d(smem_u32(sm.v + c * kBN * 128), tma_v, c * 64, n_block * kBN, head_k, batch,
                  sm.kv_full());
    }
    for (int mb = m_begin, it = 0; mb < m_blocks; ++mb, ++it) {
      const int s = it % kStages;
      const uint32_t phase = (it / kStages) & 1;
      mbar_wait(sm.q_empty(s), phase ^ 1);  // the first round passes at once
      mbar_expect_tx(sm.q_full(s), C::kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(smem_u32(sm.q + s * C::kQBytes + c * kBM * 128), tma_q, c * 64, mb * kBM,
                    head, batch, sm.q_full(s));
      mbar_expect_tx(sm.do_full(s), C::kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(smem_u32(sm.dO + s * C::kQBytes + c * kBM * 128), tma_do, c * 64, mb * kBM,
                    head, batch, sm.do_full(s));
    }
  } else if (warp == 1) {
    const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
    const float* lse = p.lse + bh * p.seqlen_q;
    const float* dpre = p.dpre + bh * p.seqlen_q;
    for (int mb = m_begin, it = 0; mb < m_blocks; ++mb, ++it) {
      const int s = it % kStages;
      const uint32_t phase = (it / kStages) & 1;
      mbar_wait(sm.q_empty(s), phase ^ 1);
#pragma unroll
      for (int r = 0; r < kBM / 32; ++r) {
        const int row = mb * kBM + r * 32 + lane;
        sm.lse[s * kBM + r * 32 + lane] = row < p.seqlen_q ? lse[row] * kLog2e : INFINITY;
      }
      mbar_arrive(sm.q_full(s));
#pragma unroll
      for (int r = 0; r < kBM / 32; ++r) {
        const int row = mb * kBM + r * 32 + lane;
        sm.dpre[s * kBM + r * 32 + lane] = row < p.seqlen_q ? dpre[row] : 0.f;
      }
      mbar_arrive(sm.do_full(s));
    }
  } else if (kDqTma && warp == 2 && lane == 0) {
    const int bh = batch * p.heads + head;
    for (int mb = m_begin, it = 0; mb < m_blocks; ++mb, ++it) {
      mbar_wait(sm.dq_full(), it & 1);
#pragma unroll
      for (int b = 0; b < D / C::kDqBoxCols; ++b)
        tma_reduce_add_3d(tma_dq, smem_u32(sm.dq + b * C::kDqBoxBytes), b * C::kDqBoxCols,
                          mb * kBM, bh);
      bulk_commit();
      bulk_wait_read<0>();  // the tile is read: the consumers may write the next one
      mbar_arrive(sm.dq_empty());
    }
    bulk_wait<0>();  // every reduce-add complete before the CTA ends
  }
}

// ---- consumer: the steps of one query block -----------------------------------------------------
// S^T = K_cw Q^T and dP^T = V_cw dO^T, both 64 keys x 64 query rows, k over D: issued (two
// commit groups), not waited for. k_wg / v_wg: this warpgroup's 64 K / V rows; q_base / do_base:
// stage s of the Q / dO ring.
template <typename T, int D>
__device__ __forceinline__ void issue_st_dpt(const Smem<D>& sm, int s, uint32_t phase,
                                             uint32_t k_wg, uint32_t v_wg, uint32_t q_base,
                                             uint32_t do_base, float (&st)[32], float (&dpt)[32]) {
  constexpr int kBM = Config<D>::kBM, kBN = Config<D>::kBN;
  mbar_wait(sm.q_full(s), phase);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk / 4, off = (kk % 4) * 32;  // +32 bytes per k16 in a swizzled row
    wgmma_ss_m64nNk16_kk<T, 64>(st, make_desc(k_wg + c * kBN * 128 + off, 16, 1024),
                                make_desc(q_base + c * kBM * 128 + off, 16, 1024), kk > 0);
  }
  wgmma_commit();
  mbar_wait(sm.do_full(s), phase);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int c = kk / 4, off = (kk % 4) * 32;
    wgmma_ss_m64nNk16_kk<T, 64>(dpt, make_desc(v_wg + c * kBN * 128 + off, 16, 1024),
                                make_desc(do_base + c * kBM * 128 + off, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

// The 16 floats of this thread's query columns (pairs 8j + 2t, + 1, j = 0..7) of a kBM-float
// row vector in shared memory (lse or D of one stage): ld.shared, so that the loads are issued
// where they are written, ahead of the wgmma waits (generic loads the compiler made of sm.lse[]
// waited on the long scoreboard right before each use).
__device__ __forceinline__ void ld_query_pairs(const float* vec, int t, float2 (&out)[8]) {
  const uint32_t at = smem_u32(vec) + 2 * t * 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = ld_shared_f32x2(at + 8 * j * 4);
}

// P^T = exp2(S^T * scale log2 e - lse log2 e) in place of S^T in st, 0 where the key is past Sk
// or (causal) after the query row (need_mask: the block has such keys); rows past Sq have
// lse = +inf, hence P = 0. lse2: lse * log2(e) of this thread's query columns. Packed into pa:
// the A operand of dV += P^T dO, k16 step kk = query rows 16kk .. 16kk + 15, the n8 chunks 2kk
// and 2kk + 1 of the accumulator.
template <typename T>
__device__ __forceinline__ void softmax_pt(const BwdParams& p, int m0, int t, int key0,
                                           float scale_log2, bool need_mask,
                                           const float2 (&lse2)[8], float (&st)[32],
                                           uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e & 1);  // query row m0 + col
      float pv = exp2f(fmaf(st[4 * j + e], scale_log2, -((e & 1) ? lse2[j].y : lse2[j].x)));
      if (need_mask) {
        const int key = key0 + (e >> 1) * 8;
        if (key >= p.seqlen_k || (p.causal && key > m0 + col + p.causal_offset)) pv = 0.f;
      }
      st[4 * j + e] = pv;
    }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      pa[kk][i] = TypeTraits<T>::pack(st[8 * kk + 2 * i], st[8 * kk + 2 * i + 1]);
}

// acc += A B over the kBM / 16 k16 steps of one query block, A from registers (one k16 step per
// a[kk]), B N-major in shared memory at b_base (128-byte rows, a 64-column box every kBM rows):
// dV += P^T dO and dK += dS^T Q. Issued as one commit group, not waited for.
template <typename T, int D>
__device__ __forceinline__ void issue_rs_product(float (&acc)[D / 2], const uint32_t (&a)[4][4],
                                                 uint32_t b_base) {
  constexpr int kBM = Config<D>::kBM;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk)
    wgmma_rs_m64nNk16<T, D>(acc, a[kk], make_desc(b_base + kk * 16 * 128, kBM * 128, 1024), 1);
  wgmma_commit();
}

// dS^T = P^T (dP^T - D), in place of P^T in st, and packed into da: the A fragments of
// dK += dS^T Q and the contents of the dS^T tile. dpre2: D of this thread's query columns.
template <typename T>
__device__ __forceinline__ void compute_dst(const float (&dpt)[32], const float2 (&dpre2)[8],
                                            float (&st)[32], uint32_t (&da)[4][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      st[4 * j + e] *= dpt[4 * j + e] - ((e & 1) ? dpre2[j].y : dpre2[j].x);
    }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      da[kk][i] = TypeTraits<T>::pack(st[8 * kk + 2 * i], st[8 * kk + 2 * i + 1]);
}

// dS^T to shared memory, rows g and g + 8 of this warp (keys cw * 64 + 16 warp + g, + 8 of the
// block; row_g and row_g8 point at their first bytes): 128 bytes of 64 query columns per row,
// 16-byte chunk j at j ^ (row % 8) (the TMA's 128-byte swizzle; both rows have row % 8 = swz).
__device__ __forceinline__ void store_dst(unsigned char* row_g, unsigned char* row_g8, int swz,
                                          int t, const uint32_t (&da)[4][4]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int chunk = (j ^ swz) * 16 + 4 * t;
    // da[kk][0..3] = rows (g, g + 8) x chunks 2kk, 2kk + 1: chunk j is da[j / 2][(j & 1) * 2
    // + 0] for row g and [.. + 1] for row g + 8.
    *reinterpret_cast<uint32_t*>(row_g + chunk) = da[j / 2][(j & 1) * 2];
    *reinterpret_cast<uint32_t*>(row_g8 + chunk) = da[j / 2][(j & 1) * 2 + 1];
  }
}

// dQ[:, cw * kDqCols ..] = dS K over the block's 128 keys: A = dS, M-major (the dS^T tile),
// B = K, N-major; k16 step kk = keys 16kk .. 16kk + 15 (rows of both tiles). dS's M = 64 is
// one swizzle row, so its LBO is unused by the documented MN-major layout; it is given the
// SBO's value (1024) so that an A operand reading the two the other way round (no kernel of
// ours has run imm-trans-a = 1 on a GPU yet) would read the same elements. Then waits for every
// product of the block: dV, dK and dQ are complete, pa and da free.
template <typename T, int D>
__device__ __forceinline__ void issue_dq_wait_all(uint32_t ds_base, uint32_t k_dq,
                                                  float (&dq)[Config<D>::kDqCols / 2],
                                                  float (&dv)[D / 2], float (&dk)[D / 2],
                                                  uint32_t (&pa)[4][4], uint32_t (&da)[4][4]) {
  constexpr int kBN = Config<D>::kBN, kDqCols = Config<D>::kDqCols;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk)
    wgmma_ss_m64nNk16_mn<T, kDqCols>(dq, make_desc(ds_base + kk * 16 * 128, 1024, 1024),
                                     make_desc(k_dq + kk * 16 * 128, kBN * 128, 1024), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(dv);
  fence_regs(dk);
  fence_regs(dq);
  fence_regs(pa);
  fence_regs(da);
}

// ---- consumer: the dQ accumulation --------------------------------------------------------------
// kDqTma: scale * dQ into this thread's places of the float32 dQ tile, row 16 warp + g (and + 8)
// of warpgroup cw's boxes; y is the chunk swizzle and odd whether g is odd (the layout and the
// store order: the consumer's dQ step).
template <int D>
__device__ __forceinline__ void store_dq_tile(const BwdParams& p, unsigned char* tile, int cw,
                                              int row, int t, int y, bool odd,
                                              const float (&dq)[Config<D>::kDqCols / 2]) {
  using C = Config<D>;
  constexpr int kDqCols = C::kDqCols;
  unsigned char* base = tile + cw * (kDqCols / C::kDqBoxCols) * C::kDqBoxBytes + row * 128 +
                        8 * (t & 1);
#pragma unroll
  for (int j = 0; j < kDqCols / 8; ++j) {
    const int jo = j ^ 2;  // the step's value on lanes of odd g (same box: j / 4 unchanged)
    unsigned char* at = base + (j / 4) * C::kDqBoxBytes + (((2 * (j % 4)) ^ y) * 16);
    const float a0 = odd ? dq[4 * jo] : dq[4 * j], a1 = odd ? dq[4 * jo + 1] : dq[4 * j + 1];
    const float b0 = odd ? dq[4 * jo + 2] : dq[4 * j + 2];
    const float b1 = odd ? dq[4 * jo + 3] : dq[4 * j + 3];
    *reinterpret_cast<float2*>(at) = make_float2(a0 * p.softmax_scale, a1 * p.softmax_scale);
    *reinterpret_cast<float2*>(at + 8 * 128) =
        make_float2(b0 * p.softmax_scale, b1 * p.softmax_scale);
  }
}

// kDqTma = false (the A/B form): dq_accum += scale * dQ with float32 atomics straight from
// registers, rows m0 + 16 warp + g (+ 8). dq_accum: this (batch, head)'s (Sq, D) rows.
template <int D>
__device__ __forceinline__ void dq_atomic_add(const BwdParams& p, int cw, int warp, int g, int t,
                                              int m0, float* dq_accum,
                                              const float (&dq)[Config<D>::kDqCols / 2]) {
  constexpr int kDqCols = Config<D>::kDqCols;
  const int qrow = m0 + warp * 16 + g;
#pragma unroll
  for (int j = 0; j < kDqCols / 8; ++j) {
    const int col = cw * kDqCols + 8 * j + 2 * t;
    if (qrow < p.seqlen_q)
      atomic_add_f32x2(dq_accum + static_cast<int64_t>(qrow) * D + col,
                       dq[4 * j] * p.softmax_scale, dq[4 * j + 1] * p.softmax_scale);
    if (qrow + 8 < p.seqlen_q)
      atomic_add_f32x2(dq_accum + static_cast<int64_t>(qrow + 8) * D + col,
                       dq[4 * j + 2] * p.softmax_scale, dq[4 * j + 3] * p.softmax_scale);
  }
}

// ---- consumer: the epilogue ---------------------------------------------------------------------
// dK (times scale) and dV of this thread's keys, straight from registers into query head `head`
// of dk/dv (the binding sums them per group under grouped-query attention).
template <typename T, int D>
__device__ __forceinline__ void epilogue(const BwdParams& p, int key0, int t, int head,
                                         int batch, const float (&dk)[D / 2],
                                         const float (&dv)[D / 2]) {
  T* dk_out = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride;
  T* dv_out = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key < p.seqlen_k) {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const int col = 8 * j + 2 * t;
        *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) =
            TypeTraits<T>::pack(dk[4 * j + 2 * r] * p.softmax_scale,
                                dk[4 * j + 2 * r + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) =
            TypeTraits<T>::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      }
    }
  }
}

// ---- consumer -----------------------------------------------------------------------------------
// Accumulator layout of m64nNk16 (per warp w of the warpgroup, g = lane / 4, t = lane % 4):
// d[4j + 0..1] = row 16w + g, columns 8j + 2t + 0..1; d[4j + 2..3] = row 16w + g + 8, same
// columns. For S^T, dP^T, dV and dK the rows are this warpgroup's keys; for dQ the query rows.
// A consumer thread's place, fixed for the whole kernel: warpgroup cw (0 or 1) owns keys key_lo ..
// key_lo + 63 of the block, warp `warp` of it rows 16 warp .. 16 warp + 15 of the accumulators,
// lane (g, t) keys key0 = key_lo + 16 warp + g and key0 + 8. The functions above take these as
// scalars: handing them over in a struct, even by value, changed the registers ptxas assigned
// (sass-diff), and splitting the consumer is meant to leave its machine code as it was.
template <typename T, int D, bool kDqTma>
__device__ __forceinline__ void consumer(const Smem<D>& sm, const BwdParams& p, int n_block,
                                         int head, int batch, int m_begin, int m_blocks, int cw) {
  using C = Config<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kStages = C::kStages, kChunks = C::kChunks;
  constexpr int kDqCols = C::kDqCols;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = n_block * kBN;
  const int key_lo = n0 + cw * 64;              // this warpgroup's first key
  const int key0 = key_lo + warp * 16 + g;      // this thread's keys: key0 and key0 + 8
  const float scale_log2 = p.softmax_scale * kLog2e;
  const bool key_mask = key_lo + 64 > p.seqlen_k;  // keys past Sk in this warpgroup's rows

  float dv[D / 2], dk[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.f;

  const uint32_t k_wg = smem_u32(sm.k + cw * 64 * 128);  // this warpgroup's 64 K rows
  const uint32_t v_wg = smem_u32(sm.v + cw * 64 * 128);
  // dQ's B operand: K columns cw * kDqCols .. + kDqCols (a whole 64-column box at head dim 128,
  // half a box, +64 bytes into each 128-byte row, at head dim 64).
  const uint32_t k_dq = smem_u32(sm.k) + (kChunks == 2 ? cw * kBN * 128 : cw * kDqCols * 2);
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  float* dq_accum = p.dq_accum + bh * p.seqlen_q * D;

  mbar_wait(sm.kv_full(), 0);  // also when there is no query block: no TMA left in flight

  for (int mb = m_begin, it = 0; mb < m_blocks; ++mb, ++it) {
    const int s = it % kStages;
    const uint32_t phase = (it / kStages) & 1;
    const int m0 = mb * kBM;
    const uint32_t q_base = smem_u32(sm.q + s * C::kQBytes);
    const uint32_t do_base = smem_u32(sm.dO + s * C::kQBytes);

    float st[32], dpt[32];  // S^T (then P^T, then dS^T) and dP^T
    issue_st_dpt<T, D>(sm, s, phase, k_wg, v_wg, q_base, do_base, st, dpt);

    // P^T, with lse read while S^T is in flight; then dV += P^T dO, with D read while dP^T is.
    float2 lse2[8];
    ld_query_pairs(sm.lse + s * kBM, t, lse2);
    wgmma_wait<1>();  // S^T is done
    fence_regs(st);
    const bool need_mask = key_mask || (p.causal && key_lo + 63 > m0 + p.causal_offset);
    uint32_t pa[4][4];  // P^T as A fragments, one k16 step each
    softmax_pt<T>(p, m0, t, key0, scale_log2, need_mask, lse2, st, pa);
    float2 dpre2[8];  // D of the same columns
    ld_query_pairs(sm.dpre + s * kBM, t, dpre2);
    wgmma_wait<0>();  // dP^T is done
    fence_regs(dpt);
    issue_rs_product<T, D>(dv, pa, do_base);  // dV += P^T dO

    // dS^T, into the dS^T tile (the A operand of dQ) and, from registers, dK += dS^T Q.
    uint32_t da[4][4];  // dS^T as A fragments
    compute_dst<T>(dpt, dpre2, st, da);
    // The dS^T tile is double-buffered: the one written here was last read by the dQ product two
    // blocks ago, which both warpgroups finished before the barrier of the previous block.
    // Stored BEFORE the dK product is issued: da is that product's A operand, and PTX makes any
    // access to the A registers of a wgmma in flight (before the wait_group that covers it)
    // undefined behaviour, reads included (FlashAttention-3 also stores dS before its rs dK).
    unsigned char* ds_tile = sm.ds + (it & 1) * C::kDsBytes;
    {
      const int row = cw * 64 + warp * 16 + g;  // and row + 8 (same row % 8)
      store_dst(ds_tile + row * 128, ds_tile + (row + 8) * 128, row & 7, t, da);
    }
    issue_rs_product<T, D>(dk, da, q_base);  // dK += dS^T Q
    fence_proxy_async_smem();
    named_barrier_sync(1, C::kConsumers * 128);  // both warpgroups' dS^T rows are written

    float dq[kDqCols / 2];  // dQ of this block's 64 query rows, kDqCols columns
    issue_dq_wait_all<T, D>(smem_u32(ds_tile), k_dq, dq, dv, dk, pa, da);
    mbar_arrive(sm.q_empty(s));  // Q, dO, lse and D of this stage are read

    if constexpr (kDqTma) {
      // scale * dQ into the dQ tile: row 16 warp + g (and + 8, same row % 8), column cw * kDqCols
      // + 8j + 2t (+ 1), i.e. box cw * kDqCols / 32 + j / 4, 16-byte chunk 2 (j % 4) + t / 2 at
      // chunk ^ (row % 8) (128-byte swizzle; = 2 (j % 4) ^ x with x = (t / 2) ^ (row % 8), as
      // 2 (j % 4) is even), the pair at byte 8 (t % 2) of it.
      // Bank conflicts: a float2 store is served per half-warp (g = 0..3 or 4..7, t = 0..3), 16
      // lanes x 8 bytes, which is conflict-free only if its 8 lane pairs hit 8 different chunks.
      // With every lane storing the same j, lanes g and g ^ 1 with the other t / 2 land on the
      // same chunk (2-way conflicts, as ncu reported). So lanes of odd g store
      // their j % 4 steps in the order 2, 3, 0, 1 (j ^ 2): the chunk of step j is then
      // 2 (j % 4) ^ y, y = x ^ 4 (g % 2), and (g % 2, g / 2 % 2, t / 2) -> chunk is one-to-one.
      // The writer reduces the tile once all 256 threads have arrived; the wait below passes
      // once it has read the previous block's.
      const int row = warp * 16 + g;
      const bool odd = g & 1;
      const int y = (t >> 1) ^ (row & 7) ^ (odd ? 4 : 0);
      mbar_wait(sm.dq_empty(), (it & 1) ^ 1);  // the first block passes at once
      store_dq_tile<D>(p, sm.dq, cw, row, t, y, odd, dq);
      fence_proxy_async_smem();  // visible to the TMA (async proxy) that reads the tile
      mbar_arrive(sm.dq_full());
    } else {
      dq_atomic_add<D>(p, cw, warp, g, t, m0, dq_accum, dq);  // the A/B form
    }
  }

  epilogue<T, D>(p, key0, t, head, batch, dk, dv);
}

// ---- the kernel ---------------------------------------------------------------------------------
template <typename T, int D, bool kDqTma>
__global__ void __launch_bounds__(Config<D>::kThreads, 1)
    flash_bwd_hopper_kernel(const __grid_constant__ CUtensorMap tma_q,
                            const __grid_constant__ CUtensorMap tma_k,
                            const __grid_constant__ CUtensorMap tma_v,
                            const __grid_constant__ CUtensorMap tma_do,
                            const __grid_constant__ CUtensorMap tma_dq, const BwdParams p) {
#ifdef FLASH_SM90A
  using C = Config<D>;
  extern __shared__ unsigned char smem_raw[];
  const Smem<D> sm(smem_raw);
  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();
  const int n_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int m_blocks = (p.seqlen_q + C::kBM - 1) / C::kBM;
  const int m_begin = first_query_block<D>(p, n_block * C::kBN);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<C::kProducerRegs>();
    producer<D, kDqTma>(sm, p, n_block, head, batch, m_begin, m_blocks, &tma_q, &tma_k, &tma_v,
                        &tma_do, &tma_dq);
  } else {
    setmaxnreg_inc<C::kConsumerRegs>();
    consumer<T, D, kDqTma>(sm, p, n_block, head, batch, m_begin, m_blocks, wg - 1);
  }
#else
  // Built for an architecture without wgmma/TMA: the host launcher never starts this.
  __trap();
#endif
}

// ---- host side ----------------------------------------------------------------------------------
// The float32 dq_accum, (B, H, Sq, D) contiguous, as a 3-D tensor map (D, Sq, B * H) of 32-column
// x kBM-row boxes, 128-byte swizzled: the target of the dQ writer's reduce-adds.
inline bool make_dq_map(CUtensorMap* map, float* ptr, int d, int s, int bh, int box_rows) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(s),
                              static_cast<cuuint64_t>(bh)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * 4,
                                 static_cast<cuuint64_t>(s) * d * 4};  // bytes
  const cuuint32_t box[3] = {32, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, ptr, dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// dQ through TMA reduce-adds (the default) or, with P01_HOPPER_BWD_DQ=atomic in the environment,
// through float2 atomics from the consumers' registers (the first form, kept for A/B runs).
inline bool hopper_bwd_dq_atomic() {
  const char* v = std::getenv("P01_HOPPER_BWD_DQ");
  return v != nullptr && std::strcmp(v, "atomic") == 0;
}

template <typename T, int D>
cudaError_t launch_bwd_hopper(const BwdParams& p, cudaStream_t stream) {
  using C = Config<D>;
  CUtensorMap mq, mk, mv, mdo, mdq;
  if (!hopper::make_map(&mq, p.q, D, p.seqlen_q, p.heads, p.batch, p.q_row_stride,
                        p.q_head_stride, p.q_batch_stride, C::kBM, p.dtype) ||
      !hopper::make_map(&mdo, p.dout, D, p.seqlen_q, p.heads, p.batch, p.do_row_stride,
                        p.do_head_stride, p.do_batch_stride, C::kBM, p.dtype) ||
      !hopper::make_map(&mk, p.k, D, p.seqlen_k, p.heads_k, p.batch, p.k_row_stride,
                        p.k_head_stride, p.k_batch_stride, C::kBN, p.dtype) ||
      !hopper::make_map(&mv, p.v, D, p.seqlen_k, p.heads_k, p.batch, p.v_row_stride,
                        p.v_head_stride, p.v_batch_stride, C::kBN, p.dtype) ||
      !make_dq_map(&mdq, p.dq_accum, D, p.seqlen_q, p.batch * p.heads, C::kBM))
    return cudaErrorInvalidValue;
  {  // D = rowsum(dO * O), the FlashAttention-2 backward's pre-pass (flash_bwd_kernel.cuh)
    constexpr int kThreads = 256;
    constexpr int kRowsPerBlock = kThreads / (D / 8);
    const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seqlen_q;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > 0) {
      flash_bwd_dot_do_o_kernel<T, D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  auto kernel = hopper_bwd_dq_atomic() ? flash_bwd_hopper_kernel<T, D, false>
                                       : flash_bwd_hopper_kernel<T, D, true>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (err != cudaSuccess) return err;
  // Key blocks in increasing order: under a causal mask the first ones see the most query blocks
  // and start first.
  const dim3 grid((p.seqlen_k + C::kBN - 1) / C::kBN, p.heads, p.batch);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(mq, mk, mv, mdo, mdq, p);
  return cudaGetLastError();
}

template <int D>
cudaError_t dispatch_bwd_hopper(const BwdParams& p, cudaStream_t stream) {
  cudaError_t err = hopper::require_cc90();
  if (err != cudaSuccess) return err;
  // Dense only: windows, softcap and varlen run the FlashAttention-2 backward.
  if (p.head_dim != D || p.heads_k < 1 || p.heads != p.heads_k * p.h_h_k_ratio || p.local ||
      p.softcap > 0.f || p.varlen)
    return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_bwd_hopper<__nv_bfloat16, D>(p, stream)
                                     : launch_bwd_hopper<__half, D>(p, stream);
}

}  // namespace flash::hopper_bwd
