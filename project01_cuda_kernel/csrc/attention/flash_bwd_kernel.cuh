// FlashAttention-2 backward: dQ, dK, dV from Q, K, V, O, dO and the forward's log-sum-exp.
//
// Pre-pass (flash_bwd_dot_do_o_kernel): Dpre_i = rowsum(dO_i * O_i) in float32, (B, H, Sq).
// Main kernel: one CTA owns BN = 16 * NWARPS keys of one (batch, head) (8 warps, 128 keys by
// default: each dQ atomic then carries the sum over 128 keys, half the atomic traffic of 64, and
// each Q/dO tile is fetched once per 128 keys); warp w owns keys 16w..16w+15 and
// holds their dK and dV (16 x D, float32) in registers for the whole kernel. For each 64-row
// block of queries (two shared-memory stages, cp.async prefetch of the next block):
//   S^T  = K_w Q^T                      (16 x 64 per warp; K is the A operand, Q the B operand)
//   P^T  = exp(scale * S^T - lse)       (recomputed from the saved log-sum-exp: no S x S tensor)
//   dP^T = V_w dO^T
//   dV  += P^T dO                       (P^T's accumulator layout is reused as the A fragment)
//   dS^T = P^T * (dP^T - Dpre)
//   dK  += dS^T Q                       (times scale once at the end)
//   dQ  += scale * dS K                 (dS^T goes through shared memory so each warp can take 16
//                                        query rows; float32 atomicAdd into dq_accum)
// Working on S^T rather than S keeps every product an mma with the operand already in the layout
// ldmatrix gives: no register transposes.
//
// Head dim 256 (BwdSplitD): dK and dV of 16 keys x 256 columns would be 256 floats a thread, so
// the 8 warps pair up. BN = 64 keys a CTA; warp w takes keys 16 (w % 4) + 0..15 and half
// h = w / 4: it computes S^T, P^T, dP^T, dS^T for query rows 32h .. 32h + 31 of the step (16 x 32,
// the k loops over all 256 columns), writes P^T and dS^T to BN x BM shared tiles, and after a
// barrier accumulates dV += P^T dO and dK += dS^T Q over all BM rows for columns 128h .. 128h +
// 127 (2 x 64 floats a thread), with P^T and dS^T read back by ldmatrix. dQ is as above (4 row
// groups x 2 column slices of 128). Q/dO have one shared stage (64 KiB): the next block is
// loaded after a third barrier, while dQ (which reads only dS^T and K) is computed.
// Shared memory: K, V 64 KiB, Q/dO 64 KiB, dS^T and P^T 16 KiB, lse/Dpre 512 B: 147,968 bytes.
//
// Grouped-query attention: the CTA of query head h reads K and V of k/v head h / h_h_k_ratio and
// writes its dK, dV to query head h of dk/dv (B, H, Sk, D), which the caller sums over each group
// (FlashAttention-2's design: no atomics across the CTAs of a group). Causal: key j is seen by
// query rows i >= j - causal_offset, so the CTA starts at the query block holding the first row
// that sees its first key (none left: dK = dV = 0); rows that see no key at all have lse = +inf
// from the forward, so their P is 0 (and masked anyway).
// Sliding window (LOCAL; flash_api.h: row i sees key j iff window_lo <= j - i <= window_hi): the
// CTA walks only the query blocks holding rows n0 - window_hi .. n0 + BN - 1 - window_lo, the
// rows that see one of its keys (none: dK = dV = 0), and masks only blocks crossing an edge.
// Soft-capping (SOFTCAP, only with LOCAL): S^T becomes t = tanh(S^T * softmax_scale / softcap),
// P = exp(softcap * t - lse), and dS^T is multiplied by 1 - t^2 (the derivative of the cap, in
// units of softmax_scale q.k, so the final scaling by softmax_scale stays). 1 - t^2 waits in the
// dS^T tile of shared memory (as float16: it lies in [0, 1]; relative error 2^-12, below the
// rounding dS gets for the products anyway) while dV and dP^T are computed: this kernel has no
// registers to spare for it, and each thread reads back only the elements it wrote.
// Variable length (VARLEN; flash_api.h): blockIdx.z is the sequence, its start rows and lengths
// read from cu_seqlens; a CTA whose first key is at or past its sequence's key count exits (the
// grid fits the longest), the causal offset and window are the sequence's own (bottom-right),
// lse, dpre are (H, total_q) and dq_accum (H, total_q, D). The pre-pass runs over the packed
// rows as one sequence of total_q (its launch passes batch 1, seqlen_q total_q).
// compile-check: no-spill
#pragma once

