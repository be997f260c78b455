// PTX building blocks for project04's attention kernels (sm_80 and newer).
//
// Kept in this project (not included from project01) so that project04 can be forked on its own.
// Each wrapper is one instruction; the fragment layouts it implies are written here once:
//
// mma.sync.m16n8k16, lane = 4 g + t (g = lane / 4 in 0..7, t = lane % 4 in 0..3):
//   A 16x16 row-major, 4 regs of 2 x b16:  a0 = A[g][2t,2t+1]    a1 = A[g+8][2t,2t+1]
//                                           a2 = A[g][2t+8,2t+9]  a3 = A[g+8][2t+8,2t+9]
//   B 16x8 (k x n),   2 regs of 2 x b16:  b0 = B[2t,2t+1][g]    b1 = B[2t+8,2t+9][g]
//   C/D 16x8 float32, 4 floats:           c0,c1 = C[g][2t,2t+1]  c2,c3 = C[g+8][2t,2t+1]
// The C layout of two adjacent 16x8 tiles is exactly the A layout of one 16x16 tile, which is
// why P never has to leave registers between S = Q K^T and O += P V.
//
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i; lane l receives, of each
// matrix, the b16 pair at (row l / 4, cols 2 (l % 4)..+1); with .trans the pair at
// (rows 2 (l % 4)..+1, col l / 4).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace p04 {

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))

// ---- 16-bit element types: pack two floats into one b32 register and back -------------------
template <typename T>
struct Pack2;

template <>
struct Pack2<__half> {
  static __device__ __forceinline__ uint32_t from_floats(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

template <>
struct Pack2<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t from_floats(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// ---- tensor cores: d(16x8 f32) += a(16x16) b(16x8) -----------------------------------------
// Register-only, so not volatile: the scheduler may interleave MMAs with the softmax.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- shared memory ------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Volatile (with a memory clobber): must stay between the barriers that guard the tile.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// ---- cp.async: 16 bytes global -> shared, bypassing registers ------------------------------
// With valid = false the source size is 0: nothing is read and 16 zero bytes are written, so a
// tile's rows past the end of a sequence are zeros and the MMA loops need no tail code. The
// caller still passes a mapped address for an invalid row.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- XOR-swizzled tiles ---------------------------------------------------------------------
// A tile of rows of COLS b16 elements (COLS * 2 bytes, a multiple of 128), in 16-byte chunks of 8
// elements. Chunk c of row r is stored at chunk (c ^ (r % 8)) within its 128-byte group, so the 8
// rows one ldmatrix phase reads (same chunk, 8 consecutive rows) hit 8 distinct bank groups.
template <int COLS>
__device__ __forceinline__ int swizzle(int row, int col) {
  static_assert(COLS % 64 == 0, "swizzled rows must be a multiple of 128 bytes");
  const int chunk = col >> 3;
  return row * COLS + (((chunk ^ row) & 7) | (chunk & ~7)) * 8 + (col & 7);
}

// Byte offset of (row r0 + r_off, chunk c0 + c_off) for r0 % 8 == 0 and even c0, c_off in {0,1},
// split as r0 * ROW_BYTES + (lane_part ^ (c0 * 16)): lane_part is computed once per thread and
// every unrolled step costs one XOR.
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t swizzle_lane(int r_off, int c_off) {
  return static_cast<uint32_t>((r_off * ROW_BYTES + (r_off & 7) * 16) ^ (c_off * 16));
}

// ---- reductions over the 4 lanes (one quad) that hold one row of a C fragment ---------------
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace p04
