// Paged decode attention (flash-decoding over a paged KV cache), grouped-query aware.
//
// One query token per sequence. q (B, Hq, D); k_cache, v_cache (num_blocks, block_size, Hkv, D);
// block_tables (B, max_blocks) int32; context_lens (B,) int32. Output (B, Hq, D).
//
// Work split: one CTA per (context split, kv head, sequence). The CTA computes all G = Hq / Hkv
// query heads that share its kv head, so every K/V byte of the split is read from HBM once.
// Inside the CTA, 4 warps take 16-token tiles round-robin; each warp streams its own tiles through
// a private cp.async ring in shared memory (16-byte copies, kStages - 1 tiles in flight) and runs
// both matmuls on tensor cores (mma.m16n8k16, float32 accumulators):
//   S (16 rows = query heads, padded; 8 tokens) = Q (16 x 16 dims) . K^T (16 dims x 8 tokens)
//   O (16 heads x 8 dims) += P (16 heads x 16 tokens) . V (16 tokens x 8 dims)
// The S accumulator's register layout is exactly P's A-operand layout, so P never leaves
// registers. Softmax is online, in float32, in log2 units (exp2f on scores pre-scaled by
// softmax_scale * log2(e)). At the end the 4 warps' (max, sum, out) are merged in shared memory.
//
// With one split the CTA writes the normalised output; with several it writes a partial
// (max, sum-exp, out / sum) and a combine kernel merges the splits. The split plan (partition
// size, number of splits) comes from host integers only; context lengths are read on the device,
// so one launch can be captured in a CUDA graph and replayed with new lengths. A split past its
// sequence's end returns at once; the combine kernel counts a sequence's splits from its length.
//
// An FP8 cache (C = fp8_t: float8_e4m3fn, one float32 scale per KV head, fp8_kv.cuh): the ring
// holds the raw e4m3 tiles (half the bytes of a 16-bit tile, so more stages fit), and each
// landed tile is converted by its warp into a 16-bit swizzled tile (exact), which the unchanged
// MMA loop reads. The CTA's one KV head has one k_scale, folded into the score scale, and one
// v_scale, applied to the output. With C = T the code is the 16-bit kernel's.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "fp8_kv.cuh"
#include "pdl.cuh"

namespace {

using namespace p04;  // the PTX wrappers (common.cuh)

constexpr int kWarps = 4;        // warps per CTA
constexpr int kTileTokens = 16;  // tokens per warp step: the k extent of the P.V mma

// Ring depth per warp: (kStages - 1) tiles of K+V in flight, 4 KiB per tile at D = 64, 8 KiB at
// D = 128; shared memory per CTA: 64 KiB (D = 64, 3 CTAs/SM) or 96 KiB (D = 128, 2 CTAs/SM).
template <int D>
struct Stages;
template <>
struct Stages<64> {
  static constexpr int value = 4;
};
template <>
struct Stages<128> {
  static constexpr int value = 3;
};

// FP8 cache: a raw e4m3 tile pair is half the bytes, so more stages fit in the 16-bit kernel's
// shared memory beside each warp's converted 16-bit tile pair: 64 KiB (D = 64) and 96 KiB
// (D = 128) per CTA.
template <int D>
struct Fp8Stages;
template <>
struct Fp8Stages<64> {
  static constexpr int value = 6;
};
template <>
struct Fp8Stages<128> {
  static constexpr int value = 4;
};

template <int D, bool kFp8 = false>
constexpr int split_smem_bytes() {
  if constexpr (kFp8) {  // per warp: the e4m3 ring, then one converted bf16/fp16 K and V tile
    return kWarps * (Fp8Stages<D>::value * 2 * kTileTokens * D + 2 * kTileTokens * D * 2);
  }
  return kWarps * Stages<D>::value * 2 * kTileTokens * D * 2;  // bf16/fp16 elements
}

// An FP8 cache's per-KV-head scales; a 16-bit cache's parameters have none (an empty base), so
// their layout, and the 16-bit kernels' code, are what they were before the FP8 variant.
struct Fp8Scales {
  const float* k_scale;  // (Hkv,)
  const float* v_scale;
};
struct NoScales {};

template <typename T, typename C = T>
struct DecodeParams : std::conditional_t<std::is_same_v<C, T>, NoScales, Fp8Scales> {
  const T* q;  // (B, Hq, D), row stride q_stride_b, head stride q_stride_h, dims contiguous
  int64_t q_stride_b, q_stride_h;
  const C* k_cache;  // (num_blocks, block_size, Hkv, D) contiguous
  const C* v_cache;
  const int* block_tables;  // (B, max_blocks), row stride bt_stride
  int64_t bt_stride;
  int max_blocks;
  const int* context_lens;  // (B,)
  T* out;                   // (B, Hq, D) contiguous
  float* part_out;          // (B, Hq, num_splits, D): a split's out / its sum-exp
  float* part_ml;           // (B, Hq, num_splits, 2): a split's max (log2 units) and sum-exp
  float scale_log2;         // softmax_scale * log2(e)
  int n_heads, n_kv_heads, group;
  int block_shift;  // log2(block_size)
  int partition_size, num_splits;
};

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// Shared-memory tile of 16 token rows x D, 16-byte chunks XOR-swizzled by (row % 8) so that the
// 8 row addresses of one ldmatrix 8x8 matrix fall in 8 different bank groups.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) * 8);
}

