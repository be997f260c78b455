// Chunked-prefill attention over a paged KV cache: FlashAttention-2 forward with a gathered K/V.
//
// The contract is kernels/reference.py `paged_prefill_attention`: q (T, Hq, D) packed over N
// sequences by cu_seqlens_q; sequence i's q_len queries are the last q_len positions of its
// context of context_lens[i] tokens, whose K/V already sit in the cache
// (num_blocks, block_size, Hkv, D); query j is at position ctx - q_len + j and sees keys 0..that.
//
// Work split. The G = Hq / Hkv query heads that share one KV head are packed into the rows of a
// tile: for one (sequence, KV head) the "packed rows" are r = token * G + head_in_group, which are
// also consecutive in memory (q[token] holds the group's heads side by side). One CTA owns BM
// packed rows of one sequence and one KV head, so every K/V tile it gathers feeds G heads, and a
// short chunk (even one token) still fills G rows of the MMA. The grid is (tiles, Hkv): tiles is a
// host-side upper bound on sum_i ceil(q_len_i * G / BM) from T and N alone (no device read, so
// CUDA-graph safe); each CTA finds its (sequence, tile) by a warp scan over cu_seqlens_q and
// CTAs past the real count exit at once. Within a sequence tiles run last-first, so the tiles
// with the most keys start first.
//
// Per CTA (NWARPS warps, warp w owns MT m-tiles of 16 rows):
//   1. Q tile -> shared (cp.async, rows gathered as (token, head)); MT = 1 keeps it in registers.
//   2. K/V tiles of BN keys are gathered through the block table: the key at position p lives in
//      slot block_table[p / block_size] * block_size + p % block_size. Each thread computes the
//      slots of the rows it copies; slots for tile n + 2 are read from the block table while tile
//      n is multiplied and tile n + 1 is in flight (two shared-memory stages), so the table
//      lookup's latency is hidden. A tile may span several blocks (block_size 16 or 32).
//   3. S = Q K^T in float32, bottom-right causal mask on tiles that cross the diagonal, online
//      softmax with exp2f (running max m and sum l per row; O rescaled by 2^(m_old - m)).
//   4. P rounded to T in registers times V (ldmatrix .trans) accumulates into O (float32).
//   5. O / l staged in shared memory, written with 16-byte stores, rows scattered back to
//      (token, head).
// Key tiles past the tile's last query position are never loaded (causal early exit).
//
// An FP8 cache (kFp8: float8_e4m3fn, one float32 scale per KV head, fp8_kv.cuh): step 2 gathers
// the raw e4m3 rows (half the bytes) into two raw stages, and after each tile lands the CTA
// converts it (exactly) into one 16-bit swizzled K/V tile pair, which the unchanged MMA code
// reads; the KV head's k_scale is folded into the score scale and its v_scale into 1 / l. The
// shared memory is the 16-bit kernel's: two raw stages and one converted pair take as many
// bytes as two 16-bit stages. Without kFp8 the code is the 16-bit kernel's.
// Torch-free: the launcher is declared in paged_prefill.h, bound in paged_prefill_binding.cpp.
// compile-check: no-spill
#include <float.h>

#include <type_traits>

#include "common.cuh"
#include "fp8_kv.cuh"
#include "paged_prefill.h"

namespace p04 {


// The block-table gather of one K/V tile: which rows this thread copies and their cache slots.
// kElemBytes: 2 for a 16-bit cache (copied into swizzled tiles), 1 for e4m3 (raw rows).
template <int BN, int D, int NTHREADS, int kElemBytes = 2>
struct KVGather {
  static constexpr int kChunksPerRow = D * kElemBytes / 16;  // 16-byte chunks per key row
  static constexpr int kRowsPerPass = NTHREADS / kChunksPerRow;  // key rows per CTA-wide pass
  static constexpr int kPasses = BN / kRowsPerPass;
  static_assert(NTHREADS % kChunksPerRow == 0 && BN % kRowsPerPass == 0, "uneven tile copy");
  static_assert(kRowsPerPass % 8 == 0, "a pass must keep row % 8, hence the swizzle, fixed");

