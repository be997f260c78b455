// Fused element-wise kernels of the decoder layer: RMSNorm (with the residual add folded in) and
// the SwiGLU activation. In a decode step each moves a few kilobytes per token; their cost is
// launches and passes, so each does its work in one pass: one CTA per token row.
// Torch-free (plain launchers, declared in norm_act.h) so CI compiles it with nvcc alone;
// norm_act_binding.cpp is the PyTorch side.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "norm_act.h"
#include "pdl.cuh"

namespace {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f(float v) { return v; }
template <> __device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_f(float v) { return __float2half(v); }

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = lane < n_warps ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;  // every thread holds the total
}

// out[t] = rms_norm(in[t]) * w, or with residual: res[t] += x[t]; x[t] = rms_norm(res[t]) * w.
// The row (hidden size <= 8192) is kept in registers between the two passes: 8 floats a thread.
constexpr int kMaxPerThread = 8;

template <typename T, bool kResidual>
__global__ void rms_norm_kernel(T* __restrict__ x, T* __restrict__ res, T* __restrict__ out,
                                const T* __restrict__ w, int hidden, float eps) {
  p04::allow_next_kernel();
  p04::wait_previous_kernel();  // x and the residual come from earlier kernels
  const int64_t row = blockIdx.x;
  T* xr = x + row * hidden;
  T* rr = kResidual ? res + row * hidden : nullptr;
  float vals[kMaxPerThread];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    float v = 0.f;
    if (c < hidden) {
      v = to_f(xr[c]);
      if constexpr (kResidual) {
        v += to_f(rr[c]);
        const T vr = from_f<T>(v);  // the residual stream is stored in the model dtype
        rr[c] = vr;
        v = to_f(vr);
      }
    }
    vals[i] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / hidden + eps);
  T* orow = kResidual ? xr : out + row * hidden;
#pragma unroll
  for (int i = 0; i < kMaxPerThread; ++i) {
    const int c = threadIdx.x + i * blockDim.x;
    // Llama's order: normalise in float32, round to the model dtype, then scale by the weight.
    if (c < hidden) orow[c] = from_f<T>(to_f(from_f<T>(vals[i] * inv)) * to_f(w[c]));
  }
}

template <typename T>
__global__ void silu_and_mul_kernel(const T* __restrict__ in, T* __restrict__ out, int f) {
  p04::allow_next_kernel();
  p04::wait_previous_kernel();
  const int64_t row = blockIdx.x;
  const T* g = in + row * 2 * f;
  const T* u = g + f;
  for (int c = threadIdx.x; c < f; c += blockDim.x) {
    const float a = to_f(g[c]);
    out[row * f + c] = from_f<T>(a / (1.f + __expf(-a)) * to_f(u[c]));
  }
}

int threads_for(int hidden) {
  int t = (hidden + kMaxPerThread - 1) / kMaxPerThread;
  t = ((t + 31) / 32) * 32;
  return t < 32 ? 32 : (t > 1024 ? 1024 : t);
}

#define P04_DISPATCH(DTYPE, ...)                                                     \
  switch (DTYPE) {                                                                   \
    case DType::kBF16: { using scalar_t = __nv_bfloat16; __VA_ARGS__(); break; }     \
    case DType::kF16: { using scalar_t = __half; __VA_ARGS__(); break; }             \
    case DType::kF32: { using scalar_t = float; __VA_ARGS__(); break; }              \
  }

}  // namespace

cudaError_t launch_rms_norm(void* out, void* x, void* residual, const void* w, int rows,
                            int hidden, float eps, DType dtype, cudaStream_t stream, bool pdl) {
  if (rows == 0) return cudaSuccess;
  if (hidden > 1024 * kMaxPerThread) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  P04_DISPATCH(dtype, [&] {
    const dim3 grid(rows), block(threads_for(hidden));
    if (residual != nullptr) {
      err = p04::launch(rms_norm_kernel<scalar_t, true>, grid, block, 0, stream, pdl,
                        static_cast<scalar_t*>(x), static_cast<scalar_t*>(residual),
                        static_cast<scalar_t*>(nullptr), static_cast<const scalar_t*>(w), hidden,
                        eps);
    } else {
      err = p04::launch(rms_norm_kernel<scalar_t, false>, grid, block, 0, stream, pdl,
                        static_cast<scalar_t*>(x), static_cast<scalar_t*>(nullptr),
                        static_cast<scalar_t*>(out), static_cast<const scalar_t*>(w), hidden,
                        eps);
    }
  });
  return err;
}

cudaError_t launch_silu_and_mul(void* out, const void* in, int rows, int f, DType dtype,
                                cudaStream_t stream, bool pdl) {
  if (rows == 0) return cudaSuccess;
  const int threads = f >= 1024 ? 1024 : ((f + 31) / 32) * 32;
  cudaError_t err = cudaSuccess;
  P04_DISPATCH(dtype, [&] {
    err = p04::launch(silu_and_mul_kernel<scalar_t>, dim3(rows), dim3(threads), 0, stream, pdl,
                      static_cast<const scalar_t*>(in), static_cast<scalar_t*>(out), f);
  });
  return err;
}
