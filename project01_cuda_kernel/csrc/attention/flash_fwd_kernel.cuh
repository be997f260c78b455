// FlashAttention-2 forward: O = softmax(scale * Q K^T) V and the row log-sum-exp, one pass.
//
// One CTA owns BM = 16 * NWARPS * MT rows of Q for one (batch, head); warp w owns MT tiles of 16
// rows (rows 16w + 16 NWARPS mt + 0..15, mt < MT).
//   1. Q tile -> shared (cp.async). MT = 1: Q -> registers as mma A fragments (ldmatrix), kept
//      for the CTA. MT = 2 (FlashAttention-2's layout): Q stays in shared memory and is re-read
//      each step, which leaves registers for twice the rows, so every K/V fragment a warp loads
//      from shared memory feeds two MMAs: half the shared-memory traffic per FLOP. Head dim 256
//      (MT = 1, 8 warps): Q is re-read from shared memory too; its 64 registers of fragments
//      would not fit next to the 128-float O accumulator (FwdQInRegs).
//   2. K/V tiles of BN rows stream through two shared-memory stages: block n+1 is in flight
//      (cp.async) while block n is multiplied.
//   3. S = Q K^T (16 x BN per warp, float32), masked (sequence tail, causal diagonal), then the
//      online softmax: running row max m and row sum l in float32, O rescaled by exp(m_old - m).
//   4. P (converted to T in registers: the S accumulator layout *is* the A fragment layout) times
//      V (ldmatrix .trans) accumulates into O.
//   5. O / l is staged through shared memory for 16-byte coalesced stores; lse = m * scale + log l.
// Causal (row i sees keys j <= i + causal_offset: 0 top-left, Sk - Sq bottom-right): key blocks
// past the CTA's last row's last key are never loaded (none at all for a CTA whose rows all see
// no key: it writes O = 0 and lse = +inf), and only blocks that cross the diagonal pay for the
// mask.
// Grouped-query attention: the CTA of query head h reads k/v head h / h_h_k_ratio.
// Sliding window (LOCAL; flash_api.h: row i sees keys j with window_lo <= j - i <= window_hi):
// the CTA loads only the key blocks its rows can see, from the block holding key
// m0 + window_lo to the one holding key m0 + BM - 1 + window_hi (none: O = 0, lse = +inf), and
// only blocks that cross either edge of the band pay for the mask. Soft-capping (SOFTCAP, only
// with LOCAL): S becomes tanh(S * softmax_scale / softcap), and softcap takes softmax_scale's
// place in the softmax and the lse. Without LOCAL and SOFTCAP (the default instances) the code
// is what it was before they existed: every added branch is a compile-time constant.
// Variable length (VARLEN; flash_api.h): blockIdx.z is the sequence; its start rows and lengths
// come from cu_seqlens (device memory), a CTA whose first row is at or past its sequence's
// length exits at once (the grid covers the longest sequence), rows and keys past the end are
// masked as the batch's tails are, the causal offset and window are the sequence's own
// (bottom-right), and lse is (H, total_q). Without VARLEN the lengths and offsets are the
// params' (the same loads as before), the start rows 0.
// compile-check: no-spill
#pragma once

#include <float.h>

#include "attention/flash_api.h"
#include "attention/flash_common.cuh"