#include "attention/flash_api.h"
#include "attention/flash_common.cuh"

namespace flash {

// Dpre = rowsum(dO * O): D / 8 threads per row, 16 bytes each, reduced with shuffles.
template <typename T, int D>
__global__ void __launch_bounds__(256) flash_bwd_dot_do_o_kernel(const BwdParams p) {
  constexpr int kThreadsPerRow = D / 8;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kThreadsPerRow;
  const int col = (threadIdx.x % kThreadsPerRow) * 8;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seqlen_q;
  float acc = 0.f;
  if (row < rows) {
    const int i = static_cast<int>(row % p.seqlen_q);
    const int64_t bh = row / p.seqlen_q;
    const int h = static_cast<int>(bh % p.heads);
    const int b = static_cast<int>(bh / p.heads);
    const uint4 o4 = *reinterpret_cast<const uint4*>(
        static_cast<const T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride +
        i * p.o_row_stride + col);
    const uint4 d4 = *reinterpret_cast<const uint4*>(
        static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
        i * p.do_row_stride + col);
    const uint32_t* ow = reinterpret_cast<const uint32_t*>(&o4);
    const uint32_t* dw = reinterpret_cast<const uint32_t*>(&d4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = TypeTraits<T>::unpack(ow[j]);
      const float2 c = TypeTraits<T>::unpack(dw[j]);
      acc += a.x * c.x + a.y * c.y;
    }
  }
#pragma unroll
  for (int off = kThreadsPerRow / 2; off > 0; off /= 2) {
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
  }
  if (row < rows && threadIdx.x % kThreadsPerRow == 0) p.dpre[row] = acc;
}

__device__ __forceinline__ void atomic_add_f32x2(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// The backward's tile shape per head dim. Up to 128 (BwdSplitD false): warp w owns keys
// 16w..16w+15 and all D columns of their dK, dV (2 x D / 8 x 4 floats a thread); Q/dO go
// through two shared-memory stages. Head dim 256 (true): 2 x 128 floats would not fit, so the
// warps pair up: warp w owns keys 16 (w % (NWARPS / 2)) + 0..15 and the half w / (NWARPS / 2)
// of D for dK, dV (2 x 64 floats), and the same half of the query rows of a step for S^T and
// dP^T; P^T and dS^T go through shared memory to the partner warp. One Q/dO stage: the next
// block is loaded while dQ is computed (two stages, 128 KiB, would not fit next to K and V in
// an A100's 163 KiB).
template <int D>
struct BwdSplitD {
  static constexpr bool value = D > 128;
};

template <typename T, int D, int NWARPS, bool CAUSAL, bool LOCAL, bool SOFTCAP, bool VARLEN>
__global__ void __launch_bounds__(NWARPS * 32, 8 / NWARPS) flash_bwd_kernel(const BwdParams p) {
  constexpr bool kSplitD = BwdSplitD<D>::value;
  constexpr int NTHREADS = NWARPS * 32;
  constexpr int KGROUPS = kSplitD ? NWARPS / 2 : NWARPS;  // 16-key groups of warps
  constexpr int BN = 16 * KGROUPS;  // keys per CTA
  constexpr int BM = 64;           // query rows per step
  constexpr int RB = D * 2;        // bytes per row of a (., D) tile
  constexpr int SRB = BM * 2;      // bytes per row of the dS^T tile (BN x BM)
  constexpr int QW = kSplitD ? BM / 2 : BM;  // query rows of S^T per warp
  constexpr int QTILES = QW / 8;   // 8-wide column tiles of S^T per warp
  constexpr int DW = kSplitD ? D / 2 : D;  // columns of dK, dV per warp
  constexpr int DTILES = DW / 8;   // 8-wide column tiles of dK, dV per warp
  constexpr int kStages = kSplitD ? 1 : 2;  // Q/dO stages
  static_assert(NWARPS % (BM / 16) == 0, "dQ: warps split into BM / 16 row groups");
  static_assert(!(CAUSAL && LOCAL), "LOCAL folds the causal mask into window_hi");
  static_assert(!SOFTCAP || LOCAL, "soft-capping runs in the LOCAL instances");

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* const s_k = reinterpret_cast<T*>(smem_raw);  // BN x D
  T* const s_v = s_k + BN * D;                     // BN x D
  T* const s_qdo = s_v + BN * D;                   // kStages x (Q, dO), BM x D each
  T* const s_ds = s_qdo + 2 * kStages * BM * D;    // BN x BM, dS^T
  T* const s_p = s_ds + BN * BM;                   // kSplitD: BN x BM, P^T
  float* const s_lse = reinterpret_cast<float*>(s_ds + (kSplitD ? 2 : 1) * BN * BM);  // per stage
  float* const s_dpre = s_lse + kStages * BM;                                         // per stage
  constexpr int kQdoStage = 2 * BM * D;

  const int n_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int n0 = n_block * BN;
  // kSplitD: this warp's 16-key group kg and half dhalf (of a step's query rows for S^T, of D
  // for dK, dV).
  const int kg = kSplitD ? warp % KGROUPS : warp;
  const int dhalf = kSplitD ? warp / KGROUPS : 0;
  // This CTA's sequence: lengths, first rows in the packed tensors (VARLEN), mask offsets.
  // Without VARLEN these are references to the params themselves (the kernels read p.seqlen_q
  // etc. exactly as before: a local copy changed the default instances' machine code).
  int vl_seqlen_q = 0, vl_seqlen_k = 0, vl_causal_offset = 0, vl_window_lo = 0, vl_window_hi = 0;
  int start_q = 0, start_k = 0;
  if constexpr (VARLEN) {
    varlen_range(p.cu_seqlens_k, batch, start_k, vl_seqlen_k);
    if (n0 >= vl_seqlen_k) return;  // past this sequence's keys (the grid fits the longest)
    varlen_range(p.cu_seqlens_q, batch, start_q, vl_seqlen_q);
    varlen_offsets(p, vl_seqlen_q, vl_seqlen_k, vl_causal_offset, vl_window_lo, vl_window_hi);
  }
  const int& seqlen_q = VARLEN ? vl_seqlen_q : p.seqlen_q;
  const int& seqlen_k = VARLEN ? vl_seqlen_k : p.seqlen_k;
  const int& causal_offset = VARLEN ? vl_causal_offset : p.causal_offset;
  const int& window_lo = VARLEN ? vl_window_lo : p.window_lo;
  const int& window_hi = VARLEN ? vl_window_hi : p.window_hi;

  const T* q = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const int head_k = kv_head_of(head, p.h_h_k_ratio_inv);  // grouped-query attention: this head's k/v head
  const T* k = static_cast<const T*>(p.k) + batch * p.k_batch_stride +
               head_k * p.k_head_stride + n0 * p.k_row_stride;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_batch_stride +
               head_k * p.v_head_stride + n0 * p.v_row_stride;
  const T* dout =
      static_cast<const T*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
  const int64_t bh = static_cast<int64_t>(batch) * p.heads + head;
  const float* lse = p.lse + bh * p.seqlen_q;
  const float* dpre = p.dpre + bh * p.seqlen_q;
  float* dq = p.dq_accum + bh * p.seqlen_q * D;
  if constexpr (VARLEN) {  // this sequence's rows; lse, dpre (H, total_q), dq_accum (H, total_q, D)
    q += start_q * p.q_row_stride;
    dout += start_q * p.do_row_stride;
    k += start_k * p.k_row_stride;
    v += start_k * p.v_row_stride;
    const int64_t row0 = static_cast<int64_t>(head) * p.total_q + start_q;
    lse = p.lse + row0;
    dpre = p.dpre + row0;
    dq = p.dq_accum + row0 * D;
  }

  const int m_blocks = (seqlen_q + BM - 1) / BM;
  // Causal: query rows before n0 - causal_offset see none of these keys. Window: rows
  // n0 - window_hi (the first key's first row) .. n0 + BN - 1 - window_lo (the last key's last
  // row) see them: the loop starts at the block holding the first and stops at the first block
  // that starts past the last (none: dK = dV = 0). That end is tested as
  // mb * BM <= n0 + BN - 1 - window_lo from n0 and the parameter each time, not kept in a
  // register: at head dim 128 this kernel uses all 255 registers and one more live value made
  // it spill. (Written out in each LOCAL branch: a lambda capturing n0 and p, even unused,
  // changed the causal instance's machine code.)
  const int m_begin = CAUSAL  ? max(0, n0 - causal_offset) / BM
                      : LOCAL ? max(0, n0 - window_hi) / BM
                              : 0;

  auto load_q_block = [&](int mb, int stage) {
    const int m0 = mb * BM;
    T* dst = s_qdo + stage * kQdoStage;
    load_tile_async<BM, D, NTHREADS>(dst, q + m0 * p.q_row_stride, p.q_row_stride,
                                     seqlen_q - m0, tid);
    load_tile_async<BM, D, NTHREADS>(dst + BM * D, dout + m0 * p.do_row_stride, p.do_row_stride,
                                     seqlen_q - m0, tid);
    if (tid < BM) {
      const bool valid = m0 + tid < seqlen_q;
      cp_async_4(smem_u32(s_lse + stage * BM + tid), lse + (valid ? m0 + tid : 0), valid);
      cp_async_4(smem_u32(s_dpre + stage * BM + tid), dpre + (valid ? m0 + tid : 0), valid);
    }
  };

  load_tile_async<BN, D, NTHREADS>(s_k, k, p.k_row_stride, seqlen_k - n0, tid);
  load_tile_async<BN, D, NTHREADS>(s_v, v, p.v_row_stride, seqlen_k - n0, tid);
  if constexpr (LOCAL) {
    if (m_begin < m_blocks && m_begin * BM <= n0 + BN - 1 - window_lo) {
      load_q_block(m_begin, 0);
    }
  } else {
    if (m_begin < m_blocks) load_q_block(m_begin, 0);
  }
  cp_async_commit();

  // ldmatrix lane offsets (bytes; see swz_lane).
  const uint32_t a_lane = swz_lane<RB>(lane & 15, lane >> 4);  // A operand, row major
  // kSplitD: P^T and dS^T as the A operand of dV, dK, read from their BN x BM tiles.
  const uint32_t pa_lane = swz_lane<SRB>(lane & 15, lane >> 4);
  const uint32_t bn_lane = swz_lane<RB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const uint32_t bt_lane = swz_lane<RB>((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4);
  // dS as the A operand of dQ = dS K, read transposed out of the dS^T tile.
  const uint32_t ds_lane = swz_lane<SRB>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);

  const uint32_t k_addr = smem_u32(s_k);
  const uint32_t v_addr = smem_u32(s_v);
  const uint32_t ds_addr = smem_u32(s_ds);

  float dk[DTILES][4];
  float dv[DTILES][4];
#pragma unroll
  for (int i = 0; i < DTILES; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
  }

  // The scale of S^T in P: softmax_scale, or with soft-capping softcap (S^T holds tanh then).
  const float scale_log2 = (SOFTCAP ? p.softcap : p.softmax_scale) * kLog2e;
  const int key0 = n0 + kg * 16 + g;  // this thread's keys: key0 and key0 + 8
  const int mq = dhalf * QW;  // this warp's first query row of S^T in a step (kSplitD), else 0

  for (int mb = m_begin; mb < m_blocks; ++mb) {
    if constexpr (LOCAL) {
      if (mb * BM > n0 + BN - 1 - window_lo) break;
    }
    const int stage = kSplitD ? 0 : (mb - m_begin) & 1;
    if constexpr (kSplitD) {  // one stage: block mb was loaded during the previous step's dQ
      cp_async_wait<0>();
      __syncthreads();
    } else {
      if constexpr (LOCAL) {
        if (mb + 1 < m_blocks && (mb + 1) * BM <= n0 + BN - 1 - window_lo) {
          load_q_block(mb + 1, stage ^ 1);
        }
      } else {
        if (mb + 1 < m_blocks) load_q_block(mb + 1, stage ^ 1);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
    }

    const int m0 = mb * BM;
    const uint32_t q_addr = smem_u32(s_qdo + stage * kQdoStage);
    const uint32_t do_addr = q_addr + BM * RB;
    const float* s_lse_st = s_lse + stage * BM;
    const float* s_dpre_st = s_dpre + stage * BM;

    // S^T = K_w Q^T, 16 keys x QW queries. (The k loop stays rolled: unrolled, the compiler
    // hoists every fragment load and runs out of registers.)
    float st[QTILES][4];
#pragma unroll
    for (int j = 0; j < QTILES; ++j) st[j][0] = st[j][1] = st[j][2] = st[j][3] = 0.f;
#pragma unroll 1
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4];
      ldmatrix_x4(ka, k_addr + kg * 16 * RB + (a_lane ^ (kk * 32)));
#pragma unroll
      for (int np = 0; np < QTILES / 2; ++np) {
        uint32_t qb[4];
        ldmatrix_x4(qb, q_addr + (mq + np * 16) * RB + (bn_lane ^ (kk * 32)));
        mma_16816<T>(st[2 * np], ka, qb[0], qb[1]);
        mma_16816<T>(st[2 * np + 1], ka, qb[2], qb[3]);
      }
    }

    // Soft-capping: S^T = tanh(S^T * softmax_scale / softcap); 1 - tanh^2 parked in this
    // thread's own elements of the dS^T tile (free: the previous step's dQ read it before the
    // barrier at the top of this step) until dS^T is formed.
    if constexpr (SOFTCAP) {
#pragma unroll
      for (int j = 0; j < QTILES; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = softcap_tanh(st[j][e] * p.softcap_in);
        const int m = mq + j * 8 + 2 * t;
        const int r = kg * 16 + g;
        *reinterpret_cast<__half2*>(s_ds + swz<BM>(r, m)) =
            __floats2half2_rn(1.f - st[j][0] * st[j][0], 1.f - st[j][1] * st[j][1]);
        *reinterpret_cast<__half2*>(s_ds + swz<BM>(r + 8, m)) =
            __floats2half2_rn(1.f - st[j][2] * st[j][2], 1.f - st[j][3] * st[j][3]);
      }
    }

    // P^T from the saved log-sum-exp; masked where the key is past the end, the query row past
    // the end, or (causal) the key after the query, or (window) the key outside the row's band.
    bool need_mask =
        (n0 + BN > seqlen_k) || (m0 + BM > seqlen_q) ||
        (CAUSAL && m0 + causal_offset < n0 + BN - 1);
    if constexpr (LOCAL) {  // the block's widest key - row difference against either edge
      need_mask = need_mask || n0 + BN - 1 - m0 > window_hi || n0 - (m0 + BM - 1) < window_lo;
    }
#pragma unroll
    for (int j = 0; j < QTILES; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = mq + j * 8 + 2 * t + (e & 1);
        float pv = exp2f(fmaf(st[j][e], scale_log2, -s_lse_st[m] * kLog2e));
        if (need_mask) {
          const int key = key0 + (e >> 1) * 8;
          if (key >= seqlen_k || m0 + m >= seqlen_q ||
              (CAUSAL && key > m0 + m + causal_offset)) {
            pv = 0.f;
          }
          // Window: keep window_lo <= key - row <= window_hi. On sm_90 as one unsigned
          // comparison (window_hi >= window_lo: flash_binding.cpp), elsewhere as two: the same
          // test, spelled as ptxas (CUDA 13.0) allocates best on each architecture at head dim
          // 128: no spill on sm_90a (two comparisons: 12 bytes); on sm_80 none with 4 warps and
          // 4 bytes with 8, as the plain 8-warp instance there (one comparison: 4-24 bytes).
          if constexpr (LOCAL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (static_cast<unsigned>(key - (m0 + m) - window_lo) >
                static_cast<unsigned>(window_hi - window_lo)) {
              pv = 0.f;
            }
#else
            if (key - (m0 + m) > window_hi || key - (m0 + m) < window_lo) pv = 0.f;
#endif
          }
        }
        st[j][e] = pv;
      }
    }

    if constexpr (kSplitD) {
      // P^T to shared memory (as T), for the dV product after the barrier below: the partner
      // warp holds the other half of the query rows.
#pragma unroll
      for (int j = 0; j < QTILES; ++j) {
        const int m = mq + j * 8 + 2 * t;
        const int r = kg * 16 + g;
        *reinterpret_cast<uint32_t*>(s_p + swz<BM>(r, m)) = TypeTraits<T>::pack(st[j][0], st[j][1]);
        *reinterpret_cast<uint32_t*>(s_p + swz<BM>(r + 8, m)) =
            TypeTraits<T>::pack(st[j][2], st[j][3]);
      }
    } else {
      // dV += P^T dO (k = query rows).
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) {
        uint32_t pa[4];
        pa[0] = TypeTraits<T>::pack(st[2 * kc][0], st[2 * kc][1]);
        pa[1] = TypeTraits<T>::pack(st[2 * kc][2], st[2 * kc][3]);
        pa[2] = TypeTraits<T>::pack(st[2 * kc + 1][0], st[2 * kc + 1][1]);
        pa[3] = TypeTraits<T>::pack(st[2 * kc + 1][2], st[2 * kc + 1][3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t ob[4];
          ldmatrix_x4_trans(ob, do_addr + kc * 16 * RB + (bt_lane ^ (dp * 32)));
          mma_16816<T>(dv[2 * dp], pa, ob[0], ob[1]);
          mma_16816<T>(dv[2 * dp + 1], pa, ob[2], ob[3]);
        }
      }
    }

    // dP^T = V_w dO^T, 16 keys x QW queries.
    float dpt[QTILES][4];
#pragma unroll
    for (int j = 0; j < QTILES; ++j) dpt[j][0] = dpt[j][1] = dpt[j][2] = dpt[j][3] = 0.f;
#pragma unroll 1
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t va[4];
      ldmatrix_x4(va, v_addr + kg * 16 * RB + (a_lane ^ (kk * 32)));
#pragma unroll
      for (int np = 0; np < QTILES / 2; ++np) {
        uint32_t ob[4];
        ldmatrix_x4(ob, do_addr + (mq + np * 16) * RB + (bn_lane ^ (kk * 32)));
        mma_16816<T>(dpt[2 * np], va, ob[0], ob[1]);
        mma_16816<T>(dpt[2 * np + 1], va, ob[2], ob[3]);
      }
    }

