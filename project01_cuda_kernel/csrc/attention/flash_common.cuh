// Building blocks shared by the FlashAttention forward and backward kernels (sm_80 and newer).
//
// Everything here is a thin wrapper over one PTX instruction, with the fragment layout it
// produces written next to it, so the kernels read as tile algebra:
//   - cp.async 16-byte global->shared copies with zero fill (masked tails cost no branches),
//   - ldmatrix (x4, plain and .trans) shared->register loads of 8x8 b16 matrices,
//   - mma.sync m16n8k16 with float32 accumulators, for __half and __nv_bfloat16.
//
// Fragment layouts of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A (16x16, row major), 4 x b32:  a0 = A[g][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                                   a2 = A[g][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   B (16x8, k x n), 2 x b32:       b0 = B[2t..2t+1][g]    b1 = B[2t+8..2t+9][g]
//   C (16x8, float32), 4 floats:    c0,c1 = C[g][2t..2t+1] c2,c3 = C[g+8][2t..2t+1]
// ldmatrix gives lane l the pair (row l/4, cols 2(l%4)..+1) of each 8x8 matrix; with .trans the
// pair (rows 2(l%4)..+1, col l/4). Lanes 8i..8i+7 supply the 8 row addresses of matrix i.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace flash {

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

// ---- tensor-core MMA: C(16x8 f32) += A(16x16) * B(16x8) -------------------------------------
// Not volatile: a pure register operation, which the compiler may schedule freely. (ldmatrix
// and cp.async stay volatile: they must not move across barriers.)
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- shared memory loads ----------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- asynchronous global -> shared copies -------------------------------------------------------
// src_bytes = 0 reads nothing and writes 16 zero bytes: rows past the end of a sequence become
// zeros in shared memory, so tails need no special path in the MMA loops.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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
