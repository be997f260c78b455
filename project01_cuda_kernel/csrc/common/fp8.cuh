// The FP8 wgmma instructions of the Hopper (sm_90a) FP8 GEMM (step 10): float8 e4m3 inputs,
// float32 accumulators, k = 32 per instruction (32 bytes of K, as the 16-bit forms' k = 16).
//   ss_m64n128k32 e4m3 x e4m3: A and B both read from shared memory through matrix descriptors.
// FP8 wgmma has no transpose immediates: both operands must be K-major (each row of A and each
// row of B holds consecutive K), so the GEMM takes B as (N, K) row-major, C = A B^T. The
// operand order after the descriptors is scale-d, imm-scale-a, imm-scale-b (no imm-trans-a/b).
// D = A B^T + (scale_d ? D : 0). The accumulator register lists come from wgmma.cuh's macros.
// clang-format off
#pragma once

#include <stdint.h>

#include "common/wgmma.cuh"

namespace p01::sm90 {

__device__ __forceinline__ void wgmma_ss_m64n128k32_e4m3(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " P01_WGMMA_REGS_64
               ", %64, %65, p, 1, 1;\n}\n"
               : P01_WGMMA_OUT64(d, 0) : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

}  // namespace p01::sm90