    // dS^T = P^T * (dP^T - Dpre), kept in st; stored to shared memory as T for the dQ product.
#pragma unroll
    for (int j = 0; j < QTILES; ++j) {
      const int m = mq + j * 8 + 2 * t;
      const float d0 = s_dpre_st[m];
      const float d1 = s_dpre_st[m + 1];
      st[j][0] *= dpt[j][0] - d0;
      st[j][1] *= dpt[j][1] - d1;
      st[j][2] *= dpt[j][2] - d0;
      st[j][3] *= dpt[j][3] - d1;
      const int r = kg * 16 + g;
      if constexpr (SOFTCAP) {  // times 1 - tanh^2, parked here above
        const float2 d01 =
            __half22float2(*reinterpret_cast<const __half2*>(s_ds + swz<BM>(r, m)));
        const float2 d23 =
            __half22float2(*reinterpret_cast<const __half2*>(s_ds + swz<BM>(r + 8, m)));
        st[j][0] *= d01.x;
        st[j][1] *= d01.y;
        st[j][2] *= d23.x;
        st[j][3] *= d23.y;
      }
      *reinterpret_cast<uint32_t*>(s_ds + swz<BM>(r, m)) = TypeTraits<T>::pack(st[j][0], st[j][1]);
      *reinterpret_cast<uint32_t*>(s_ds + swz<BM>(r + 8, m)) =
          TypeTraits<T>::pack(st[j][2], st[j][3]);
    }

