// FlashAttention forward for Hopper (sm_90a): wgmma + TMA, producer/consumer warpgroups, the
// ideas of FlashAttention-3 (Shah et al., 2024). What changes from the FlashAttention-2 kernel
// (flash_fwd_kernel.cuh):
//
// - TMA: one producer thread copies whole Q, K and V tiles (boxes of 64 head-dim columns, 128-byte
//   swizzled) into shared memory with cp.async.bulk.tensor, completing on mbarriers with a byte
//   count. The tensor maps are 4-D (D, S, H, B), so a tile past the end of a sequence is
//   zero-filled by the copy engine and never reads the next head.
// - wgmma: each consumer warpgroup (4 warps, 64 query rows) computes S = Q K^T (64 x 128) with
//   m64n128k16 straight from shared memory, and O += P V with P taken from registers (the
//   accumulator layout of S is the register A-operand layout of the next wgmma, so the softmax
//   output never goes through shared memory) and V from shared memory, untransposed.
// - Warp specialisation: warpgroup 0 is the producer (setmaxnreg hands its registers to the
//   consumers); the others are consumers, 64 query rows each: 2 at head dim 128 (128-row tiles),
//   3 at head dim 64 (192-row tiles). A ring of K and V stages with full/empty mbarriers connects
//   them, with separate barriers for K and V so that Q K^T can start before V has landed.
// - Tiles are (query block, head, batch), the query blocks of one head consecutive (so CTAs
//   running together share K and V through L2), the longest first. A CTA may walk several tiles
//   (persistent, one CTA per SM; the launcher chooses where that measured faster): Q is
//   double-buffered and the K/V ring runs across tile boundaries, so the producer loads the next
//   tile while the consumers finish this one and write its output.
// - Intra-warpgroup overlap (FlashAttention-3's two-stage pipelining): in iteration j the consumer
//   issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, both asynchronous, and runs the softmax of
//   S_j while the second product is still on the tensor cores; it waits for P V only before
//   rescaling O.
// - Key blocks run from the last to the first, so the masked blocks (the causal diagonal and the
//   ragged end of the keys) come first and the rest run without mask arithmetic.
// - Grouped-query attention: the K/V tensor maps span the k/v heads (D, Sk, Hk, B) and the
//   producer loads k/v head h / h_h_k_ratio for query head h. Causal: row i sees keys j <= i +
//   causal_offset (0 top-left, Sk - Sq bottom-right); a tile whose rows all see no key has no key
//   block: its Q is still loaded and released (the Q ring's phases stay in step) and it writes
//   O = 0, lse = +inf.
//
// Structure, as FlashAttention-3's hopper/ lays it out: `Smem` (the shared-memory layout and its
// barriers), `TileScheduler` (the tile order), `producer` (the TMA loads), `consumer_mainloop`
// (the wgmma products and the online softmax of one tile) and `epilogue` (O / l and the lse),
// called from a kernel body that only specialises the warpgroups. Splitting the former single
// body into these left the machine code byte for byte the same (cuobjdump -sass, sm_90a, both
// head dims).
//
// Requirements (TMA's): 16-byte aligned base pointers, strides along B, H and S multiples of 8
// elements, stride 1 along D. The launcher returns cudaErrorNotSupported unless the device has
// compute capability 9.0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attention/flash_api.h"
#include "attention/flash_common.cuh"
#include "common/sm90.cuh"
#include "common/wgmma.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_SM90A 1
#endif