  // Slot of key n0 + row(i) for each pass i, or -1 past the context (zero-filled, not read).
  static __device__ __forceinline__ void slots(int (&s)[kPasses], const int* bt, int n0, int ctx,
                                               int max_blocks, int log2_bs, int tid) {
    const int row = tid / kChunksPerRow;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int pos = n0 + row + i * kRowsPerPass;
      const int blk = pos >> log2_bs;
      s[i] = (pos < ctx && blk < max_blocks)
                 ? (__ldg(bt + blk) << log2_bs) + (pos & ((1 << log2_bs) - 1))
                 : -1;
    }
  }

  // cp.async the K and V rows of one tile into their swizzled shared tiles (BN x D each).
  template <typename T>
  static __device__ __forceinline__ void copy(T* s_k, T* s_v, const T* k, const T* v,
                                              const int (&s)[kPasses], int64_t slot_stride,
                                              int tid) {
    const int row = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 8;
    const uint32_t dk = smem_addr(s_k + swizzle<D>(row, col));
    const uint32_t dv = smem_addr(s_v + swizzle<D>(row, col));
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = s[i] >= 0;
      const int64_t off = valid ? static_cast<int64_t>(s[i]) * slot_stride + col : 0;
      const uint32_t step = i * kRowsPerPass * D * sizeof(T);
      cp_async16(dk + step, k + off, valid);
      cp_async16(dv + step, v + off, valid);
    }
  }

  // cp.async the e4m3 K and V rows of one tile, unswizzled: row r at r * D bytes.
  static __device__ __forceinline__ void copy_raw(fp8_t* s_k, fp8_t* s_v, const fp8_t* k,
                                                  const fp8_t* v, const int (&s)[kPasses],
                                                  int64_t slot_stride, int tid) {
    const int row = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 16;
    const uint32_t dk = smem_addr(s_k + row * D + col);
    const uint32_t dv = smem_addr(s_v + row * D + col);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = s[i] >= 0;
      const int64_t off = valid ? static_cast<int64_t>(s[i]) * slot_stride + col : 0;
      const uint32_t step = i * kRowsPerPass * D;
      cp_async16(dk + step, k + off, valid);
      cp_async16(dv + step, v + off, valid);
    }
  }
};

// The CTA converts one raw e4m3 K/V tile pair (BN rows of D bytes each, K then V) into the
// swizzled 16-bit pair at s_kv (K tile, then V tile): 16 bytes in, two 16-byte chunks out.
template <typename T, int BN, int D, int NTHREADS>
__device__ __forceinline__ void convert_fp8_tiles(T* s_kv, const fp8_t* raw, int tid) {
  constexpr int kRawChunks = D / 16;                       // per row
  constexpr int kTileChunks = BN * kRawChunks;             // per tile
  static_assert((2 * kTileChunks) % NTHREADS == 0, "uneven tile conversion");
#pragma unroll
  for (int i = 0; i < 2 * kTileChunks / NTHREADS; ++i) {
    const int c = tid + i * NTHREADS;
    const int kv = c / kTileChunks, cc = c % kTileChunks;
    const int row = cc / kRawChunks, col = (cc % kRawChunks) * 16;
    uint4 lo, hi;
    fp8x16_to_16bit<T>(*reinterpret_cast<const uint4*>(raw + c * 16), lo, hi);
    T* dst = s_kv + kv * BN * D;
    *reinterpret_cast<uint4*>(dst + swizzle<D>(row, col)) = lo;
    *reinterpret_cast<uint4*>(dst + swizzle<D>(row, col + 8)) = hi;
  }
}