    if constexpr (!kSplitD) {
      // dK += dS^T Q (k = query rows).
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) {
        uint32_t da[4];
        da[0] = TypeTraits<T>::pack(st[2 * kc][0], st[2 * kc][1]);
        da[1] = TypeTraits<T>::pack(st[2 * kc][2], st[2 * kc][3]);
        da[2] = TypeTraits<T>::pack(st[2 * kc + 1][0], st[2 * kc + 1][1]);
        da[3] = TypeTraits<T>::pack(st[2 * kc + 1][2], st[2 * kc + 1][3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t qb[4];
          ldmatrix_x4_trans(qb, q_addr + kc * 16 * RB + (bt_lane ^ (dp * 32)));
          mma_16816<T>(dk[2 * dp], da, qb[0], qb[1]);
          mma_16816<T>(dk[2 * dp + 1], da, qb[2], qb[3]);
        }
      }
    }
    __syncthreads();  // the whole dS^T tile is written (and Q, dO of this stage are read)

    if constexpr (kSplitD) {
      // dV += P^T dO and dK += dS^T Q for this warp's 16 keys (rows kg * 16 .. of the P^T and
      // dS^T tiles, all BM query rows: both halves' S^T) and its half of D.
      const uint32_t pt_addr = smem_u32(s_p) + kg * 16 * SRB;
      const uint32_t dst_addr = ds_addr + kg * 16 * SRB;
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) {
        uint32_t pa[4];
        ldmatrix_x4(pa, pt_addr + (pa_lane ^ (kc * 32)));
#pragma unroll
        for (int dp = 0; dp < DW / 16; ++dp) {
          uint32_t ob[4];
          ldmatrix_x4_trans(ob, do_addr + kc * 16 * RB + (bt_lane ^ ((dhalf * DW / 16 + dp) * 32)));
          mma_16816<T>(dv[2 * dp], pa, ob[0], ob[1]);
          mma_16816<T>(dv[2 * dp + 1], pa, ob[2], ob[3]);
        }
      }
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) {
        uint32_t da[4];
        ldmatrix_x4(da, dst_addr + (pa_lane ^ (kc * 32)));
#pragma unroll
        for (int dp = 0; dp < DW / 16; ++dp) {
          uint32_t qb[4];
          ldmatrix_x4_trans(qb, q_addr + kc * 16 * RB + (bt_lane ^ ((dhalf * DW / 16 + dp) * 32)));
          mma_16816<T>(dk[2 * dp], da, qb[0], qb[1]);
          mma_16816<T>(dk[2 * dp + 1], da, qb[2], qb[3]);
        }
      }
      __syncthreads();  // Q, dO (and lse, Dpre) of this block are read: load the next one
      if constexpr (LOCAL) {
        if (mb + 1 < m_blocks && (mb + 1) * BM <= n0 + BN - 1 - window_lo) {
          load_q_block(mb + 1, 0);
        }
      } else {
        if (mb + 1 < m_blocks) load_q_block(mb + 1, 0);
      }
      cp_async_commit();
    }

    // dQ += scale * dS (BM x BN) K (BN x D). Warp w takes query rows 16 (w % 4) .. +15 and the
    // w / 4 -th of NWARPS / 4 column slices of D.
    constexpr int kRowGroups = BM / 16;
    constexpr int kColSlices = NWARPS / kRowGroups;
    constexpr int kSliceCols = D / kColSlices;
    const int row_group = warp % kRowGroups;
    const int col_base = kColSlices == 1 ? 0 : (warp / kRowGroups) * kSliceCols;
    uint32_t ds_frag[BN / 16][4];
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      ldmatrix_x4_trans(ds_frag[kc], ds_addr + kc * 16 * SRB + (ds_lane ^ (row_group * 32)));
    }
    const int qrow = m0 + row_group * 16 + g;
