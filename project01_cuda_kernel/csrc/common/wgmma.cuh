// The wgmma (warpgroup matrix multiply-accumulate) instructions of the Hopper kernels, for
// bfloat16 and float16 inputs with float32 accumulators. Inline PTX has no register arrays, so
// each form lists its accumulators one by one: the lists are built by the macros below, and
// every form is written once for both input types.
//   ss_m64n256k16 (GEMM step 9): A K-major, B N-major (row-major (K, N)): imm-trans-b = 1.
//   ss_m64n128k16 (attention S = Q K^T): A and B both K-major: imm-trans-a = imm-trans-b = 0.
//   rs_m64n{64,128}k16 (attention O += P V): A from registers in the m16n8k16 A-fragment layout
//     per warp, B (V) N-major in shared memory: imm-trans-b = 1.
// D = A B + (scale_d ? D : 0) in every form.
// clang-format off
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// "{%0, %1, ..., %N-1}": the accumulator registers of an N-float fragment.
#define P01_WGMMA_REGS_32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define P01_WGMMA_REGS_64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define P01_WGMMA_REGS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// The matching "+f" operand lists, d[i] .. d[i + N - 1].
#define P01_WGMMA_OUT8(d, i) "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), \
                             "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define P01_WGMMA_OUT32(d, i) P01_WGMMA_OUT8(d, (i) + 0), P01_WGMMA_OUT8(d, (i) + 8), \
                              P01_WGMMA_OUT8(d, (i) + 16), P01_WGMMA_OUT8(d, (i) + 24)
#define P01_WGMMA_OUT64(d, i) P01_WGMMA_OUT32(d, (i) + 0), P01_WGMMA_OUT32(d, (i) + 32)
#define P01_WGMMA_OUT128(d) P01_WGMMA_OUT64(d, 0), P01_WGMMA_OUT64(d, 64)

namespace p01::sm90 {

template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T>
__device__ __forceinline__ void wgmma_ss_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_m64nNk16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

// Every form for one input type: T the C++ type, PTX its name in the instruction.
#define P01_WGMMA_FORMS(T, PTX) \
template <> \
__device__ __forceinline__ void wgmma_ss_m64n256k16<T>(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX "." PTX " " P01_WGMMA_REGS_128 \
               ", %128, %129, p, 1, 1, 0, 1;\n}\n" \
               : P01_WGMMA_OUT128(d) : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
template <> \
__device__ __forceinline__ void wgmma_ss_m64n128k16<T>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " P01_WGMMA_REGS_64 \
               ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
               : P01_WGMMA_OUT64(d, 0) : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
} \
template <> \
__device__ __forceinline__ void wgmma_rs_m64nNk16<T, 64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " P01_WGMMA_REGS_32 \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
               : P01_WGMMA_OUT32(d, 0) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)); \
} \
template <> \
__device__ __forceinline__ void wgmma_rs_m64nNk16<T, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX " " P01_WGMMA_REGS_64 \
               ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
               : P01_WGMMA_OUT64(d, 0) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)); \
}

P01_WGMMA_FORMS(__nv_bfloat16, "bf16")
P01_WGMMA_FORMS(__half, "f16")

#undef P01_WGMMA_FORMS

}  // namespace p01::sm90
