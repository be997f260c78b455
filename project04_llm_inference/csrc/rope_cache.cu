// Fused rotary position embedding (rotate-half) + KV-cache write, one CTA per token.
//
// q (T, Hq, D) and k (T, Hkv, D) are rotated in place; the rotated k and v (T, Hkv, D) are
// written to k_cache / v_cache (num_blocks, block_size, Hkv, D) at slot_mapping[t] (int64; -1 =
// a padding token: rotated, not written). q, k and v may be views into a fused qkv projection
// (T, (Hq + 2 Hkv) * D): each has its own token stride, heads and dims contiguous inside a token.
//
// Rotation of the pair (x1, x2) = (x[i], x[i + D/2]) at position p, with cos/sin read from the
// float32 table cos_sin (max_positions, D) = [cos | sin]:
//   x1' = x1 cos - x2 sin,   x2' = x1 sin + x2 cos
// computed in float32 with round-to-nearest multiplies and adds kept apart (no FMA contraction),
// in the reference's order, so the result matches the PyTorch reference bit for bit.
//
// Each thread moves 16 bytes of x1 and 16 bytes of x2 (8 bf16/fp16 or 4 float32 dims), so the
// 4 (D = 64, bf16) or 8 (D = 128) threads of one head read its whole row in 16-byte loads.
//
// An FP8 cache (C = fp8_t, float8_e4m3fn): the rotated k and the v rows, already rounded to T,
// are divided by their KV head's scale (k_scale, v_scale: (Hkv,) float32) and stored as e4m3
// (fp8_kv.cuh), 8 (bf16/fp16) or 4 (float32) bytes per thread's store. The 16-bit cache
// (C = T) is the same code as before the FP8 variant existed.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "fp8_kv.cuh"
#include "pdl.cuh"

namespace {

constexpr int kThreads = 128;

template <typename T, typename C = T>
struct RopeParams {
  T* q;  // (T, Hq, D), token stride q_stride (elements)
  T* k;  // (T, Hkv, D), token stride k_stride
  const T* v;
  int64_t q_stride, k_stride, v_stride;
  const int64_t* positions;  // (T,)
  const float* cos_sin;      // (max_positions, D) contiguous
  C* k_cache;                // (num_blocks, block_size, Hkv, D) contiguous: slot s at s * Hkv * D
  C* v_cache;
  const int64_t* slot_mapping;  // (T,)
  int n_heads, n_kv_heads, head_dim;
  const float* k_scale;  // (Hkv,): an FP8 cache's scales (unused when C = T)
  const float* v_scale;
};

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

// kVec values of T, widened to float (the FP8 store divides them by the scale in float32).
template <typename T, int N>
__device__ __forceinline__ void widen(const T (&e)[N], float (&f)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) f[i] = to_float(e[i]);
}

template <typename T, typename C>
__global__ void __launch_bounds__(kThreads) rope_and_cache_kernel(const RopeParams<T, C> p) {
  constexpr bool kFp8 = !std::is_same_v<C, T>;
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  union Vec {
    uint4 raw;
    T e[kVec];
  };
  p04::allow_next_kernel();
  p04::wait_previous_kernel();  // q, k, v, positions and slots come from earlier kernels
  const int t = blockIdx.x;
  const int D = p.head_dim, half = D / 2;
  const int64_t pos = p.positions[t];
  const int64_t slot = p.slot_mapping[t];
  const float* cos_row = p.cos_sin + pos * D;
  const float* sin_row = cos_row + half;
  const int64_t cache_row = slot * p.n_kv_heads * D;  // meaningful only when slot >= 0

  // Rotation: items are (head of q then k, 16-byte column of the first half).
  const int per_head = half / kVec;
  const int n_rot = (p.n_heads + p.n_kv_heads) * per_head;
  for (int i = threadIdx.x; i < n_rot; i += kThreads) {
    const int h = i / per_head, col = (i % per_head) * kVec;
    const bool is_k = h >= p.n_heads;
    const int kh = h - p.n_heads;
    T* x = is_k ? p.k + t * p.k_stride + (int64_t)kh * D : p.q + t * p.q_stride + (int64_t)h * D;
    Vec a, b;
    a.raw = *reinterpret_cast<const uint4*>(x + col);
    b.raw = *reinterpret_cast<const uint4*>(x + half + col);
    float c[kVec], s[kVec];
#pragma unroll
    for (int e = 0; e < kVec; e += 4) {
      *reinterpret_cast<float4*>(c + e) = *reinterpret_cast<const float4*>(cos_row + col + e);
      *reinterpret_cast<float4*>(s + e) = *reinterpret_cast<const float4*>(sin_row + col + e);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float x1 = to_float(a.e[e]), x2 = to_float(b.e[e]);
      a.e[e] = from_float<T>(__fsub_rn(__fmul_rn(x1, c[e]), __fmul_rn(x2, s[e])));
      b.e[e] = from_float<T>(__fadd_rn(__fmul_rn(x1, s[e]), __fmul_rn(x2, c[e])));
    }
    *reinterpret_cast<uint4*>(x + col) = a.raw;
    *reinterpret_cast<uint4*>(x + half + col) = b.raw;
    if (is_k && slot >= 0) {
      C* dst = p.k_cache + cache_row + (int64_t)kh * D;
      if constexpr (kFp8) {
        const float s = p.k_scale[kh];
        float fa[kVec], fb[kVec];
        widen(a.e, fa);
        widen(b.e, fb);
        p04::store_fp8(dst + col, fa, s);
        p04::store_fp8(dst + half + col, fb, s);
      } else {
        *reinterpret_cast<uint4*>(dst + col) = a.raw;
        *reinterpret_cast<uint4*>(dst + half + col) = b.raw;
      }
    }
  }

  if (slot < 0) return;
  // V: a plain 16-byte copy of the token's Hkv * D values into its slot.
  const int n_vec = p.n_kv_heads * D / kVec;
  for (int i = threadIdx.x; i < n_vec; i += kThreads) {
    const int h = i / (D / kVec), col = (i % (D / kVec)) * kVec;
    const T* src = p.v + t * p.v_stride + (int64_t)h * D + col;
    if constexpr (kFp8) {
      Vec x;
      x.raw = *reinterpret_cast<const uint4*>(src);
      float f[kVec];
      widen(x.e, f);
      p04::store_fp8(p.v_cache + cache_row + (int64_t)h * D + col, f, p.v_scale[h]);
    } else {
      *reinterpret_cast<uint4*>(p.v_cache + cache_row + (int64_t)h * D + col) =
          *reinterpret_cast<const uint4*>(src);
    }
  }
}

