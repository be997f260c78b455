// The FP8 KV cache's element conversions, written once for the cache write (rope_cache.cu) and
// the attention reads (paged_decode.cu, paged_prefill.cu). The format is kernels/kv_quant.py's:
// a cached value is round_e4m3(clamp(x / scale, -448, 448)), one float32 scale per KV head.
//
// Writing divides in float32 with IEEE rounding (__fdiv_rn, as torch's x / scale does) and rounds
// to e4m3 to nearest even, saturating at +-448 (cvt...satfinite), so the CUDA write stores the
// same bytes as the PyTorch reference. Reading converts e4m3 to the 16-bit compute dtype, which
// is exact (every e4m3 value, subnormals included, is a float16 and a bfloat16 value); the scale
// is applied by the caller, once per CTA, outside the inner loops.
//
// Byte order: element 2i of a pair sits in the low byte, as in memory (little-endian).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace p04 {

using fp8_t = __nv_fp8_storage_t;  // one e4m3 byte

// Two floats -> two e4m3 bytes (element a in the low byte).
__device__ __forceinline__ uint16_t fp8x2_from_floats(float a, float b) {
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

// N floats divided by scale, stored as N e4m3 bytes at dst (N * 1 bytes, N-byte aligned).
template <int N>
__device__ __forceinline__ void store_fp8(fp8_t* dst, const float (&x)[N], float scale) {
  static_assert(N == 4 || N == 8, "4 or 8 e4m3 bytes per store");
  union {
    uint16_t pair[N / 2];
    uint32_t w[N / 4];
  } u;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    u.pair[i] = fp8x2_from_floats(__fdiv_rn(x[2 * i], scale), __fdiv_rn(x[2 * i + 1], scale));
  }
  if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(u.w[0], u.w[1]);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = u.w[0];
  }
}

// Two e4m3 bytes -> two 16-bit values of T packed in one b32 register (exact).
template <typename T>
__device__ __forceinline__ uint32_t pack2_from_fp8x2(uint16_t x);

template <>
__device__ __forceinline__ uint32_t pack2_from_fp8x2<__half>(uint16_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

template <>
__device__ __forceinline__ uint32_t pack2_from_fp8x2<__nv_bfloat16>(uint16_t x) {
  // e4m3 -> float16 (exact) -> float32 (exact) -> bfloat16 (exact: 3 mantissa bits fit in 7)
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// 16 e4m3 bytes (one 16-byte chunk) -> 16 values of T as two 16-byte chunks: lo holds elements
// 0..7, hi 8..15.
template <typename T>
__device__ __forceinline__ void fp8x16_to_16bit(const uint4& in, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = pack2_from_fp8x2<T>(static_cast<uint16_t>(w[i] & 0xffffu));
    o[2 * i + 1] = pack2_from_fp8x2<T>(static_cast<uint16_t>(w[i] >> 16));
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

}  // namespace p04