template <typename T, int D, int NWARPS, int MT, int BN, bool kFp8 = false>
__global__ void __launch_bounds__(NWARPS * 32, 2)
    paged_prefill_kernel(const std::conditional_t<kFp8, PrefillFp8Params, PrefillParams> p) {
  constexpr int WROWS = 16 * NWARPS;  // packed rows of one m-tile across all warps
  constexpr int BM = WROWS * MT;      // packed rows per CTA
  constexpr int NTHREADS = NWARPS * 32;
  constexpr int KSTEPS = D / 16;  // k16 steps of Q K^T
  constexpr int STILES = BN / 8;  // 8-key column tiles of S
  constexpr int OTILES = D / 8;   // 8-wide column tiles of O
  constexpr bool kQInRegs = (MT == 1);
  constexpr int kStageElems = 2 * BN * D;  // K tile then V tile
  constexpr int RB = D * 2;                // bytes per tile row
  using Gather = KVGather<BN, D, NTHREADS, kFp8 ? 1 : 2>;
  using C = std::conditional_t<kFp8, fp8_t, T>;  // the cache's element
  static_assert(!kQInRegs || BM <= 2 * BN, "MT = 1 stages the Q tile in K/V stage 1");

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int kvh = blockIdx.y;
  const int G = p.group;

  // ---- which (sequence, tile) this CTA owns: a scan of per-sequence tile counts ------------
  // Every warp runs the same scan (cu_seqlens_q is tiny and L1-resident after the first warp),
  // so the answer needs neither shared memory nor a barrier.
  int seq = -1, tile = 0;
  {
    const int want = blockIdx.x;
    int base = 0;  // tiles of the sequences before this chunk of 32
    for (int i0 = 0; i0 < p.num_seqs; i0 += 32) {
      const int i = i0 + lane;
      int n_tiles = 0;
      if (i < p.num_seqs) {
        const int len = __ldg(p.cu_seqlens_q + i + 1) - __ldg(p.cu_seqlens_q + i);
        n_tiles = len > 0 ? (len * G + BM - 1) / BM : 0;
      }
      int incl = n_tiles;  // inclusive prefix sum over the warp
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (want < base + total) {  // warp-uniform
        const int hit = __ffs(__ballot_sync(0xffffffffu, want < base + incl)) - 1;
        seq = i0 + hit;
        // The sequence's tiles run last-first: the tile with the most keys starts earliest.
        tile = __shfl_sync(0xffffffffu, incl, hit) - 1 - (want - base);
        break;
      }
      base += total;
    }
  }
  if (seq < 0) return;  // past the real tile count (the grid is an upper bound); CTA-uniform

  const int q_start = __ldg(p.cu_seqlens_q + seq);
  const int q_len = __ldg(p.cu_seqlens_q + seq + 1) - q_start;
  const int ctx = __ldg(p.context_lens + seq);
  const int* bt = p.block_tables + static_cast<int64_t>(seq) * p.bt_stride;
  const int rows_total = q_len * G;               // packed rows of this sequence
  const int row_start = tile * BM;                // this CTA's first packed row
  const int rows_valid = rows_total - row_start;  // > 0
  const int pos_offset = ctx - q_len;             // position of query token 0
  const int tok_first = row_start / G;
  const int tok_last = (min(rows_total, row_start + BM) - 1) / G;
  // Keys 0..pos_offset + tok_last are needed; tiles after that are never touched.
  const int n_blocks = pos_offset + tok_last + 1 > 0 ? (pos_offset + tok_last + BN) / BN : 0;
  // Tiles whose last key is at most the first row's position need no causal mask.
  const int unmasked_until = pos_offset + tok_first;  // largest key position every row sees

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  // 16-bit cache: two K/V stages at s_kv. FP8: one converted pair at s_kv (where an MT = 1
  // kernel stages Q first), then two raw e4m3 stages.
  T* const s_kv = kQInRegs ? smem : smem + BM * D;
  T* const s_q = kQInRegs ? smem + (kFp8 ? 0 : kStageElems) : smem;
  T* const s_o = smem;  // MT = 1: stage 0 after the loop; MT = 2: Q's space (own rows only)
  fp8_t* const s_raw = reinterpret_cast<fp8_t*>(s_kv + kStageElems);  // FP8 only

  const T* q = static_cast<const T*>(p.q);
  const C* kc = static_cast<const C*>(p.k_cache) + static_cast<int64_t>(kvh) * D;
  const C* vc = static_cast<const C*>(p.v_cache) + static_cast<int64_t>(kvh) * D;

  // ---- prologue: Q tile (gathered as (token, head) rows) and K/V tile 0 in one group --------
  {
    constexpr int kChunksPerRow = D / 8;
    constexpr int kRowsPerPass = NTHREADS / kChunksPerRow;
    const int row = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 8;
    const uint32_t dst = smem_addr(s_q + swizzle<D>(row, col));
#pragma unroll
    for (int i = 0; i < BM / kRowsPerPass; ++i) {
      const int r = row + i * kRowsPerPass;
      const bool valid = r < rows_valid;
      const int tok = (row_start + r) / G;
      const int h = row_start + r - tok * G;
      const int64_t off = valid ? static_cast<int64_t>(q_start + tok) * p.q_tok_stride +
                                      static_cast<int64_t>(kvh * G + h) * p.q_head_stride + col
                                : 0;
      cp_async16(dst + i * kRowsPerPass * RB, q + off, valid);
    }
  }
  int slots[Gather::kPasses];
  Gather::slots(slots, bt, 0, ctx, p.max_blocks, p.log2_block_size, tid);
  if (n_blocks > 0) {
    if constexpr (kFp8) {
      Gather::copy_raw(s_raw, s_raw + BN * D, kc, vc, slots, p.slot_stride, tid);
    } else {
      Gather::copy(s_kv, s_kv + BN * D, kc, vc, slots, p.slot_stride, tid);
    }
  }
  cp_async_commit();
  if (n_blocks > 1) Gather::slots(slots, bt, BN, ctx, p.max_blocks, p.log2_block_size, tid);
  cp_async_wait<0>();
  __syncthreads();

  // ldmatrix lane offsets in bytes (see swizzle_lane): A rows (lane & 15), chunk (lane >> 4);
  // K as the n-major B operand: rows (lane & 7) + 8 (lane >> 4), chunk (lane >> 3) & 1;
  // V as B through .trans: rows (lane & 7) + 8 ((lane >> 3) & 1), chunk lane >> 4.
  const uint32_t a_lane = swizzle_lane<RB>(lane & 15, lane >> 4);
  const uint32_t k_lane = swizzle_lane<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const uint32_t v_lane = swizzle_lane<RB>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
  const uint32_t q_addr = smem_addr(s_q) + warp * 16 * RB;  // + mt * WROWS * RB

  uint32_t q_frag[kQInRegs ? KSTEPS : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) ldsm_x4(q_frag[kk], q_addr + (a_lane ^ (kk * 32)));
    __syncthreads();  // stage 1 (where Q was staged) is free for K/V tile 1
  }

  // Query position of each of this thread's rows: m-tile mt, rr = 0 (row g) / 1 (row g + 8).
  // Rows past the sequence get positions >= ctx: their keys are finite zeros, output dropped.
  int q_pos[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      q_pos[mt][rr] = pos_offset + (row_start + mt * WROWS + warp * 16 + g + rr * 8) / G;
    }
  }

  float o_acc[MT][OTILES][4];
  float row_max[MT][2];  // raw (unscaled) running max of the row's scores
  float row_sum[MT][2];  // this thread's share of the row sum; quad-reduced at the end
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int i = 0; i < OTILES; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][i][e] = 0.f;
    }
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  float scale_log2 = p.softmax_scale * kLog2e;
  if constexpr (kFp8) scale_log2 *= p.k_scale[kvh];  // S = s_k (Q K_e4m3^T)

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb & 1;
    if (nb + 1 < n_blocks) {
      if constexpr (kFp8) {
        fp8_t* dst = s_raw + (stage ^ 1) * 2 * BN * D;
        Gather::copy_raw(dst, dst + BN * D, kc, vc, slots, p.slot_stride, tid);
      } else {
        T* dst = s_kv + (stage ^ 1) * kStageElems;
        Gather::copy(dst, dst + BN * D, kc, vc, slots, p.slot_stride, tid);
      }
      // Block-table reads for tile nb + 2: in flight while tile nb is multiplied.
      if (nb + 2 < n_blocks) {
        Gather::slots(slots, bt, (nb + 2) * BN, ctx, p.max_blocks, p.log2_block_size, tid);
      }
    }
    cp_async_commit();  // empty on the last tile, which keeps the wait count uniform
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (kFp8) {  // the landed raw stage -> the 16-bit pair (exact)
      convert_fp8_tiles<T, BN, D, NTHREADS>(s_kv, s_raw + stage * 2 * BN * D, tid);
      __syncthreads();
    }

    const uint32_t k_addr = smem_addr(s_kv + (kFp8 ? 0 : stage) * kStageElems);
    const uint32_t v_addr = k_addr + BN * RB;
    const int n0 = nb * BN;

    // S = Q K^T: (16 MT rows) x BN keys per warp, float32.
    float s[MT][STILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < STILES; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      uint32_t qf[MT][4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[0][e] = q_frag[kk][e];
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldsm_x4(qf[mt], q_addr + mt * WROWS * RB + (a_lane ^ (kk * 32)));
        }
      }