namespace flash::hopper {

template <int D>
struct Config {
  // Consumer warpgroups (64 query rows each): 2 at head dim 128; 3 at head dim 64, where Q K^T is
  // half as long and a third warpgroup's products hide more of the softmax.
  static constexpr int kConsumers = D == 64 ? 3 : 2;
  static constexpr int kBM = 64 * kConsumers;  // query rows per tile
  static constexpr int kBN = 128;              // keys per block
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // setmaxnreg: the producer gives registers away, the consumers take them (64K in all).
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static constexpr int kStages = D == 128 ? 2 : 4;  // K/V ring depth (shared memory bound)
  static constexpr int kChunks = D / 64;           // 64-column (128-byte) TMA boxes along D
  static constexpr int kQBytes = kBM * D * 2;      // one Q tile; two are kept (next tile's Q)
  static constexpr int kKVBytes = kBN * D * 2;     // one K or one V tile
  static constexpr int kTileBytes = 2 * kQBytes + 2 * kStages * kKVBytes;
  static constexpr int kBarriers = 4 + 4 * kStages;  // q full/empty x2, k/v full/empty per stage
  static constexpr int kSmemBytes = kTileBytes + 1024 + kBarriers * 8;  // + 1024-byte alignment
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536);
  static_assert(kSmemBytes <= 227 * 1024);
};

using namespace p01::sm90;  // mbarrier, TMA and wgmma wrappers (common/sm90.cuh, wgmma.cuh)

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- shared memory and the tile order ---------------------------------------------------------
// The layout of one CTA's shared memory: two Q tiles (this tile's and the next one's), the K and
// V rings, and the mbarriers that connect the producer to the consumers.
template <int D>
struct Smem {
  using C = Config<D>;
  unsigned char* q;  // 2 Q tiles
  unsigned char* k;  // kStages K tiles
  unsigned char* v;  // kStages V tiles
  uint64_t* bars;

  // The 128-byte swizzle pattern repeats every 1024 bytes: tiles start 1024-aligned.
  __device__ __forceinline__ explicit Smem(unsigned char* raw) {
    unsigned char* tiles = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    q = tiles;
    k = tiles + 2 * C::kQBytes;
    v = tiles + 2 * C::kQBytes + C::kStages * C::kKVBytes;
    bars = reinterpret_cast<uint64_t*>(tiles + C::kTileBytes);
  }
  __device__ __forceinline__ uint32_t q_full(int b) const { return smem_u32(bars + b); }
  __device__ __forceinline__ uint32_t q_empty(int b) const { return smem_u32(bars + 2 + b); }
  __device__ __forceinline__ uint32_t k_full(int s) const { return smem_u32(bars + 4 + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const {
    return smem_u32(bars + 4 + C::kStages + s);
  }
  __device__ __forceinline__ uint32_t k_empty(int s) const {
    return smem_u32(bars + 4 + 2 * C::kStages + s);
  }
  __device__ __forceinline__ uint32_t v_empty(int s) const {
    return smem_u32(bars + 4 + 3 * C::kStages + s);
  }

  // Full barriers complete on the producer's expect_tx arrive; empty ones on every consumer
  // thread's arrive. Thread 0 initialises them before the CTA-wide barrier.
  __device__ __forceinline__ void init_barriers() const {
    for (int b = 0; b < 2; ++b) {
      mbar_init(q_full(b), 1);
      mbar_init(q_empty(b), C::kConsumers * 128);
    }
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), C::kConsumers * 128);
      mbar_init(v_empty(s), C::kConsumers * 128);
    }
    fence_mbarrier_init();
  }
};

// One tile of work: a block of query rows of one (batch, head), and how many key blocks it sees
// (0 when causal hides every key from all its rows).
struct Tile {
  int m_block, head, batch, n_blocks;
};

// Persistent: CTA b takes tiles b, b + gridDim.x, ... The query blocks of one (batch, head) are
// consecutive tiles, the longest first (causal: the last rows), so the CTAs running at one time
// share K and V through L2. (Ordering by query block first, every head at once, streamed a
// different K/V per SM from HBM and lost 10-20% at head dim 128.)
template <int D>
struct TileScheduler {
  const FwdParams& p;
  int m_blocks, num_tiles, blocks_k;

  __device__ __forceinline__ explicit TileScheduler(const FwdParams& params)
      : p(params),
        m_blocks((params.seqlen_q + Config<D>::kBM - 1) / Config<D>::kBM),
        num_tiles(m_blocks * (params.heads * params.batch)),
        blocks_k((params.seqlen_k + Config<D>::kBN - 1) / Config<D>::kBN) {}