// Every kernel the binding launches, instantiated here so that this file alone compiles them all.
#define P04_ROPE_KERNELS(T)                                                                 \
  template __global__ void rope_and_cache_kernel<T, T>(const RopeParams<T, T>);             \
  template __global__ void rope_and_cache_kernel<T, p04::fp8_t>(const RopeParams<T, p04::fp8_t>);
P04_ROPE_KERNELS(float)
P04_ROPE_KERNELS(__nv_bfloat16)
P04_ROPE_KERNELS(__half)
#undef P04_ROPE_KERNELS

}  // namespace

// The torch binding below is compiled only by torch's extension build (which defines
// TORCH_EXTENSION_NAME); without it this file is plain CUDA, so a compile check needs no torch.
#ifdef TORCH_EXTENSION_NAME
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

namespace {

template <typename T, typename C>
void launch(torch::Tensor& q, torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& positions, const torch::Tensor& cos_sin, torch::Tensor& k_cache,
            torch::Tensor& v_cache, const torch::Tensor& slot_mapping, const float* k_scale,
            const float* v_scale, bool pdl, cudaStream_t stream) {
  RopeParams<T, C> p;
  p.q = reinterpret_cast<T*>(q.data_ptr());
  p.k = reinterpret_cast<T*>(k.data_ptr());
  p.v = reinterpret_cast<const T*>(v.data_ptr());
  p.q_stride = q.stride(0);
  p.k_stride = k.stride(0);
  p.v_stride = v.stride(0);
  p.positions = positions.data_ptr<int64_t>();
  p.cos_sin = cos_sin.data_ptr<float>();
  p.k_cache = reinterpret_cast<C*>(k_cache.data_ptr());
  p.v_cache = reinterpret_cast<C*>(v_cache.data_ptr());
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.n_heads = static_cast<int>(q.size(1));
  p.n_kv_heads = static_cast<int>(k.size(1));
  p.head_dim = static_cast<int>(q.size(2));
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  C10_CUDA_CHECK(p04::launch(rope_and_cache_kernel<T, C>,
                             dim3(static_cast<unsigned>(q.size(0))), dim3(kThreads), 0, stream,
                             pdl, p));
}

template <typename T>
void launch_for_cache(torch::Tensor& q, torch::Tensor& k, const torch::Tensor& v,
                      const torch::Tensor& positions, const torch::Tensor& cos_sin,
                      torch::Tensor& k_cache, torch::Tensor& v_cache,
                      const torch::Tensor& slot_mapping, const std::optional<torch::Tensor>& k_scale,
                      const std::optional<torch::Tensor>& v_scale, bool pdl, cudaStream_t stream) {
  if (k_cache.scalar_type() == at::kFloat8_e4m3fn) {
    TORCH_CHECK(k_scale.has_value() && v_scale.has_value() &&
                    k_scale->scalar_type() == at::kFloat && v_scale->scalar_type() == at::kFloat &&
                    k_scale->numel() == k.size(1) && v_scale->numel() == k.size(1),
                "rope_and_cache: an FP8 cache needs float32 k_scale and v_scale of Hkv values");
    launch<T, p04::fp8_t>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                          k_scale->data_ptr<float>(), v_scale->data_ptr<float>(), pdl, stream);
  } else {
    TORCH_CHECK(k_cache.scalar_type() == q.scalar_type(),
                "rope_and_cache: the cache must have q's dtype or float8_e4m3fn");
    launch<T, T>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, nullptr, nullptr,
                 pdl, stream);
  }
}

}  // namespace

// Shapes, dtypes, strides and alignment are validated by the Python wrapper
// (kernels/rope_cache.py); this entry point only launches.
void rope_and_cache(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor positions,
                    torch::Tensor cos_sin, torch::Tensor k_cache, torch::Tensor v_cache,
                    torch::Tensor slot_mapping, std::optional<torch::Tensor> k_scale,
                    std::optional<torch::Tensor> v_scale, bool pdl) {
  TORCH_CHECK(q.is_cuda() && k_cache.is_cuda(), "rope_and_cache: tensors must be on a CUDA device");
  if (q.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  switch (q.scalar_type()) {
    case at::kBFloat16:
      launch_for_cache<__nv_bfloat16>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                                      k_scale, v_scale, pdl, stream);
      break;
    case at::kHalf:
      launch_for_cache<__half>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                               k_scale, v_scale, pdl, stream);
      break;
    case at::kFloat:
      launch_for_cache<float>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                              k_scale, v_scale, pdl, stream);
      break;
    default:
      TORCH_CHECK(false, "rope_and_cache: q must be bfloat16, float16 or float32");
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope_and_cache", &rope_and_cache,
        "RoPE on q (T, Hq, D) and k (T, Hkv, D) in place; rotated k and v into the paged cache "
        "(16-bit, or e4m3 with per-KV-head scales)");
}
#endif  // TORCH_EXTENSION_NAME
