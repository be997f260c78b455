// Building blocks shared by the FlashAttention forward and backward kernels (sm_80 and newer):
// element-type traits, the XOR swizzle of shared tiles, the tile copy built on cp.async, and
// quad reductions over the rows of a C fragment.
//
// The PTX wrappers they use (cp.async with zero fill, ldmatrix x4 plain and .trans, mma.sync
// m16n8k16 with float32 accumulators, and the fragment layouts those produce) live in
// common/sm80.cuh and are brought into namespace flash below, so the kernels read as tile
// algebra.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attention/flash_api.h"
#include "common/sm80.cuh"

namespace flash {

using namespace p01::sm80;  // cp.async, ldmatrix and mma.sync wrappers (common/sm80.cuh)

constexpr float kLog2e = 1.4426950408889634f;

// ---- element types -------------------------------------------------------------------------
template <typename T>
struct TypeTraits;

template <>
struct TypeTraits<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2*>(&v));
  }
};

template <>
struct TypeTraits<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  }
};

// ---- swizzled tiles in shared memory ---------------------------------------------------------------
// A tile of ROWS x COLS 16-bit elements, rows of COLS * 2 bytes (a multiple of 128 bytes), split in
// 16-byte chunks of 8 elements. Chunk c of row r is stored at chunk c ^ (r % 8): the 8 rows that
// one ldmatrix phase (or one row-wise store) touches land in 8 different 16-byte bank groups, so
// neither ldmatrix nor cp.async conflicts on banks.
template <int COLS>
__device__ __forceinline__ int swz(int row, int col) {
  static_assert(COLS % 64 == 0, "swizzled rows must be a multiple of 64 elements (128 bytes)");
  return row * COLS + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

// The same swizzle in byte offsets, split so that unrolled loops cost one XOR per step. For a
// lane reading row r0 + r_off and chunk c0 + c_off, with r0 a multiple of 8 and c0 even (and
// c_off in {0, 1}), the byte offset is r0 * ROW_BYTES + (lane_term ^ (c0 * 16)), where lane_term
// = swz_lane<ROW_BYTES>(r_off, c_off) is computed once per kernel. Tiles start 1024-byte aligned.
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t swz_lane(int r_off, int c_off) {
  return static_cast<uint32_t>((r_off * ROW_BYTES + (r_off & 7) * 16) ^ (c_off * 16));
}

// Copy a ROWS x COLS tile from global memory (row stride `row_stride` elements, rows at and after
// `rows_valid` zero-filled) into a swizzled shared tile, with NTHREADS threads, 16 bytes each.
template <int ROWS, int COLS, int NTHREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride,
                                                int rows_valid, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kRowsPerPass = NTHREADS / kChunksPerRow;
  static_assert(NTHREADS % kChunksPerRow == 0 && ROWS % kRowsPerPass == 0,
                "tile chunks must divide evenly among threads");
  static_assert(kRowsPerPass % 8 == 0, "passes must keep the swizzle phase (row % 8)");
  const int row = tid / kChunksPerRow;
  const int col = (tid % kChunksPerRow) * 8;
  // One pointer advanced pass by pass (not ROWS / kRowsPerPass precomputed 64-bit offsets,
  // which the compiler would keep live across the whole main loop). Shared addresses differ by
  // constants because kRowsPerPass keeps row % 8, hence the swizzle, fixed.
  const T* src = gmem + row * row_stride + col;
  const int64_t pass_stride = kRowsPerPass * row_stride;
  const uint32_t dst = smem_u32(smem + swz<COLS>(row, col));
#pragma unroll
  for (int i = 0; i < ROWS / kRowsPerPass; ++i) {
    const bool valid = row + i * kRowsPerPass < rows_valid;
    // A masked row reads nothing (zero fill); point it at the tile start, which is mapped.
    cp_async_16(dst + i * kRowsPerPass * COLS * sizeof(T), valid ? src : gmem, valid);
    src += pass_stride;
  }
}

// ---- grouped-query attention -------------------------------------------------------------------
// The k/v head of query head `head`: head / h_h_k_ratio as one wide multiply by the host's
// kv_head_inverse(h_h_k_ratio) (flash_api.h). An integer division here is a dozen instructions
// whose registers, at the start of kernels that use all 255, were enough to make the backward
// spill.
__device__ __forceinline__ int kv_head_of(int head, uint64_t ratio_inv) {
  return static_cast<int>((static_cast<uint64_t>(head) * ratio_inv) >> 32);
}

// ---- variable length (packed sequences) -------------------------------------------------------
// Sequence `batch`'s first row and length from the prefix sums cu[batch], cu[batch + 1].
__device__ __forceinline__ void varlen_range(const int* cu, int batch, int& start, int& len) {
  start = cu[batch];
  len = cu[batch + 1] - start;
}

// One sequence's causal offset and window offsets (flash_api.h), bottom-right on its own lengths
// sq, sk, as the host's set_window derives them for a whole batch: window_left/right are the
// raw sides (-1 unbounded; causal folded in as right = 0 by the host), each a bound only when it
// hides a key (left < sk, right < sq), else an offset past every key.
template <typename Params>
__device__ __forceinline__ void varlen_offsets(const Params& p, int sq, int sk, int& causal_offset,
                                               int& window_lo, int& window_hi) {
  causal_offset = sk - sq;
  window_hi = (p.window_right >= 0 && p.window_right < sq) ? sk - sq + p.window_right : sk;
  window_lo = (p.window_left >= 0 && p.window_left < sk) ? sk - sq - p.window_left
                                                         : -sq - kWindowPad;
}

// ---- soft-capping ----------------------------------------------------------------------------
// tanh(x) as 1 - 2 / (exp(2x) + 1), with the fast exp2 (ex2.approx, relative error ~2^-22) and
// the fast division: absolute error ~2e-7 over the whole range (exactly +-1 once exp overflows to
// inf or underflows to 0), which is what the softmax sees: the score softcap * tanh moves by
// softcap * 2e-7, ~1e-5 at Gemma 2's 50. Not tanhf: --use_fast_math compiles it to
// tanh.approx.f32, whose relative error of about 2^-11 would move a score near the cap by
// ~softcap / 2000, 0.025 at 50, a 2.5% error in its probability.
__device__ __forceinline__ float softcap_tanh(float x) {
  const float e = exp2f(x * (2.f * kLog2e));
  return 1.f - __fdividef(2.f, e + 1.f);
}

// ---- warp reductions over the 4 lanes of a quad (the lanes holding one row of a C fragment) ---
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

}  // namespace flash