  __device__ __forceinline__ Tile get(int tile) const {
    constexpr int kBM = Config<D>::kBM, kBN = Config<D>::kBN;
    Tile t;
    t.m_block = m_blocks - 1 - tile % m_blocks;
    t.head = (tile / m_blocks) % p.heads;
    t.batch = (tile / m_blocks) / p.heads;
    // Causal: the tile's last row, (m_block + 1) kBM - 1 at most, sees keys up to that plus
    // causal_offset; none when that is negative.
    t.n_blocks =
        p.causal
            ? min(blocks_k, max(0, ((t.m_block + 1) * kBM + p.causal_offset + kBN - 1) / kBN))
            : blocks_k;
    return t;
  }
};

// ---- producer -----------------------------------------------------------------------------------
// Warpgroup 0: one thread issues every copy, running ahead across tiles: the next tile's Q and
// first K/V blocks load while the consumers finish this one. Key blocks are loaded last first.
template <int D>
__device__ __forceinline__ void producer(const Smem<D>& sm, const TileScheduler<D>& sched,
                                         const CUtensorMap* tma_q, const CUtensorMap* tma_k,
                                         const CUtensorMap* tma_v) {
  using C = Config<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kStages = C::kStages, kChunks = C::kChunks;
  int kv_it = 0, q_it = 0;
  for (int tile = blockIdx.x; tile < sched.num_tiles; tile += gridDim.x, ++q_it) {
    const Tile t = sched.get(tile);
    const int head_k = kv_head_of(t.head, sched.p.h_h_k_ratio_inv);  // grouped-query attention
    const int qb = q_it & 1;
    mbar_wait(sm.q_empty(qb), ((q_it >> 1) & 1) ^ 1);  // the first round passes at once
    mbar_expect_tx(sm.q_full(qb), C::kQBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      tma_load_4d(smem_u32(sm.q + qb * C::kQBytes + c * kBM * 128), tma_q, c * 64,
                  t.m_block * kBM, t.head, t.batch, sm.q_full(qb));
    // One K or V tile of key block n into stage s of its ring, once the stage is free.
    auto load_kv = [&](unsigned char* ring, const CUtensorMap* map, uint32_t empty, uint32_t full,
                       int s, uint32_t phase, int n) {
      mbar_wait(empty, phase ^ 1);
      mbar_expect_tx(full, C::kKVBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(smem_u32(ring + s * C::kKVBytes + c * kBN * 128), map, c * 64, n * kBN,
                    head_k, t.batch, full);
    };
    for (int i = 0; i < t.n_blocks; ++i, ++kv_it) {
      const int n = t.n_blocks - 1 - i, s = kv_it % kStages;
      const uint32_t phase = (kv_it / kStages) & 1;
      load_kv(sm.k, tma_k, sm.k_empty(s), sm.k_full(s), s, phase, n);
      load_kv(sm.v, tma_v, sm.v_empty(s), sm.v_full(s), s, phase, n);
    }
  }
}

// ---- consumer: the main loop over one tile's key blocks ----------------------------------------
// A consumer thread's place, fixed for the whole kernel: warpgroup cw owns query rows
// cw * 64 .. cw * 64 + 63 of each tile.
struct ConsumerThread {
  int cw, warp, lane;
  float scale_log2;
};

// Accumulator layout of m64nNk16 (per warp w of the warpgroup, g = lane / 4, t = lane % 4):
// d[4j + 0..1] = row 16w + g, columns 8j + 2t + 0..1; d[4j + 2..3] = row 16w + g + 8, same columns.
// Consumer warpgroup cw owns query rows cw * 64 .. cw * 64 + 63 of the tile. On return, o holds
// the unnormalised output, row_max the running max of S * scale * log2(e) and row_sum this
// thread's partial row sums; kv_it has advanced past the tile's key blocks.
template <typename T, int D>
__device__ __forceinline__ void consumer_mainloop(const Smem<D>& sm, const FwdParams& p,
                                                  const Tile& t, const ConsumerThread& th,
                                                  int q_it, int& kv_it,
                                                  float (&o)[D / 2], float (&s)[Config<D>::kBN / 2],
                                                  uint32_t (&pa)[Config<D>::kBN / 16][4],
                                                  float (&row_max)[2], float (&row_sum)[2],
                                                  float (&corr)[2]) {
  using C = Config<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kStages = C::kStages;
  const int cw = th.cw, lane = th.lane;
  const float scale_log2 = th.scale_log2;
  const int row0 = t.m_block * kBM + cw * 64 + th.warp * 16 + lane / 4;  // and row0 + 8
  const int wg_row_min = t.m_block * kBM + cw * 64;
  const int qb = q_it & 1, n_blocks = t.n_blocks;

#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  row_max[0] = row_max[1] = -INFINITY;
  row_sum[0] = row_sum[1] = 0.f;

  const uint32_t q_base = smem_u32(sm.q + qb * C::kQBytes + cw * 64 * 128);
  auto issue_qk = [&](int stage) {
    const uint32_t k_base = smem_u32(sm.k + stage * C::kKVBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int c = kk / 4, off = (kk % 4) * 32;  // +32 bytes per k16 in a swizzled row
      const uint64_t da = make_desc(q_base + c * kBM * 128 + off, 16, 1024);
      const uint64_t db = make_desc(k_base + c * kBN * 128 + off, 16, 1024);
      wgmma_ss_m64nNk16_kk<T, kBN>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int stage, int accumulate) {
    const uint32_t v_base = smem_u32(sm.v + stage * C::kKVBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint64_t db = make_desc(v_base + kk * 16 * 128, kBN * 128, 1024);
      wgmma_rs_m64nNk16<T, D>(o, pa[kk], db, kk > 0 ? 1 : accumulate);
    }
    wgmma_commit();
  };
  // Mask (when the block needs it), new running max, P = exp2(S * scale - max) in place, the
  // row sums, and the factor corr by which the O accumulated so far must be rescaled.
  auto softmax = [&](int n) {
    const int col_end = (n + 1) * kBN;  // one past the block's last key
    if (col_end > p.seqlen_k || (p.causal && col_end - 1 > wg_row_min + p.causal_offset)) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n * kBN + 8 * j + 2 * (lane % 4) + (e & 1);
          const int row = row0 + (e >> 1) * 8;
          if (col >= p.seqlen_k || (p.causal && col > row + p.causal_offset))
            s[4 * j + e] = -INFINITY;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
        mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = quad_max(mx);
      const float m_new = fmaxf(row_max[r], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row so far
      corr[r] = exp2f(row_max[r] - m_use);
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = exp2f(fmaf(s[4 * j + 2 * r + e], scale_log2, -m_use));
          s[4 * j + 2 * r + e] = v;
          sum += v;
        }
      row_sum[r] = row_sum[r] * corr[r] + sum;
    }
  };
  // S accumulator layout == A-fragment layout: keys 16kk..16kk+15 are n8 chunks 2kk, 2kk+1.
  auto convert_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        pa[kk][i] = TypeTraits<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  };
  auto stage_of = [&](int i) { return (kv_it + i) % kStages; };
  auto phase_of = [&](int i) { return static_cast<uint32_t>(((kv_it + i) / kStages) & 1); };

  mbar_wait(sm.q_full(qb), (q_it >> 1) & 1);
  if (n_blocks == 0) {  // causal: every row of the tile sees no key; O = 0, lse = +inf
    mbar_arrive(sm.q_empty(qb));
    return;
  }
  // First block (the last keys): S, softmax, P. O is still empty.
  mbar_wait(sm.k_full(stage_of(0)), phase_of(0));
  issue_qk(stage_of(0));
  wgmma_wait<0>();
  fence_regs(s);
  mbar_arrive(sm.k_empty(stage_of(0)));
  if (n_blocks == 1) mbar_arrive(sm.q_empty(qb));  // Q's last use in this tile is done
  softmax(n_blocks - 1);
  convert_p();
  // Intra-warpgroup overlap: S_i = Q K_i^T and O += P_{i-1} V_{i-1} are issued back to back,
  // and the softmax of S_i runs while the second product is still on the tensor cores.
  for (int i = 1; i < n_blocks; ++i) {
    const int si = stage_of(i), sp = stage_of(i - 1);
    mbar_wait(sm.k_full(si), phase_of(i));
    issue_qk(si);  // S_i = Q K_i^T
    mbar_wait(sm.v_full(sp), phase_of(i - 1));
    issue_pv(sp, i > 1 ? 1 : 0);  // O += P_{i-1} V_{i-1}, still running during the softmax
    wgmma_wait<1>();                // S_i is done
    fence_regs(s);
    mbar_arrive(sm.k_empty(si));
    if (i == n_blocks - 1) mbar_arrive(sm.q_empty(qb));
    softmax(n_blocks - 1 - i);
    wgmma_wait<0>();  // P_{i-1} V_{i-1} is done: O and the P registers are free
    fence_regs(o);
    fence_regs(pa);
    mbar_arrive(sm.v_empty(sp));
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[4 * j] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }
    convert_p();
  }
  const int sl = stage_of(n_blocks - 1);
  mbar_wait(sm.v_full(sl), phase_of(n_blocks - 1));
  issue_pv(sl, n_blocks > 1 ? 1 : 0);
  wgmma_wait<0>();
  fence_regs(o);
  fence_regs(pa);
  mbar_arrive(sm.v_empty(sl));
  kv_it += n_blocks;
}