#pragma unroll
    for (int j = 0; j < kSliceCols / 16; ++j) {
      const int dp = col_base / 16 + j;
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kc = 0; kc < BN / 16; ++kc) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, k_addr + kc * 16 * RB + (bt_lane ^ (dp * 32)));
        mma_16816<T>(acc[0], ds_frag[kc], kb[0], kb[1]);
        mma_16816<T>(acc[1], ds_frag[kc], kb[2], kb[3]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int col = dp * 16 + i * 8 + 2 * t;
        if (qrow < seqlen_q) {
          atomic_add_f32x2(dq + static_cast<int64_t>(qrow) * D + col, acc[i][0] * p.softmax_scale,
                           acc[i][1] * p.softmax_scale);
        }
        if (qrow + 8 < seqlen_q) {
          atomic_add_f32x2(dq + static_cast<int64_t>(qrow + 8) * D + col,
                           acc[i][2] * p.softmax_scale, acc[i][3] * p.softmax_scale);
        }
      }
    }
  }
  cp_async_wait<0>();

  // Store dK (times scale) and dV: rows key0 and key0 + 8, columns 8i + 2t (kSplitD: of this
  // warp's half of D); query head `head` of dk/dv (the k/v head itself when h_h_k_ratio is 1).
  T* dk_out = static_cast<T*>(p.dk) + batch * p.dk_batch_stride + head * p.dk_head_stride;
  T* dv_out = static_cast<T*>(p.dv) + batch * p.dv_batch_stride + head * p.dv_head_stride;
  if constexpr (VARLEN) {
    // Read again (volatile: not kept live across the main loop, where registers are short).
    start_k = *reinterpret_cast<const volatile int*>(p.cu_seqlens_k + batch);
    dk_out += start_k * p.dk_row_stride;
    dv_out += start_k * p.dv_row_stride;
  }