// kTwoRows: G > 8 query heads per kv head use the mma's rows 8..15 as well; otherwise those rows
// are zero and their accumulators are never kept, which saves registers.
template <typename T, int D, bool kTwoRows, typename C = T>
__global__ void __launch_bounds__(kWarps * 32)
    paged_decode_split_kernel(const DecodeParams<T, C> p) {
  constexpr bool kFp8 = !std::is_same_v<C, T>;
  constexpr int kStages = kFp8 ? Fp8Stages<D>::value : Stages<D>::value;
  constexpr int kChunks = D / 8;  // 16-byte chunks per token row
  constexpr int kTileElems = kTileTokens * D;
  constexpr int kRows = kTwoRows ? 2 : 1;
  constexpr int kAcc = kTwoRows ? 4 : 2;  // live accumulators per 16x8 tile
  extern __shared__ __align__(128) unsigned char smem_raw[];

  p04::allow_next_kernel();
  p04::wait_previous_kernel();  // q, the cache and the block tables come from earlier kernels
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;  // mma fragment coordinates
  const int G = p.group;
  const bool single = p.num_splits == 1;
  float scale_log2 = p.scale_log2;  // an FP8 cache: times this KV head's k_scale
  if constexpr (kFp8) scale_log2 *= p.k_scale[kvh];

  // Tokens beyond the block table's reach are ignored, so a wrong length never reads out of it.
  const int ctx = min(p.context_lens[b], p.max_blocks << p.block_shift);
  const int start = split * p.partition_size;
  if (start >= ctx) {
    if (single) {  // empty sequence (a padded batch slot): zeros; with splits, combine does it
      T* out = p.out + ((int64_t)b * p.n_heads + (int64_t)kvh * G) * D;
      for (int i = threadIdx.x; i < G * D; i += blockDim.x) out[i] = from_float<T>(0.f);
    }
    return;
  }
  const int end = min(start + p.partition_size, ctx);
  const int n_tiles = (end - start + kTileTokens - 1) / kTileTokens;
  const int my_tiles = warp < n_tiles ? (n_tiles - warp + kWarps - 1) / kWarps : 0;

  // Q as the A operand, loaded once: rows = query heads of this kv head, 16 dims per k-step.
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int g = quad_row + 8 * r;
      uint32_t lo = 0, hi = 0;
      if ((r == 0 || kTwoRows) && g < G) {
        const T* qh = p.q + b * p.q_stride_b + (int64_t)(kvh * G + g) * p.q_stride_h;
        lo = *reinterpret_cast<const uint32_t*>(qh + 16 * s + 2 * quad_col);
        hi = *reinterpret_cast<const uint32_t*>(qh + 16 * s + 8 + 2 * quad_col);
      }
      qa[s][r] = lo;      // a0a1 (row g), a2a3 (row g + 8)
      qa[s][2 + r] = hi;  // a4a5, a6a7: the same rows, dims + 8
    }
  }

  // 16-bit cache: the warp's ring of K/V tiles. FP8: the warp's converted tile pair, then (past
  // every warp's) its ring of raw e4m3 tile pairs.
  T* ring = reinterpret_cast<T*>(smem_raw) + warp * (kFp8 ? 1 : kStages) * 2 * kTileElems;
  fp8_t* raw_ring = reinterpret_cast<fp8_t*>(reinterpret_cast<T*>(smem_raw) +
                                             kWarps * 2 * kTileElems) +
                    warp * kStages * 2 * kTileElems;
  const int* table = p.block_tables + b * p.bt_stride;
  const int64_t token_stride = (int64_t)p.n_kv_heads * D;  // elements between a head's tokens
  const C* k_head = p.k_cache + kvh * D;
  const C* v_head = p.v_cache + kvh * D;
  const int offset_mask = (1 << p.block_shift) - 1;

  // Block ids of 32 upcoming tiles, one per lane, so a tile's copy never waits on the table.
  int block_of_lane = 0;
  auto issue = [&](int j) {  // copy this warp's j-th tile into ring slot j % kStages
    if (j % 32 == 0) {
      const int jj = j + lane;
      const int tok = start + kTileTokens * (warp + kWarps * jj);
      block_of_lane = jj < my_tiles ? table[tok >> p.block_shift] : 0;
    }
    const int block = __shfl_sync(0xffffffffu, block_of_lane, j % 32);
    const int tok0 = start + kTileTokens * (warp + kWarps * j);
    // A 16-token tile never straddles a block: block sizes are powers of two >= 16.
    const int64_t row0 = ((int64_t)block << p.block_shift) + (tok0 & offset_mask);
    if constexpr (kFp8) {  // raw e4m3 rows, D bytes each, unswizzled (read once, by chunks)
      constexpr int kRawChunks = D / 16;  // 16-byte chunks per token row
      fp8_t* rk = raw_ring + (j % kStages) * 2 * kTileElems;
      fp8_t* rv = rk + kTileElems;
#pragma unroll
      for (int i = 0; i < kTileTokens * kRawChunks / 32; ++i) {
        const int c = lane + 32 * i;
        const int row = c / kRawChunks, chunk = c % kRawChunks;
        const bool valid = tok0 + row < end;
        const int64_t off = (row0 + row) * token_stride + chunk * 16;
        cp_async16(smem_addr(rk + c * 16), valid ? k_head + off : k_head, valid);
        cp_async16(smem_addr(rv + c * 16), valid ? v_head + off : v_head, valid);
      }
      return;
    }
    T* sk = ring + (j % kStages) * 2 * kTileElems;
    T* sv = sk + kTileElems;
#pragma unroll
    for (int i = 0; i < kTileTokens * kChunks / 32; ++i) {
      const int c = lane + 32 * i;  // 8 (D = 64) or 16 lanes read one token's 128/256 bytes
      const int row = c / kChunks, chunk = c % kChunks;
      const bool valid = tok0 + row < end;
      const int64_t off = (row0 + row) * token_stride + chunk * 8;
      const int dst = swizzled<D>(row, chunk);
      cp_async16(smem_addr(sk + dst), valid ? k_head + off : k_head, valid);
      cp_async16(smem_addr(sv + dst), valid ? v_head + off : v_head, valid);
    }
  };

  float o[D / 8][kAcc];  // O: (head rows, dims 8n + 2*quad_col + {0, 1})
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < kAcc; ++e) o[n][e] = 0.f;
  float m[kRows], l[kRows];  // running max (log2 units) and this lane's part of the sum-exp