// ---- consumer: the epilogue ---------------------------------------------------------------------
// O / l straight from registers (each thread owns two rows' column pairs), and lse = max * ln 2 +
// log l (natural log, of the scaled scores) for the backward. The producer is already loading
// the next tile meanwhile.
template <typename T, int D>
__device__ __forceinline__ void epilogue(const FwdParams& p, const Tile& t,
                                         const ConsumerThread& th, const float (&o)[D / 2],
                                         const float (&row_max)[2], const float (&row_sum)[2]) {
  const int lane = th.lane;
  const int row0 = t.m_block * Config<D>::kBM + th.cw * 64 + th.warp * 16 + lane / 4;
  T* out = static_cast<T*>(p.o) + t.batch * p.o_batch_stride + t.head * p.o_head_stride;
  float* lse = p.lse + (static_cast<int64_t>(t.batch) * p.heads + t.head) * p.seqlen_q;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    const float l = quad_sum(row_sum[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row < p.seqlen_q) {
      T* dst = out + static_cast<int64_t>(row) * p.o_row_stride + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + 8 * j) =
            TypeTraits<T>::pack(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      if (lane % 4 == 0)
        lse[row] = l > 0.f ? row_max[r] * 0.6931471805599453f + logf(l) : INFINITY;
    }
  }
}