namespace flash {

// Whether the CTA keeps Q in registers (MT = 1 up to head dim 128) or re-reads it from shared
// memory (MT = 2; and MT = 1 at head dim 256, where Q's fragments would be 64 more registers
// next to a 128-float O accumulator).
template <int D, int MT>
struct FwdQInRegs {
  static constexpr bool value = MT == 1 && D <= 128;
};

// Minimum CTAs per SM for __launch_bounds__: 2 with 4 warps (255 registers a thread), 1 with 8.
template <typename T, int D, int NWARPS, int MT, int BN, bool CAUSAL, bool LOCAL, bool SOFTCAP,
          bool VARLEN>
__global__ void __launch_bounds__(NWARPS * 32, 8 / NWARPS) flash_fwd_kernel(const FwdParams p) {
  constexpr int WROWS = 16 * NWARPS;  // rows covered by one m-tile of every warp
  constexpr int BM = WROWS * MT;
  constexpr int NTHREADS = NWARPS * 32;
  constexpr int KCHUNKS = D / 16;  // k-steps of Q K^T
  constexpr int STILES = BN / 8;   // 8-wide column tiles of S per m-tile
  constexpr int OTILES = D / 8;    // 8-wide column tiles of O per m-tile
  constexpr bool kQInRegs = FwdQInRegs<D, MT>::value;
  constexpr int kStageElems = 2 * BN * D;  // K then V, BN x D each
  static_assert(!kQInRegs || BM <= 2 * BN, "the Q tile is staged in the second K/V stage");
  static_assert(!(CAUSAL && LOCAL), "LOCAL folds the causal mask into window_hi");
  static_assert(!SOFTCAP || LOCAL, "soft-capping runs in the LOCAL instances");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  // Q in registers: [stage 0][stage 1], Q staged in stage 1 before the loop, O staged in stage 0
  // after. Q in shared memory: [Q][stage 0][stage 1], O staged in Q's space after the loop.
  T* const s_kv = kQInRegs ? smem : smem + BM * D;
  T* const s_q = kQInRegs ? smem + kStageElems : smem;
  T* const s_o = smem;  // Q in registers: stage 0; else the Q tile's space

  // Heavy blocks first (causal; a window clipped by causal or the sequence start, likewise).
  const int m_block = (CAUSAL || LOCAL) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // row within an 8-row group of a fragment
  const int t = lane % 4;  // column pair within a fragment

  const int m0 = m_block * BM;
  // This CTA's sequence: lengths, first rows in the packed tensors (VARLEN), mask offsets.
  int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  int causal_offset = p.causal_offset, window_lo = p.window_lo, window_hi = p.window_hi;
  int start_q = 0, start_k = 0;
  if constexpr (VARLEN) {
    varlen_range(p.cu_seqlens_q, batch, start_q, seqlen_q);
    if (m0 >= seqlen_q) return;  // past this sequence's rows (the grid fits the longest)
    varlen_range(p.cu_seqlens_k, batch, start_k, seqlen_k);
    varlen_offsets(p, seqlen_q, seqlen_k, causal_offset, window_lo, window_hi);
  }
  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
               (m0 + start_q) * p.q_row_stride;
  const int head_k = kv_head_of(head, p.h_h_k_ratio_inv);  // grouped-query attention: this head's k/v head
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride + head_k * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride + head_k * p.v_head_stride;
  if constexpr (VARLEN) {
    k += start_k * p.k_row_stride;
    v += start_k * p.v_row_stride;
  }

  int n_blocks = (seqlen_k + BN - 1) / BN;
  // Causal: the CTA's last row (at most m0 + BM - 1) sees keys up to m0 + BM - 1 + causal_offset;
  // no block at all when that is negative (every row of the CTA fully masked).
  if (CAUSAL) n_blocks = min(n_blocks, max(0, (m0 + BM + causal_offset + BN - 1) / BN));
  // Window: key blocks n_begin .. n_blocks - 1 hold every key the CTA's rows can see, from
  // m0 + window_lo (its first row's first key) to m0 + BM - 1 + window_hi (its last row's last).
  // None (n_begin >= n_blocks): the loop runs zero times and the rows get O = 0, lse = +inf;
  // the prologue then loads block 0, which exists, instead of one past the keys.
  int n_begin = 0;
  if constexpr (LOCAL) {
    n_blocks = min(n_blocks, max(0, (m0 + BM + window_hi + BN - 1) / BN));
    n_begin = max(0, m0 + window_lo) / BN;
    if (n_begin >= n_blocks) n_begin = n_blocks = 0;
  }

  // Prologue: Q and the first K/V block in one group.
  load_tile_async<BM, D, NTHREADS>(s_q, q, p.q_row_stride, seqlen_q - m0, tid);
  if constexpr (LOCAL) {
    const int n1 = n_begin * BN;
    load_tile_async<BN, D, NTHREADS>(s_kv, k + n1 * p.k_row_stride, p.k_row_stride,
                                     seqlen_k - n1, tid);
    load_tile_async<BN, D, NTHREADS>(s_kv + BN * D, v + n1 * p.v_row_stride, p.v_row_stride,
                                     seqlen_k - n1, tid);
  } else {
    load_tile_async<BN, D, NTHREADS>(s_kv, k, p.k_row_stride, seqlen_k, tid);
    load_tile_async<BN, D, NTHREADS>(s_kv + BN * D, v, p.v_row_stride, seqlen_k, tid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // ldmatrix lane offsets (bytes, see swz_lane): A operand rows (lane & 15), chunk (lane >> 4);
  // K as B operand (n-major) rows (lane & 7) + 8 (lane >> 4), chunk (lane >> 3) & 1;
  // V as B operand (.trans) rows (lane & 7) + 8 ((lane >> 3) & 1), chunk (lane >> 4).
  constexpr int RB = D * 2;  // bytes per row
  const uint32_t a_lane = swz_lane<RB>(lane & 15, lane >> 4);
  const uint32_t k_lane = swz_lane<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const uint32_t v_lane = swz_lane<RB>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
  const uint32_t q_addr = smem_u32(s_q) + warp * 16 * RB;  // + mt * WROWS * RB

  uint32_t q_frag[kQInRegs ? KCHUNKS : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < KCHUNKS; ++kk) ldmatrix_x4(q_frag[kk], q_addr + (a_lane ^ (kk * 32)));
    __syncthreads();  // stage 1 is free for K/V block 1
  }

  float o_acc[MT][OTILES][4];
  float row_max[MT][2];  // raw (unscaled) scores
  float row_sum[MT][2];  // this thread's partial sums; quad-reduced at the end
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
  // The scale of S in the softmax: softmax_scale, or with soft-capping softcap (S holds
  // tanh(softmax_scale q.k / softcap) then, and the score is softcap times that).
  const float score_scale = SOFTCAP ? p.softcap : p.softmax_scale;
  const float scale_log2 = score_scale * kLog2e;
  // Global row of this thread's first fragment row in m-tile mt: row0 + mt * WROWS (and +8).
  const int row0 = m0 + warp * 16 + g;

  for (int nb = n_begin; nb < n_blocks; ++nb) {
    const int stage = (nb - n_begin) & 1;
    if (nb + 1 < n_blocks) {
      const int n1 = (nb + 1) * BN;
      T* dst = s_kv + (stage ^ 1) * kStageElems;
      load_tile_async<BN, D, NTHREADS>(dst, k + n1 * p.k_row_stride, p.k_row_stride,
                                       seqlen_k - n1, tid);
      load_tile_async<BN, D, NTHREADS>(dst + BN * D, v + n1 * p.v_row_stride, p.v_row_stride,
                                       seqlen_k - n1, tid);
    }
    cp_async_commit();  // an empty group on the last block keeps the wait count uniform
    cp_async_wait<1>();
    __syncthreads();

    const uint32_t k_addr = smem_u32(s_kv + stage * kStageElems);
    const uint32_t v_addr = k_addr + BN * RB;
    const int n0 = nb * BN;

    // S = Q K^T for this warp's MT x 16 rows and BN keys.
    float s[MT][STILES][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < STILES; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KCHUNKS; ++kk) {
      uint32_t qf[MT][4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[0][e] = q_frag[kk][e];
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldmatrix_x4(qf[mt], q_addr + mt * WROWS * RB + (a_lane ^ (kk * 32)));
        }
      }
#pragma unroll
      for (int np = 0; np < STILES / 2; ++np) {
        uint32_t kf[4];
        ldmatrix_x4(kf, k_addr + np * 16 * RB + (k_lane ^ (kk * 32)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(s[mt][2 * np], qf[mt], kf[0], kf[1]);
          mma_16816<T>(s[mt][2 * np + 1], qf[mt], kf[2], kf[3]);
        }
      }
    }

    // Soft-capping: S = tanh(S * softmax_scale / softcap), before the mask (-inf stays -inf).
    if constexpr (SOFTCAP) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < STILES; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][j][e] = softcap_tanh(s[mt][j][e] * p.softcap_in);
        }
      }
    }

    // Mask keys past the end and, on blocks crossing the diagonal (or an edge of the window),
    // keys the query does not see. Window: the block's last key against the CTA's first row's
    // upper bound, its first key against the last row's lower bound (differences, which cannot
    // overflow).
    const bool need_mask =
        (n0 + BN > seqlen_k) || (CAUSAL && n0 + BN - 1 > m0 + causal_offset) ||
        (LOCAL && (n0 + BN - 1 - m0 > window_hi || n0 - (m0 + BM - 1) < window_lo));
    if (need_mask) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < STILES; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = n0 + j * 8 + 2 * t + (e & 1);
            const int row = row0 + mt * WROWS + (e >> 1) * 8;
            if (col >= seqlen_k || (CAUSAL && col > row + causal_offset) ||
                (LOCAL && (col - row > window_hi || col - row < window_lo))) {
              s[mt][j][e] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax, per m-tile rows row0 (rr = 0) and row0 + 8 (rr = 1).
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
        // A row whose keys are all masked so far keeps max -inf; subtract 0 then, so exp gives
        // 0 rather than NaN.
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

    // O += P V. Two 8-column tiles of S form the A fragment of one 16-key step.
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      uint32_t p_frag[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        p_frag[mt][0] = TypeTraits<T>::pack(s[mt][2 * kc][0], s[mt][2 * kc][1]);
        p_frag[mt][1] = TypeTraits<T>::pack(s[mt][2 * kc][2], s[mt][2 * kc][3]);
        p_frag[mt][2] = TypeTraits<T>::pack(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
        p_frag[mt][3] = TypeTraits<T>::pack(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, v_addr + kc * 16 * RB + (v_lane ^ (dp * 32)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<T>(o_acc[mt][2 * dp], p_frag[mt], vf[0], vf[1]);
          mma_16816<T>(o_acc[mt][2 * dp + 1], p_frag[mt], vf[2], vf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  // Epilogue: normalise, stage this warp's rows in shared memory (rows no other warp touches;
  // with Q in registers stage 0 is free after the loop's last barrier), store 16 bytes a lane.
  T* o = static_cast<T*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride;
  float* lse = p.lse + (static_cast<int64_t>(batch) * p.heads + head) * seqlen_q;
  if constexpr (VARLEN) {  // o: this sequence's rows; lse (H, total_q)
    // Read again (volatile: not kept live across the main loop, where registers are short).
    start_q = *reinterpret_cast<const volatile int*>(p.cu_seqlens_q + batch);
    seqlen_q = *reinterpret_cast<const volatile int*>(p.cu_seqlens_q + batch + 1) - start_q;
    o += start_q * p.o_row_stride;
    lse = p.lse + static_cast<int64_t>(head) * p.total_q + start_q;
  }
  constexpr int kChunksPerRow = D / 8;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv_sum[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      row_sum[mt][rr] = quad_sum(row_sum[mt][rr]);
      inv_sum[rr] = row_sum[mt][rr] > 0.f ? 1.f / row_sum[mt][rr] : 0.f;
    }
    const int r_base = mt * WROWS + warp * 16;  // this warp's first row of the m-tile, local
#pragma unroll
    for (int i = 0; i < OTILES; ++i) {
      const int c = i * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(s_o + swz<D>(r_base + g, c)) = TypeTraits<T>::pack(
          o_acc[mt][i][0] * inv_sum[0], o_acc[mt][i][1] * inv_sum[0]);
      *reinterpret_cast<uint32_t*>(s_o + swz<D>(r_base + g + 8, c)) = TypeTraits<T>::pack(
          o_acc[mt][i][2] * inv_sum[1], o_acc[mt][i][3] * inv_sum[1]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * kChunksPerRow / 32; ++i) {
      const int chunk = lane + i * 32;
      const int r = r_base + chunk / kChunksPerRow;
      const int c = (chunk % kChunksPerRow) * 8;
      if (m0 + r < seqlen_q) {
        *reinterpret_cast<uint4*>(o + (m0 + r) * p.o_row_stride + c) =
            *reinterpret_cast<const uint4*>(s_o + swz<D>(r, c));
      }
    }
    if (t == 0) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int row = row0 + mt * WROWS + rr * 8;
        if (row < seqlen_q) {
          lse[row] = row_sum[mt][rr] > 0.f
                         ? row_max[mt][rr] * score_scale + logf(row_sum[mt][rr])
                         : INFINITY;
        }
      }
    }
  }
}

template <typename T, int D, int NWARPS, int MT, int BN, bool CAUSAL, bool LOCAL, bool SOFTCAP,
          bool VARLEN>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  constexpr int BM = 16 * NWARPS * MT;
  constexpr size_t smem_bytes =
      ((FwdQInRegs<D, MT>::value ? 0 : BM * D) + 2 * 2 * BN * D) * sizeof(T);
  static_assert(smem_bytes <= 227 * 1024, "over the opt-in shared memory limit (sm_90)");
  auto kernel = flash_fwd_kernel<T, D, NWARPS, MT, BN, CAUSAL, LOCAL, SOFTCAP, VARLEN>;
  if (smem_bytes > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((p.seqlen_q + BM - 1) / BM, p.heads, p.batch);  // VARLEN: max lengths
  if (grid.x == 0) return cudaSuccess;  // VARLEN with every sequence empty: nothing to write
  kernel<<<grid, NWARPS * 32, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// Four instances per dtype and VARLEN value: no mask, causal, and the local ones (a window,
// causal folded in) without and with soft-capping. A softcap without a window runs a local
// instance with unbounded (or causal) offsets: same masks, one instance fewer per variant.
template <typename T, int D, int NWARPS, int MT, int BN, bool VARLEN>
cudaError_t dispatch_fwd_mask(const FwdParams& p, cudaStream_t stream) {
  if (p.local || p.softcap > 0.f) {
    return p.softcap > 0.f
               ? launch_fwd<T, D, NWARPS, MT, BN, false, true, true, VARLEN>(p, stream)
               : launch_fwd<T, D, NWARPS, MT, BN, false, true, false, VARLEN>(p, stream);
  }
  return p.causal ? launch_fwd<T, D, NWARPS, MT, BN, true, false, false, VARLEN>(p, stream)
                  : launch_fwd<T, D, NWARPS, MT, BN, false, false, false, VARLEN>(p, stream);
}

// Varlen at head dim 128 runs the 16-rows-a-warp variant whatever m_tiles_per_warp says: the
// 32-rows-a-warp one with the per-sequence indexing spills past 255 registers.
template <typename T, int D, int NWARPS, int MT, int BN>
cudaError_t dispatch_fwd_dtype(const FwdParams& p, cudaStream_t stream) {
  if (p.varlen) {
    if constexpr (D == 128 && MT == 2) {
      return dispatch_fwd_mask<T, D, NWARPS, 1, 64, true>(p, stream);
    } else {
      return dispatch_fwd_mask<T, D, NWARPS, MT, BN, true>(p, stream);
    }
  }
  return dispatch_fwd_mask<T, D, NWARPS, MT, BN, false>(p, stream);
}

template <int D, int NWARPS, int MT, int BN>
cudaError_t dispatch_fwd(const FwdParams& p, cudaStream_t stream) {
  if (p.dtype == DType::kFloat16) return dispatch_fwd_dtype<__half, D, NWARPS, MT, BN>(p, stream);
  return dispatch_fwd_dtype<__nv_bfloat16, D, NWARPS, MT, BN>(p, stream);
}

}  // namespace flash
