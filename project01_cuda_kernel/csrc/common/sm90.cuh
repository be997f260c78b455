// Hopper (sm_90a) building blocks shared by the wgmma/TMA kernels (GEMM step 9, the Hopper
// FlashAttention forward and backward): each a thin wrapper over one PTX instruction. With
// sm80.cuh and wgmma.cuh, the only place in csrc/ where PTX is written (a CPU test checks it).
//   - mbarriers: init and the fence that publishes it, arrive (plain and with an expected
//     transaction byte count), parity wait;
//   - setmaxnreg: a warpgroup's register budget lowered (producers) or raised (consumers);
//   - fence.proxy.async: generic-proxy shared-memory writes made visible to wgmma and TMA;
//   - TMA: 2-D and 4-D tiled bulk copies global -> shared, completing on an mbarrier;
//   - wgmma: shared-memory matrix descriptors (128-byte swizzle), fence / commit / wait, and an
//     empty asm that pins registers so the compiler keeps accesses out of asynchronous regions;
//   - host: the driver's cuTensorMapEncodeTiled, fetched through the runtime (no libcuda link).
// smem_u32 (shared-memory addresses as PTX takes them), ld_shared_f32x2 and named_barrier_sync
// are sm80.cuh's, re-exported here.
// The device functions compile for any architecture, but only sm_90a has the instructions: the
// kernels that use them guard their bodies with __CUDA_ARCH_FEAT_SM90_ALL.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/sm80.cuh"

namespace p01::sm90 {

using p01::sm80::smem_u32;  // shared-memory addresses as PTX takes them (common/sm80.cuh)
using p01::sm80::ld_shared_f32x2;
using p01::sm80::named_barrier_sync;

// ---- mbarriers ----------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// After the initialising thread's mbar_init calls, before the CTA barrier that publishes them:
// makes the initialised barriers visible to the other threads and to the async proxy (TMA).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive and announce `bytes` of TMA transactions that complete the phase.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spin until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- warpgroup register budgets -----------------------------------------------------------------
// setmaxnreg, executed by every thread of a warpgroup: lower (dec) or raise (inc) its per-thread
// register budget to N (a multiple of 8, 24..256). Producers give registers away so that
// consumers can take them; the kernel's launch bound fixes the pool they share.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- proxies ------------------------------------------------------------------------------------
// Shared-memory writes by ordinary stores (the generic proxy) made visible to the async proxy
// (wgmma operands, TMA stores and reduce-adds) that reads them next.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- TMA ----------------------------------------------------------------------------------------
// 2-D tiled load of the box at (c0 = innermost coordinate, c1 = row) into shared memory.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// 4-D tiled load of the box at (c0 innermost, c1, c2, c3) into shared memory.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// 3-D tiled reduce-add of a shared-memory box into global memory at (c0 innermost, c1, c2): the
// tensor map's element type (float32 here) is added element-wise in L2; out-of-bounds elements
// of the box are skipped. Asynchronous: commit it to a bulk group, then wait on the group before
// the shared memory is written again (bulk_wait_read) or before the kernel ends (bulk_wait).
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int c0,
                                                  int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group "
      "[%0, {%2, %3, %4}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Wait until at most N bulk groups are pending, their shared-memory reads done (.read) or
// complete.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- wgmma --------------------------------------------------------------------------------------
// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1); byte offsets. K-major
// operands: SBO = 1024 (the next 8 rows), LBO unused. N-major operands: LBO = offset of the next
// 64 columns (the next TMA box), SBO = 1024 (the next 8 k-rows).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;
  d |= 1ull << 62;
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n");
}
// Wait until at most N committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the compiler from moving register reads/writes across asynchronous wgmma regions (and from
// reusing the registers of an in-flight operand).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// ---- host ---------------------------------------------------------------------------------------
// cuTensorMapEncodeTiled from the driver, or nullptr when the driver does not provide it.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (fn == nullptr) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }
  return fn;
}

}  // namespace p01::sm90