#pragma unroll
  for (int r = 0; r < kRows; ++r) m[r] = -INFINITY, l[r] = 0.f;

#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < my_tiles) issue(j);
    cp_async_commit();  // empty groups keep the wait count uniform
  }

  for (int j = 0; j < my_tiles; ++j) {
    if (j + kStages - 1 < my_tiles) issue(j + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // tile j has landed
    __syncwarp();
    if constexpr (kFp8) {  // e4m3 -> the 16-bit dtype (exact), into the swizzled tile pair
      constexpr int kRawChunks = D / 16;
      const fp8_t* rk = raw_ring + (j % kStages) * 2 * kTileElems;
#pragma unroll
      for (int i = 0; i < 2 * kTileTokens * kRawChunks / 32; ++i) {
        const int c = lane + 32 * i;  // K's chunks, then V's
        const int kv = c / (kTileTokens * kRawChunks), cc = c % (kTileTokens * kRawChunks);
        const int row = cc / kRawChunks, chunk = cc % kRawChunks;
        uint4 lo, hi;
        fp8x16_to_16bit<T>(*reinterpret_cast<const uint4*>(rk + c * 16), lo, hi);
        T* dst = ring + kv * kTileElems;
        *reinterpret_cast<uint4*>(dst + swizzled<D>(row, 2 * chunk)) = lo;
        *reinterpret_cast<uint4*>(dst + swizzled<D>(row, 2 * chunk + 1)) = hi;
      }
      __syncwarp();
    }
    const T* sk = ring + (kFp8 ? 0 : j % kStages) * 2 * kTileElems;
    const T* sv = sk + kTileElems;
    const int tok0 = start + kTileTokens * (warp + kWarps * j);

    // S = Q K^T for tokens 0-7 (s[0]) and 8-15 (s[1]) of the tile.
    float s[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk) {
        // matrices: dims chunk 4kk + {0, 1, 2, 3} of tokens 8t..8t+7 -> two k-steps of B
        uint32_t kb[4];
        const int row = 8 * t + (lane & 7), chunk = 4 * kk + (lane >> 3);
        ldsm_x4(kb, smem_addr(sk + swizzled<D>(row, chunk)));
        mma_m16n8k16<T>(s[t], qa[2 * kk], kb[0], kb[1]);
        mma_m16n8k16<T>(s[t], qa[2 * kk + 1], kb[2], kb[3]);
      }
    }

    // Online softmax per head row. This lane holds tokens 2q, 2q+1, 8+2q, 9+2q (q = quad_col)
    // of row quad_row (and quad_row + 8); the row's other tokens sit in the 3 other quad lanes.
    uint32_t pa[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float x[4] = {s[0][2 * r], s[0][2 * r + 1], s[1][2 * r], s[1][2 * r + 1]};
      float row_max = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = tok0 + 8 * (e / 2) + 2 * quad_col + (e % 2);
        x[e] = tok < end ? x[e] * scale_log2 : -INFINITY;
        row_max = fmaxf(row_max, x[e]);
      }
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
      const float m_new = fmaxf(m[r], row_max);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no (-inf) - (-inf)
      const float alpha = exp2f(m[r] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[e] = exp2f(x[e] - m_use);
        sum += x[e];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) o[n][2 * r] *= alpha, o[n][2 * r + 1] *= alpha;
      pa[r] = Pack2<T>::from_floats(x[0], x[1]);      // A rows quad_row (+8), tokens 0-7
      pa[2 + r] = Pack2<T>::from_floats(x[2], x[3]);  // tokens 8-15
    }

    // O += P V: matrices (tokens 0-7 | 8-15) x (dims chunk 2dd | 2dd+1), transposed on load.
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t vb[4];
      const int mat = lane >> 3;
      const int row = (lane & 7) + 8 * (mat & 1), chunk = 2 * dd + (mat >> 1);
      ldsm_x4_trans(vb, smem_addr(sv + swizzled<D>(row, chunk)));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float c[4] = {o[2 * dd + h][0], o[2 * dd + h][1], 0.f, 0.f};
        if constexpr (kTwoRows) c[2] = o[2 * dd + h][2], c[3] = o[2 * dd + h][3];
        mma_m16n8k16<T>(c, pa, vb[2 * h], vb[2 * h + 1]);
