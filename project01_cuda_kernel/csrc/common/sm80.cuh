// Ampere (sm_80) building blocks shared by the mma.sync kernels (GEMM step 8, the
// FlashAttention-2 forward and backward): each a thin wrapper over one PTX instruction.
//   - smem_u32: a generic pointer into shared memory as the 32-bit shared address PTX takes;
//   - cp.async: 16-byte (.cg, L2 only) and 4-byte (.ca) global -> shared copies with zero fill,
//     commit_group, wait_group;
//   - ldmatrix: four 8x8 b16 matrices shared -> registers (x4), plain and .trans;
//   - mma.sync m16n8k16 with float32 accumulators, for __half and __nv_bfloat16;
//   - ld.shared of two floats, and bar.sync on a named barrier over some of the CTA's warps.
// The instructions exist on sm_80 and every later architecture (sm_90a included); the Hopper
// wrappers in sm90.cuh build on smem_u32 from here and re-export the last two.
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

namespace p01::sm80 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- asynchronous global -> shared copies -------------------------------------------------------
// valid = false reads nothing (src-size 0) and fills the destination with zeros: tiles past the
// edge of a matrix or a sequence become zeros, so tails need no special path in the MMA loops.
// The source must still be a mapped address. Volatile, like ldmatrix: copies, commits and waits
// must stay in program order around the barriers.
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

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix: shared -> registers, fragment layout above ------------------------------------
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

// ---- tensor-core MMA: C(16x8 f32) += A(16x16) * B(16x8) -------------------------------------
// Not volatile: a pure register operation (no memory effects), which the compiler may schedule
// freely; its register operands already order it after the ldmatrix loads that feed it and before
// any use of the accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- shared-memory loads and named barriers -----------------------------------------------------
// Two floats from shared memory (8-byte aligned). Volatile: the load stays after the barrier or
// mbarrier wait before it (a plain C++ load of the same address may be hoisted or deferred to the
// point of use, where it then waits on the long scoreboard).
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// Barrier `id` (1..15; 0 is __syncthreads') over `threads` threads, a multiple of 32: a subset of
// the CTA's warps (a few warpgroups) synchronises without the rest.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace p01::sm80