#pragma unroll
  for (int i = 0; i < DTILES; ++i) {
    const int col = dhalf * DW + i * 8 + 2 * t;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int key = key0 + rr * 8;
      if (key < seqlen_k) {
        *reinterpret_cast<uint32_t*>(dk_out + key * p.dk_row_stride + col) = TypeTraits<T>::pack(
            dk[i][2 * rr] * p.softmax_scale, dk[i][2 * rr + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_out + key * p.dv_row_stride + col) =
            TypeTraits<T>::pack(dv[i][2 * rr], dv[i][2 * rr + 1]);
      }
    }
  }
}

template <typename T, int D, int NWARPS, bool CAUSAL, bool LOCAL, bool SOFTCAP, bool VARLEN>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  constexpr bool kSplitD = BwdSplitD<D>::value;
  constexpr int BN = kSplitD ? 8 * NWARPS : 16 * NWARPS;
  constexpr int BM = 64;
  constexpr int kStages = kSplitD ? 1 : 2;
  // K, V; the Q/dO stages; dS^T (and P^T with kSplitD); lse and Dpre per stage.
  constexpr size_t smem_bytes = (2 * BN * D + 2 * kStages * BM * D + (kSplitD ? 2 : 1) * BN * BM) *
                                    sizeof(T) +
                                2 * kStages * BM * sizeof(float);
  static_assert(smem_bytes <= 227 * 1024, "over the opt-in shared memory limit (sm_90)");
  {
    constexpr int kThreads = 256;
    constexpr int kRowsPerBlock = kThreads / (D / 8);
    // VARLEN: the packed rows as one sequence (batch strides are 0), dpre (H, total_q).
    BwdParams pre = p;
    if constexpr (VARLEN) {
      pre.batch = 1;
      pre.seqlen_q = p.total_q;
    }
    const int64_t rows = static_cast<int64_t>(pre.batch) * pre.heads * pre.seqlen_q;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > 0) {
      flash_bwd_dot_do_o_kernel<T, D><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(pre);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
  }
  auto kernel = flash_bwd_kernel<T, D, NWARPS, CAUSAL, LOCAL, SOFTCAP, VARLEN>;
  if (smem_bytes > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((p.seqlen_k + BN - 1) / BN, p.heads, p.batch);  // VARLEN: max lengths
  if (grid.x == 0) return cudaSuccess;  // VARLEN with every key sequence empty: dk, dv are 0
  kernel<<<grid, NWARPS * 32, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// The forward's four instances per dtype and VARLEN value (flash_fwd_kernel.cuh).
template <typename T, int D, int NWARPS, bool VARLEN>
cudaError_t dispatch_bwd_mask(const BwdParams& p, cudaStream_t stream) {
  if (p.local || p.softcap > 0.f) {
    return p.softcap > 0.f ? launch_bwd<T, D, NWARPS, false, true, true, VARLEN>(p, stream)
                           : launch_bwd<T, D, NWARPS, false, true, false, VARLEN>(p, stream);
  }
  return p.causal ? launch_bwd<T, D, NWARPS, true, false, false, VARLEN>(p, stream)
                  : launch_bwd<T, D, NWARPS, false, false, false, VARLEN>(p, stream);
}

// Varlen at head dim 128 runs the 4-warp (64-key) variant whatever `warps` says: the 8-warp one
// with the per-sequence indexing spills past 255 registers (with a window).
template <typename T, int D, int NWARPS>
cudaError_t dispatch_bwd_dtype(const BwdParams& p, cudaStream_t stream) {
  if (p.varlen) {
    if constexpr (D == 128 && NWARPS == 8) {
      return dispatch_bwd_mask<T, D, 4, true>(p, stream);
    } else {
      return dispatch_bwd_mask<T, D, NWARPS, true>(p, stream);
    }
  }
  return dispatch_bwd_mask<T, D, NWARPS, false>(p, stream);
}

template <int D, int NWARPS>
cudaError_t dispatch_bwd(const BwdParams& p, cudaStream_t stream) {
  if (p.dtype == DType::kFloat16) return dispatch_bwd_dtype<__half, D, NWARPS>(p, stream);
  return dispatch_bwd_dtype<__nv_bfloat16, D, NWARPS>(p, stream);
}

}  // namespace flash