#pragma unroll
        for (int e = 0; e < kAcc; ++e) o[2 * dd + h][e] = c[e];
      }
    }
    __syncwarp();  // every lane is done with this ring slot before it is refilled
  }

  // Merge the 4 warps' states in shared memory (the ring is free once every copy has landed).
  cp_async_wait<0>();
  __syncthreads();
  float* s_out = reinterpret_cast<float*>(smem_raw);  // (kWarps, 16 rows, D)
  float* s_max = s_out + kWarps * 16 * D;             // (kWarps, 16)
  float* s_sum = s_max + kWarps * 16;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = quad_row + 8 * r;
    if (quad_col == 0) s_max[warp * 16 + row] = m[r], s_sum[warp * 16 + row] = l[r];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<float2*>(s_out + (warp * 16 + row) * D + 8 * n + 2 * quad_col) =
          make_float2(o[n][2 * r], o[n][2 * r + 1]);
    }
  }
  __syncthreads();

  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_max[w * 16 + g]);  // warp 0 is finite
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float scale = exp2f(s_max[w * 16 + g] - mx);  // 0 for a warp without tiles
      sum += scale * s_sum[w * 16 + g];
      acc += scale * s_out[(w * 16 + g) * D + d];
    }
    const int64_t head = (int64_t)b * p.n_heads + kvh * G + g;
    if constexpr (kFp8) acc *= p.v_scale[kvh];  // O = P (s_v V_e4m3) = s_v (P V_e4m3)
    if (single) {
      p.out[head * D + d] = from_float<T>(acc / sum);
    } else {
      const int64_t part = head * p.num_splits + split;
      p.part_out[part * D + d] = acc / sum;
      if (d == 0) p.part_ml[2 * part] = mx, p.part_ml[2 * part + 1] = sum;
    }
  }
}

