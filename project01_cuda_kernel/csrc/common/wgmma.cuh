// The wgmma (warpgroup matrix multiply-accumulate) instructions of the Hopper kernels, for
// bfloat16 and float16 inputs with float32 accumulators, M = 64, K = 16, N a template argument.
// Inline PTX has no register arrays, so each form lists its accumulators one by one: the lists
// are built by the macros below, and every form is written once, for both input types and every
// N a kernel uses. The ss forms read A and B from shared memory (matrix descriptors) and are
// named by the majors of A and B, i.e. their transpose immediates:
//   ss_m64nNk16_kk: A and B K-major, imm-trans-a = imm-trans-b = 0. N = 128: the forward's
//     S = Q K^T; N = 64: the backward's S^T = K Q^T and dP^T = V dO^T.
//   ss_m64nNk16_kn: A K-major, B N-major (row-major (K, N)), imm-trans-b = 1. N = 256: GEMM step 9.
//   ss_m64nNk16_mn: A M-major, B N-major, imm-trans-a = imm-trans-b = 1. N = 32, 64: the
//     backward's dQ = dS K, dS read from the dS^T tile.
//   rs_m64nNk16: A from registers in the m16n8k16 A-fragment layout per warp, B N-major in shared
//     memory, imm-trans-b = 1. N = 64, 128: the forward's O += P V, the backward's dV += P^T dO
//     and dK += dS^T Q.
// D = A B + (scale_d ? D : 0) in every form.
// clang-format off
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// "{%0, %1, ..., %N-1}": the accumulator registers of an N-float fragment.
#define P01_WGMMA_REGS_16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define P01_WGMMA_REGS_32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define P01_WGMMA_REGS_64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define P01_WGMMA_REGS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// The matching "+f" operand lists, d[i] .. d[i + N - 1].
#define P01_WGMMA_OUT8(d, i) "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), \
                             "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define P01_WGMMA_OUT16(d) P01_WGMMA_OUT8(d, 0), P01_WGMMA_OUT8(d, 8)
#define P01_WGMMA_OUT32(d, i) P01_WGMMA_OUT8(d, (i) + 0), P01_WGMMA_OUT8(d, (i) + 8), \
                              P01_WGMMA_OUT8(d, (i) + 16), P01_WGMMA_OUT8(d, (i) + 24)
#define P01_WGMMA_OUT64(d, i) P01_WGMMA_OUT32(d, (i) + 0), P01_WGMMA_OUT32(d, (i) + 32)
#define P01_WGMMA_OUT128(d) P01_WGMMA_OUT64(d, 0), P01_WGMMA_OUT64(d, 64)

namespace p01::sm90 {

template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_m64nNk16_kk(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_m64nNk16_kn(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wgmma_ss_m64nNk16_mn(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs_m64nNk16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

// One ss form: NAME<T, N>, PTX the input type's name in the instruction. The N / 2 accumulators
// are operands %0 .. (REGS, OUT); the descriptors of A and B are %DA and %DB, scale_d is %SD;
// TRANS the two transpose immediates (imm-trans-a, imm-trans-b). scale-a = scale-b = 1.
#define P01_WGMMA_SS(NAME, T, PTX, N, REGS, OUT, DA, DB, SD, TRANS) \
template <> \
__device__ __forceinline__ void NAME<T, N>(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SD ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " " REGS \
               ", %" #DA ", %" #DB ", p, 1, 1, " TRANS ";\n}\n" \
               : OUT : "l"(desc_a), "l"(desc_b), "r"(scale_d)); \
}

// One rs form: A's four registers are %A0 .. %A3, B's descriptor %DB, scale_d %SD;
// imm-trans-b = 1 (there is no imm-trans-a: A comes from registers).
#define P01_WGMMA_RS(T, PTX, N, REGS, OUT, A0, A1, A2, A3, DB, SD) \
template <> \
__device__ __forceinline__ void wgmma_rs_m64nNk16<T, N>(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SD ", 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " " REGS \
               ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, 1;\n}\n" \
               : OUT \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)); \
}

// Every form for one input type: T the C++ type, PTX its name in the instruction.
#define P01_WGMMA_FORMS(T, PTX) \
P01_WGMMA_SS(wgmma_ss_m64nNk16_kk, T, PTX, 64, P01_WGMMA_REGS_32, P01_WGMMA_OUT32(d, 0), 32, 33, 34, "0, 0") \
P01_WGMMA_SS(wgmma_ss_m64nNk16_kk, T, PTX, 128, P01_WGMMA_REGS_64, P01_WGMMA_OUT64(d, 0), 64, 65, 66, "0, 0") \
P01_WGMMA_SS(wgmma_ss_m64nNk16_kn, T, PTX, 256, P01_WGMMA_REGS_128, P01_WGMMA_OUT128(d), 128, 129, 130, "0, 1") \
P01_WGMMA_SS(wgmma_ss_m64nNk16_mn, T, PTX, 32, P01_WGMMA_REGS_16, P01_WGMMA_OUT16(d), 16, 17, 18, "1, 1") \
P01_WGMMA_SS(wgmma_ss_m64nNk16_mn, T, PTX, 64, P01_WGMMA_REGS_32, P01_WGMMA_OUT32(d, 0), 32, 33, 34, "1, 1") \
P01_WGMMA_RS(T, PTX, 64, P01_WGMMA_REGS_32, P01_WGMMA_OUT32(d, 0), 32, 33, 34, 35, 36, 37) \
P01_WGMMA_RS(T, PTX, 128, P01_WGMMA_REGS_64, P01_WGMMA_OUT64(d, 0), 64, 65, 66, 67, 68, 69)

P01_WGMMA_FORMS(__nv_bfloat16, "bf16")
P01_WGMMA_FORMS(__half, "f16")

#undef P01_WGMMA_FORMS
#undef P01_WGMMA_SS
#undef P01_WGMMA_RS

}  // namespace p01::sm90