#pragma unroll
      for (int np = 0; np < STILES / 2; ++np) {
        uint32_t kf[4];
        ldsm_x4(kf, k_addr + np * 16 * RB + (k_lane ^ (kk * 32)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(s[mt][2 * np], qf[mt], kf[0], kf[1]);
          mma_m16n8k16<T>(s[mt][2 * np + 1], qf[mt], kf[2], kf[3]);
        }
      }
    }

    // Bottom-right causal mask, only on tiles whose last key lies past some row's position.
    // Keys past the context are covered: every real row's position is below ctx.
    if (n0 + BN - 1 > unmasked_until) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < STILES; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + j * 8 + 2 * t + (e & 1);
            if (col > q_pos[mt][e >> 1]) s[mt][j][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax for rows g (rr = 0) and g + 8 (rr = 1) of each m-tile.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float mx = row_max[mt][rr];
#pragma unroll
        for (int j = 0; j < STILES; ++j) {
          mx = fmaxf(mx, fmaxf(s[mt][j][2 * rr], s[mt][j][2 * rr + 1]));
        }
        mx = quad_max(mx);
        // A row with every key so far masked keeps max -inf: subtract 0 so exp2 gives 0, not NaN.
        const float mx_scaled = (mx == -INFINITY) ? 0.f : mx * scale_log2;
        const float correction = exp2f(row_max[mt][rr] * scale_log2 - mx_scaled);
        row_max[mt][rr] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < STILES; ++j) {
          s[mt][j][2 * rr] = exp2f(fmaf(s[mt][j][2 * rr], scale_log2, -mx_scaled));
          s[mt][j][2 * rr + 1] = exp2f(fmaf(s[mt][j][2 * rr + 1], scale_log2, -mx_scaled));
          sum += s[mt][j][2 * rr] + s[mt][j][2 * rr + 1];
        }
        row_sum[mt][rr] = row_sum[mt][rr] * correction + sum;