// Merge a sequence's split partials: one CTA per (query head, sequence), one thread per dim.
template <typename T, typename C = T>
__global__ void paged_decode_combine_kernel(const DecodeParams<T, C> p, int D) {
  p04::allow_next_kernel();
  p04::wait_previous_kernel();
  const int hq = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int64_t head = (int64_t)b * p.n_heads + hq;
  const int ctx = min(p.context_lens[b], p.max_blocks << p.block_shift);
  // Splits at or past the context end were skipped: their partial buffers hold stale values.
  const int n = ctx > 0 ? min((ctx + p.partition_size - 1) / p.partition_size, p.num_splits) : 0;
  if (n == 0) {
    p.out[head * D + d] = from_float<T>(0.f);
    return;
  }
  const float* ml = p.part_ml + head * p.num_splits * 2;
  const float* po = p.part_out + head * p.num_splits * D + d;
  float mx = -INFINITY;
  for (int s = 0; s < n; ++s) mx = fmaxf(mx, ml[2 * s]);
  float sum = 0.f, acc = 0.f;
  for (int s = 0; s < n; ++s) {
    const float w = exp2f(ml[2 * s] - mx) * ml[2 * s + 1];
    sum += w;
    acc += w * po[(int64_t)s * D];
  }
  p.out[head * D + d] = from_float<T>(acc / sum);
}