// ---- the kernel ---------------------------------------------------------------------------------
// Warp specialisation: warpgroup 0 produces (and gives its registers away with setmaxnreg), the
// others consume, each walking the same tiles as the producer.
template <typename T, int D>
__global__ void __launch_bounds__(Config<D>::kThreads, 1)
    flash_fwd_hopper_kernel(const __grid_constant__ CUtensorMap tma_q,
                            const __grid_constant__ CUtensorMap tma_k,
                            const __grid_constant__ CUtensorMap tma_v, const FwdParams p) {
#ifdef FLASH_SM90A
  using C = Config<D>;
  extern __shared__ unsigned char smem_raw[];
  const Smem<D> sm(smem_raw);
  if (threadIdx.x == 0) sm.init_barriers();
  __syncthreads();
  const TileScheduler<D> sched(p);
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x == 0) producer<D>(sm, sched, &tma_q, &tma_k, &tma_v);
  } else {
    setmaxnreg_inc<C::kConsumerRegs>();
    const int tid = threadIdx.x % 128;
    const ConsumerThread th{wg - 1, tid / 32, tid % 32, p.softmax_scale * kLog2e};
    float o[D / 2];             // O accumulator, 64 x D over the warpgroup
    float s[C::kBN / 2];        // S = Q K^T of one key block, then P = exp(S - m) in float32
    uint32_t pa[C::kBN / 16][4];  // P as the bf16/f16 A operand of O += P V, one k16 step each
    float row_max[2], row_sum[2], corr[2];
    int kv_it = 0, q_it = 0;
    for (int tile = blockIdx.x; tile < sched.num_tiles; tile += gridDim.x, ++q_it) {
      const Tile t = sched.get(tile);
      consumer_mainloop<T, D>(sm, p, t, th, q_it, kv_it, o, s, pa, row_max, row_sum, corr);
      epilogue<T, D>(p, t, th, o, row_max, row_sum);
    }
  }
