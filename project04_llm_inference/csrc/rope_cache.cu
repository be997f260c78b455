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

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "pdl.cuh"

namespace {

constexpr int kThreads = 128;

template <typename T>
struct RopeParams {
  T* q;  // (T, Hq, D), token stride q_stride (elements)
  T* k;  // (T, Hkv, D), token stride k_stride
  const T* v;
  int64_t q_stride, k_stride, v_stride;
  const int64_t* positions;  // (T,)
  const float* cos_sin;      // (max_positions, D) contiguous
  T* k_cache;                // (num_blocks, block_size, Hkv, D) contiguous: slot s at s * Hkv * D
  T* v_cache;
  const int64_t* slot_mapping;  // (T,)
  int n_heads, n_kv_heads, head_dim;
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

template <typename T>
__global__ void __launch_bounds__(kThreads) rope_and_cache_kernel(const RopeParams<T> p) {
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
      T* dst = p.k_cache + cache_row + (int64_t)kh * D;
      *reinterpret_cast<uint4*>(dst + col) = a.raw;
      *reinterpret_cast<uint4*>(dst + half + col) = b.raw;
    }
  }

  if (slot < 0) return;
  // V: a plain 16-byte copy of the token's Hkv * D values into its slot.
  const int n_vec = p.n_kv_heads * D / kVec;
  for (int i = threadIdx.x; i < n_vec; i += kThreads) {
    const int h = i / (D / kVec), col = (i % (D / kVec)) * kVec;
    const T* src = p.v + t * p.v_stride + (int64_t)h * D + col;
    *reinterpret_cast<uint4*>(p.v_cache + cache_row + (int64_t)h * D + col) =
        *reinterpret_cast<const uint4*>(src);
  }
}

// Every kernel the binding launches, instantiated here so that this file alone compiles them all.
template __global__ void rope_and_cache_kernel<float>(const RopeParams<float>);
template __global__ void rope_and_cache_kernel<__nv_bfloat16>(const RopeParams<__nv_bfloat16>);
template __global__ void rope_and_cache_kernel<__half>(const RopeParams<__half>);

}  // namespace

// The torch binding below is compiled only by torch's extension build (which defines
// TORCH_EXTENSION_NAME); without it this file is plain CUDA, so a compile check needs no torch.
#ifdef TORCH_EXTENSION_NAME
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

namespace {

template <typename T>
void launch(torch::Tensor& q, torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& positions, const torch::Tensor& cos_sin, torch::Tensor& k_cache,
            torch::Tensor& v_cache, const torch::Tensor& slot_mapping, bool pdl,
            cudaStream_t stream) {
  RopeParams<T> p;
  p.q = reinterpret_cast<T*>(q.data_ptr());
  p.k = reinterpret_cast<T*>(k.data_ptr());
  p.v = reinterpret_cast<const T*>(v.data_ptr());
  p.q_stride = q.stride(0);
  p.k_stride = k.stride(0);
  p.v_stride = v.stride(0);
  p.positions = positions.data_ptr<int64_t>();
  p.cos_sin = cos_sin.data_ptr<float>();
  p.k_cache = reinterpret_cast<T*>(k_cache.data_ptr());
  p.v_cache = reinterpret_cast<T*>(v_cache.data_ptr());
  p.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.n_heads = static_cast<int>(q.size(1));
  p.n_kv_heads = static_cast<int>(k.size(1));
  p.head_dim = static_cast<int>(q.size(2));
  C10_CUDA_CHECK(p04::launch(rope_and_cache_kernel<T>, dim3(static_cast<unsigned>(q.size(0))),
                             dim3(kThreads), 0, stream, pdl, p));
}

}  // namespace

// Shapes, dtypes, strides and alignment are validated by the Python wrapper
// (kernels/rope_cache.py); this entry point only launches.
void rope_and_cache(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor positions,
                    torch::Tensor cos_sin, torch::Tensor k_cache, torch::Tensor v_cache,
                    torch::Tensor slot_mapping, bool pdl) {
  TORCH_CHECK(q.is_cuda() && k_cache.is_cuda(), "rope_and_cache: tensors must be on a CUDA device");
  if (q.size(0) == 0) return;
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  switch (q.scalar_type()) {
    case at::kBFloat16:
      launch<__nv_bfloat16>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, pdl,
                      stream);
      break;
    case at::kHalf:
      launch<__half>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, pdl,
               stream);
      break;
    case at::kFloat:
      launch<float>(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, pdl,
              stream);
      break;
    default:
      TORCH_CHECK(false, "rope_and_cache: q must be bfloat16, float16 or float32");
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rope_and_cache", &rope_and_cache,
        "RoPE on q (T, Hq, D) and k (T, Hkv, D) in place; rotated k and v into the paged cache");
}
#endif  // TORCH_EXTENSION_NAME