// Every kernel the binding launches, instantiated here so that this file alone compiles them all.
#define P04_DECODE_KERNELS(T, C)                                                                 \
  template __global__ void paged_decode_split_kernel<T, 64, false, C>(const DecodeParams<T, C>);  \
  template __global__ void paged_decode_split_kernel<T, 64, true, C>(const DecodeParams<T, C>);   \
  template __global__ void paged_decode_split_kernel<T, 128, false, C>(const DecodeParams<T, C>); \
  template __global__ void paged_decode_split_kernel<T, 128, true, C>(const DecodeParams<T, C>);  \
  template __global__ void paged_decode_combine_kernel<T, C>(const DecodeParams<T, C>, int);
P04_DECODE_KERNELS(__nv_bfloat16, __nv_bfloat16)
P04_DECODE_KERNELS(__half, __half)
P04_DECODE_KERNELS(__nv_bfloat16, p04::fp8_t)
P04_DECODE_KERNELS(__half, p04::fp8_t)
#undef P04_DECODE_KERNELS

}  // namespace

// The torch binding below is compiled only by torch's extension build (which defines
// TORCH_EXTENSION_NAME); without it this file is plain CUDA, so a compile check needs no torch.
#ifdef TORCH_EXTENSION_NAME
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

namespace {

template <typename T, int D, bool kTwoRows, typename C>
void launch(const DecodeParams<T, C>& p, int batch, bool pdl, cudaStream_t stream) {
  constexpr int smem = split_smem_bytes<D, !std::is_same_v<C, T>>();
  auto kernel = paged_decode_split_kernel<T, D, kTwoRows, C>;
  // Above 48 KiB of dynamic shared memory needs an opt-in (a function attribute, not a stream
  // operation, so it is allowed while a CUDA graph is being captured).
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(p.num_splits, p.n_kv_heads, batch);
  C10_CUDA_CHECK(p04::launch(kernel, grid, dim3(kWarps * 32), smem, stream, pdl, p));
  if (p.num_splits > 1) {
    C10_CUDA_CHECK(p04::launch(paged_decode_combine_kernel<T, C>, dim3(p.n_heads, batch), dim3(D),
                               0, stream, pdl, p, D));
  }
}

template <typename T, typename C>
void dispatch(const DecodeParams<T, C>& p, int batch, int head_dim, bool pdl,
              cudaStream_t stream) {
  const bool two_rows = p.group > 8;
  if (head_dim == 64) {
    two_rows ? launch<T, 64, true, C>(p, batch, pdl, stream)
             : launch<T, 64, false, C>(p, batch, pdl, stream);
  } else if (head_dim == 128) {
    two_rows ? launch<T, 128, true, C>(p, batch, pdl, stream)
             : launch<T, 128, false, C>(p, batch, pdl, stream);
  } else {
    TORCH_CHECK(false, "paged_decode: head_dim must be 64 or 128, got ", head_dim);
  }
}

template <typename T, typename C = T>
DecodeParams<T, C> make_params(const torch::Tensor& out, const torch::Tensor& q,
                               const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables,
                               const torch::Tensor& context_lens, double scale,
                               int64_t partition_size, int64_t num_splits,
                               const torch::Tensor& part_out, const torch::Tensor& part_ml,
                               const std::optional<torch::Tensor>& k_scale = std::nullopt,
                               const std::optional<torch::Tensor>& v_scale = std::nullopt) {
  DecodeParams<T, C> p;
  p.q = reinterpret_cast<const T*>(q.data_ptr());
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.k_cache = reinterpret_cast<const C*>(k_cache.data_ptr());
  p.v_cache = reinterpret_cast<const C*>(v_cache.data_ptr());
  p.block_tables = block_tables.data_ptr<int>();
  p.bt_stride = block_tables.stride(0);
  p.max_blocks = static_cast<int>(block_tables.size(1));
  p.context_lens = context_lens.data_ptr<int>();
  p.out = reinterpret_cast<T*>(out.data_ptr());
  p.part_out = num_splits > 1 ? part_out.data_ptr<float>() : nullptr;
  p.part_ml = num_splits > 1 ? part_ml.data_ptr<float>() : nullptr;
  p.scale_log2 = static_cast<float>(scale) * p04::kLog2e;
  p.n_heads = static_cast<int>(q.size(1));
  p.n_kv_heads = static_cast<int>(k_cache.size(2));
  p.group = p.n_heads / p.n_kv_heads;
  p.block_shift = __builtin_ctz(static_cast<unsigned>(k_cache.size(1)));
  p.partition_size = static_cast<int>(partition_size);
  p.num_splits = static_cast<int>(num_splits);
  if constexpr (!std::is_same_v<C, T>) {
    p.k_scale = k_scale->data_ptr<float>();
    p.v_scale = v_scale->data_ptr<float>();
  }
  return p;
}

}  // namespace