#else
  // Built for an architecture without wgmma/TMA: the host launcher never starts this.
  __trap();
#endif
}

// ---- host side ----------------------------------------------------------------------------------
// A (B, H, S, D) tensor with element strides (batch, head, row, 1), read in boxes of
// box_rows x 64 head-dim columns, 128-byte swizzled; out-of-bounds elements read as zero.
inline bool make_map(CUtensorMap* map, const void* ptr, int d, int s, int h, int b,
                     int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows,
                     DType dtype) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(s),
                              static_cast<cuuint64_t>(h), static_cast<cuuint64_t>(b)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(row_stride) * 2,
                                 static_cast<cuuint64_t>(head_stride) * 2,
                                 static_cast<cuuint64_t>(batch_stride) * 2};  // bytes
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(
      map,
      dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

template <typename T, int D>
cudaError_t launch_fwd_hopper(const FwdParams& p, cudaStream_t stream) {
  using C = Config<D>;
  CUtensorMap mq, mk, mv;
  // K and V span the k/v heads (heads_k of them); the producer picks query head h's.
  if (!make_map(&mq, p.q, D, p.seqlen_q, p.heads, p.batch, p.q_row_stride, p.q_head_stride,
                p.q_batch_stride, C::kBM, p.dtype) ||
      !make_map(&mk, p.k, D, p.seqlen_k, p.heads_k, p.batch, p.k_row_stride, p.k_head_stride,
                p.k_batch_stride, C::kBN, p.dtype) ||
      !make_map(&mv, p.v, D, p.seqlen_k, p.heads_k, p.batch, p.v_row_stride, p.v_head_stride,
                p.v_batch_stride, C::kBN, p.dtype))
    return cudaErrorInvalidValue;
  auto kernel = flash_fwd_hopper_kernel<T, D>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int64_t tiles =
      static_cast<int64_t>((p.seqlen_q + C::kBM - 1) / C::kBM) * p.heads * p.batch;
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  // Persistent (one CTA per SM walking the tiles) or one CTA per tile. Persistence pays where
  // tiles are short or uniform (non-causal at head dim 64, non-causal seq <= 1k at head dim 128);
  // it loses with causal masks, whose uneven tiles a static round-robin balances badly, and at
  // head dim 128 with long sequences. The A/B behind this rule:
  // reports/project01_cuda_kernel/attention_hopper_ab.json.
  const bool persistent = !p.causal && (D == 64 || p.seqlen_k <= 1024);
  const int grid = (!persistent || tiles < sms) ? static_cast<int>(tiles) : sms;
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(mq, mk, mv, p);
  return cudaGetLastError();
}

// cudaSuccess on a device of compute capability 9.0 (the sm_90a kernels' only target),
// cudaErrorNotSupported on any other, or the runtime's error while asking.
inline cudaError_t require_cc90() {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  return major == 9 && minor == 0 ? cudaSuccess : cudaErrorNotSupported;
}

template <int D>
cudaError_t dispatch_fwd_hopper(const FwdParams& p, cudaStream_t stream) {
  cudaError_t err = require_cc90();
  if (err != cudaSuccess) return err;
  if (p.head_dim != D || p.heads_k < 1 || p.heads != p.heads_k * p.h_h_k_ratio)
    return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_fwd_hopper<__nv_bfloat16, D>(p, stream)
                                     : launch_fwd_hopper<__half, D>(p, stream);
}

}  // namespace flash::hopper