#pragma unroll
        for (int i = 0; i < OTILES; ++i) {
          o_acc[mt][i][2 * rr] *= correction;
          o_acc[mt][i][2 * rr + 1] *= correction;
        }
      }
    }

    // O += P V: two adjacent 8-key column tiles of S are the A fragment of one 16-key step.
#pragma unroll
    for (int kc16 = 0; kc16 < BN / 16; ++kc16) {
      uint32_t pf[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pf[mt][0] = Pack2<T>::from_floats(s[mt][2 * kc16][0], s[mt][2 * kc16][1]);
        pf[mt][1] = Pack2<T>::from_floats(s[mt][2 * kc16][2], s[mt][2 * kc16][3]);
        pf[mt][2] = Pack2<T>::from_floats(s[mt][2 * kc16 + 1][0], s[mt][2 * kc16 + 1][1]);
        pf[mt][3] = Pack2<T>::from_floats(s[mt][2 * kc16 + 1][2], s[mt][2 * kc16 + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldsm_x4_trans(vf, v_addr + kc16 * 16 * RB + (v_lane ^ (dp * 32)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(o_acc[mt][2 * dp], pf[mt], vf[0], vf[1]);
          mma_m16n8k16<T>(o_acc[mt][2 * dp + 1], pf[mt], vf[2], vf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // ---- epilogue: O / l via shared memory (each warp its own rows), 16-byte scattered stores ---
  T* o = static_cast<T*>(p.o);
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv_sum[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const float l = quad_sum(row_sum[mt][rr]);
      if constexpr (kFp8) {  // O = s_v (P V_e4m3) / l
        inv_sum[rr] = l > 0.f ? p.v_scale[kvh] / l : 0.f;
      } else {
        inv_sum[rr] = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key (bad metadata) gets zeros
      }
    }
    const int r_base = mt * WROWS + warp * 16;
#pragma unroll
    for (int i = 0; i < OTILES; ++i) {
      const int c = i * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(s_o + swizzle<D>(r_base + g, c)) =
          Pack2<T>::from_floats(o_acc[mt][i][0] * inv_sum[0], o_acc[mt][i][1] * inv_sum[0]);
      *reinterpret_cast<uint32_t*>(s_o + swizzle<D>(r_base + g + 8, c)) =
          Pack2<T>::from_floats(o_acc[mt][i][2] * inv_sum[1], o_acc[mt][i][3] * inv_sum[1]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * kChunksPerRow / 32; ++i) {
      const int chunk = lane + i * 32;
      const int r = r_base + chunk / kChunksPerRow;
      const int c = (chunk % kChunksPerRow) * 8;
      if (r < rows_valid) {
        const int tok = (row_start + r) / G;
        const int h = row_start + r - tok * G;
        T* dst = o + static_cast<int64_t>(q_start + tok) * p.o_tok_stride +
                 static_cast<int64_t>(kvh * G + h) * p.o_head_stride + c;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(s_o + swizzle<D>(r, c));
      }
    }
  }
}

template <typename T, int D, int NWARPS, int MT, int BN, bool kFp8, typename P>
cudaError_t launch(const P& p, int64_t total_rows, int n_kv_heads, cudaStream_t stream) {
  constexpr int BM = 16 * NWARPS * MT;
  // FP8: one converted 16-bit pair plus two raw e4m3 pairs, the bytes of two 16-bit pairs
  constexpr size_t smem_bytes = ((MT == 1 ? 0 : BM * D) + 2 * 2 * BN * D) * sizeof(T);
  auto kernel = paged_prefill_kernel<T, D, NWARPS, MT, BN, kFp8>;
  if constexpr (smem_bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  // sum_i ceil(rows_i / BM) <= ceil(sum_i rows_i / BM) + N - 1: a bound from host ints only.
  const int64_t tiles = (total_rows + BM - 1) / BM + p.num_seqs - 1;
  if (tiles <= 0 || tiles >= INT32_MAX || n_kv_heads <= 0 || n_kv_heads > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(n_kv_heads));
  kernel<<<grid, NWARPS * 32, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, bool kFp8, typename P>
cudaError_t dispatch_head_dim(const P& p, int head_dim, int64_t total_rows, int n_kv_heads,
                              cudaStream_t stream) {
  // D = 64: 4 warps x 2 m-tiles = 128 packed rows, 64-key tiles, Q re-read from shared (48 KB).
  // D = 128: 4 warps x 1 m-tile = 64 rows with Q in registers, 64-key tiles (64 KB): two m-tiles
  // a warp at D = 128 would need more than 255 registers.
  if (head_dim == 64) return launch<T, 64, 4, 2, 64, kFp8>(p, total_rows, n_kv_heads, stream);
  if (head_dim == 128) return launch<T, 128, 4, 1, 64, kFp8>(p, total_rows, n_kv_heads, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_paged_prefill(const PrefillParams& p, const float* k_scale,
                                 const float* v_scale, bool fp16, int head_dim,
                                 int64_t total_rows, int n_kv_heads, cudaStream_t stream) {
  if (k_scale != nullptr) {
    PrefillFp8Params f;
    static_cast<PrefillParams&>(f) = p;
    f.k_scale = k_scale;
    f.v_scale = v_scale;
    return fp16 ? dispatch_head_dim<__half, true>(f, head_dim, total_rows, n_kv_heads, stream)
                : dispatch_head_dim<__nv_bfloat16, true>(f, head_dim, total_rows, n_kv_heads,
                                                         stream);
  }
  return fp16 ? dispatch_head_dim<__half, false>(p, head_dim, total_rows, n_kv_heads, stream)
              : dispatch_head_dim<__nv_bfloat16, false>(p, head_dim, total_rows, n_kv_heads,
                                                        stream);
}

}  // namespace p04