// Shapes, dtypes, strides and the split plan are validated by the Python wrapper
// (kernels/decode.py); this entry point only launches.
void paged_decode(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache,
                  torch::Tensor v_cache, torch::Tensor block_tables, torch::Tensor context_lens,
                  double scale, int64_t partition_size, int64_t num_splits,
                  torch::Tensor part_out, torch::Tensor part_ml, bool pdl,
                  std::optional<torch::Tensor> k_scale, std::optional<torch::Tensor> v_scale) {
  TORCH_CHECK(q.is_cuda() && k_cache.is_cuda(), "paged_decode: tensors must be on a CUDA device");
  TORCH_CHECK(partition_size % kTileTokens == 0, "paged_decode: partition_size % 16 != 0");
  const int batch = static_cast<int>(q.size(0));
  if (batch == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int head_dim = static_cast<int>(q.size(2));
  if (k_cache.scalar_type() == at::kFloat8_e4m3fn) {
    TORCH_CHECK(v_cache.scalar_type() == at::kFloat8_e4m3fn && k_scale.has_value() &&
                    v_scale.has_value() && k_scale->scalar_type() == at::kFloat &&
                    v_scale->scalar_type() == at::kFloat &&
                    k_scale->numel() == k_cache.size(2) && v_scale->numel() == k_cache.size(2),
                "paged_decode: an FP8 cache needs float32 k_scale and v_scale of Hkv values");
    if (q.scalar_type() == at::kBFloat16) {
      dispatch(make_params<__nv_bfloat16, p04::fp8_t>(out, q, k_cache, v_cache, block_tables,
                                                      context_lens, scale, partition_size,
                                                      num_splits, part_out, part_ml, k_scale,
                                                      v_scale),
               batch, head_dim, pdl, stream);
    } else {
      TORCH_CHECK(q.scalar_type() == at::kHalf, "paged_decode: q must be bfloat16 or float16");
      dispatch(make_params<__half, p04::fp8_t>(out, q, k_cache, v_cache, block_tables,
                                               context_lens, scale, partition_size, num_splits,
                                               part_out, part_ml, k_scale, v_scale),
               batch, head_dim, pdl, stream);
    }
    return;
  }
  if (q.scalar_type() == at::kBFloat16) {
    dispatch(make_params<__nv_bfloat16>(out, q, k_cache, v_cache, block_tables, context_lens,
                                        scale, partition_size, num_splits, part_out, part_ml),
             batch, head_dim, pdl, stream);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kHalf, "paged_decode: q must be bfloat16 or float16");
    dispatch(make_params<__half>(out, q, k_cache, v_cache, block_tables, context_lens, scale,
                                 partition_size, num_splits, part_out, part_ml),
             batch, head_dim, pdl, stream);
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode,
        "paged decode attention: out (B, Hq, D) from q (B, Hq, D) over a paged K/V cache");
}
#endif  // TORCH_EXTENSION_NAME
