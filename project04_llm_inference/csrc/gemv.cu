// Matrix-vector products for decode steps of a few tokens, with the RMSNorm in front and SwiGLU
// behind folded in.
//
// At batch 1 a decode step is a chain of weight reads: every projection reads its whole weight
// matrix to produce a handful of outputs, so its floor is bytes / HBM bandwidth. cuBLAS runs
// these shapes as GEMMs of M = 1..8 and, for the small ones, stays well under that floor; each
// RMSNorm and each silu-and-mul between them is one more launch of a ~2 us kernel that moves a
// few kilobytes. This kernel does the three in one pass:
//
//   preload   each warp issues the loads of its first weight chunk before anything that depends
//             on the previous kernel, so they are in flight during the wait for it (with PDL,
//             pdl.cuh, this kernel starts while the previous one still runs) and the prologue.
//   prologue  every CTA stages the T input rows in shared memory. With a norm it first forms the
//             residual sum h = x + residual (CTA 0 writes h out: the next layer's residual), then
//             normalises h (sum of squares reduced over the CTA), exactly as the separate RMSNorm
//             kernel rounds it.
//   main loop one warp per output row (two for SwiGLU: its gate and up rows), 16-byte streaming
//             loads of the weight, U of them in flight per lane, each multiplied against all T
//             staged rows; float32 accumulation, a warp shuffle reduction at the end.
//   epilogue  the output rounded to the model dtype, or silu(gate) * up, or (the QKV projection)
//             RoPE on the row pair of q and k and the k and v rows written to the paged cache,
//             which saves the separate RoPE kernel's launch (see gemv.h).
//
// Torch-free (launcher declared in gemv.h) so CI compiles it with nvcc alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemv.h"
#include "pdl.cuh"

namespace {

constexpr int kWarps = 8;     // warps per CTA
constexpr int kUnroll = 8;    // 16-byte weight loads in flight per lane and row
constexpr int kVec = 8;       // 16-bit elements per 16-byte load

template <typename T> struct Vec;
template <> struct Vec<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_f2(T2 v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ T2 from_f2(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
  static __device__ __forceinline__ float round(float v) {
    return __bfloat162float(__float2bfloat16(v));
  }
};
template <> struct Vec<__half> {
  using T2 = __half2;
  static __device__ __forceinline__ float2 to_f2(T2 v) { return __half22float2(v); }
  static __device__ __forceinline__ T2 from_f2(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float round(float v) { return __half2float(__float2half(v)); }
};

// Eight 16-bit values <-> eight floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const auto* p = reinterpret_cast<const typename Vec<T>::T2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = Vec<T>::to_f2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 v;
  auto* p = reinterpret_cast<typename Vec<T>::T2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = Vec<T>::from_f2(f[2 * i], f[2 * i + 1]);
  return v;
}

// acc += dot(w, x) over eight elements.
template <typename T>
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const auto* wp = reinterpret_cast<const typename Vec<T>::T2*>(&w);
  const auto* xp = reinterpret_cast<const typename Vec<T>::T2*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = Vec<T>::to_f2(wp[i]), b = Vec<T>::to_f2(xp[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// The weight is read once per step: stream it past L1 (evict-first) so x and the staged rows stay.
__device__ __forceinline__ uint4 load_stream(const uint4* p) { return __ldcs(p); }

// Token t's QKV rows r and r + half of one head, x1 and x2 (already rounded to the model dtype, as
// the unfused path stores them): q and k rotated at the token's position exactly as
// rope_cache.cu rounds it (round-to-nearest multiplies and adds, no FMA contraction), written to
// the output row `out`; k and v also to the token's cache slot.
template <typename T>
__device__ __forceinline__ void rope_epilogue(const GemvRope& p, T* out, int r, int half, int t,
                                              float x1, float x2) {
  const int D = p.head_dim, h = r / D, j = r % D;
  if (h < p.n_heads + p.n_kv_heads) {
    const float* cs = p.cos_sin + p.positions[t] * D;
    const float c = cs[j], s = cs[half + j];
    const float y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    const float y2 = __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c));
    x1 = y1, x2 = y2;
  }
  const T a = Vec<T>::from_f2(x1, x1).x, b = Vec<T>::from_f2(x2, x2).x;
  out[r] = a;
  out[r + half] = b;
  if (h < p.n_heads) return;
  const int64_t slot = p.slots[t];
  if (slot < 0) return;
  const bool is_k = h < p.n_heads + p.n_kv_heads;
  const int kh = h - p.n_heads - (is_k ? 0 : p.n_kv_heads);
  T* cache = static_cast<T*>(is_k ? p.k_cache : p.v_cache) +
             (slot * p.n_kv_heads + kh) * D + j;
  cache[0] = a;
  cache[half] = b;
}

// kMode: what a warp's unit of work is and what the epilogue does with it.
enum Mode { kPlain = 0, kSilu = 1, kRope = 2 };

template <typename T, int NT, bool kNorm, bool kResidual, int kMode>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                T* __restrict__ residual_out, const T* __restrict__ norm_w,
                const T* __restrict__ w, T* __restrict__ out, int tokens, int k, int n_out,
                int n_units, float eps, const GemvRope rope) {
  extern __shared__ uint4 staged[];  // (NT, k / 8) 16-byte chunks of the (normalised) inputs
  const int kvec = k / kVec;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  p04::allow_next_kernel();  // the next kernel may start prefetching its own weights

  // ---- preload: this warp's first weight chunk (the weights depend on no earlier kernel) -----
  // A unit is one output row (plain), a gate row and its up row (SwiGLU), or rows j and
  // j + head_dim / 2 of one head (RoPE): the R weight rows a warp reads together.
  constexpr int R = kMode == kPlain ? 1 : 2;
  const int half = kMode == kRope ? rope.head_dim / 2 : 0;
  auto first_row = [&](int unit) {  // the unit's first weight row
    return kMode == kRope ? (unit / half) * rope.head_dim + unit % half : unit;
  };
  const int second = kMode == kRope ? half : n_out;  // rows from the first to the second
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const int stride = gridDim.x * kWarps;
  uint4 wl[R][kUnroll];
  // wl = the kUnroll 16-byte chunks c0 + 32 u of the unit's R rows
  auto load_chunk = [&](int unit, int c0) {
    const int r = first_row(unit);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * 32;
#pragma unroll
      for (int q = 0; q < R; ++q)
        wl[q][u] = c < kvec ? load_stream(wv + (int64_t)(r + q * second) * kvec + c)
                            : make_uint4(0, 0, 0, 0);
    }
  };
  int row = blockIdx.x * kWarps + warp;  // the unit
  if (row < n_units) load_chunk(row, lane);
  p04::wait_previous_kernel();  // x and residual are the previous kernel's outputs

  // ---- prologue: stage the T rows (padding rows t >= tokens are zeros) ----------------------
  float ss[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) ss[t] = 0.f;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4* rv = reinterpret_cast<const uint4*>(residual);
  for (int c = tid; c < kvec; c += blockDim.x) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (t < tokens) {
        v = xv[(int64_t)t * kvec + c];
        if constexpr (kResidual) {
          float a[8], b[8];
          unpack8<T>(v, a);
          unpack8<T>(rv[(int64_t)t * kvec + c], b);
#pragma unroll
          for (int i = 0; i < 8; ++i) a[i] += b[i];
          v = pack8<T>(a);  // the residual stream is stored in the model dtype
          if (blockIdx.x == 0) reinterpret_cast<uint4*>(residual_out)[(int64_t)t * kvec + c] = v;
        }
        if constexpr (kNorm) {
          float a[8];
          unpack8<T>(v, a);
#pragma unroll
          for (int i = 0; i < 8; ++i) ss[t] = fmaf(a[i], a[i], ss[t]);
        }
      }
      staged[t * kvec + c] = v;
    }
  }
  if constexpr (kNorm) {
    __shared__ float partial[kWarps][NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float v = ss[t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) partial[warp][t] = v;
    }
    __syncthreads();
    float inv[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float s = 0.f;
      for (int i = 0; i < kWarps; ++i) s += partial[i][t];
      inv[t] = rsqrtf(s / k + eps);
    }
    const uint4* nw = reinterpret_cast<const uint4*>(norm_w);
    for (int c = tid; c < kvec; c += blockDim.x) {
      float g[8];
      unpack8<T>(nw[c], g);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float a[8];
        unpack8<T>(staged[t * kvec + c], a);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = Vec<T>::round(a[i] * inv[t]) * g[i];
        staged[t * kvec + c] = pack8<T>(a);
      }
    }
  }
  __syncthreads();

  // ---- main loop: one warp per output row (gate and up rows for SwiGLU) ----------------------
  for (; row < n_units; row += stride) {
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
    for (int c0 = lane; c0 < kvec; c0 += 32 * kUnroll) {
      // wl holds chunk c0 of this row
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 32;
        if (c < kvec) {
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            const uint4 xs = staged[t * kvec + c];
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][t] = dot8<T>(wl[r][u], xs, acc[r][t]);
          }
        }
      }
      // the next chunk, or the next row's first: in flight during the reduction and the store
      const int next = c0 + 32 * kUnroll;
      if (next < kvec) {
        load_chunk(row, next);
      } else if (row + stride < n_units) {
        load_chunk(row + stride, lane);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    if (lane < NT && lane < tokens) {
      // lane t writes token t's output (a register array indexed by a constant after unrolling)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t == lane) {
          if constexpr (kMode == kRope) {
            rope_epilogue<T>(rope, out + (int64_t)t * n_out, first_row(row), half, t,
                             Vec<T>::round(acc[0][t]), Vec<T>::round(acc[1][t]));
          } else {
            float v;
            if constexpr (kMode == kSilu) {
              const float g = Vec<T>::round(acc[0][t]), up = Vec<T>::round(acc[1][t]);
              v = g / (1.f + __expf(-g)) * up;
            } else {
              v = acc[0][t];
            }
            out[(int64_t)t * n_out + row] = Vec<T>::from_f2(v, v).x;
          }
        }
      }
    }
  }
}

template <typename T, int NT, bool kNorm, bool kResidual, int kMode>
cudaError_t launch_typed(const GemvArgs& a, cudaStream_t stream) {
  auto kernel = gemv_kernel<T, NT, kNorm, kResidual, kMode>;
  const size_t smem = (size_t)NT * a.k * sizeof(T);
  if (smem > 48 * 1024) {
    // Opt in once per instantiation to the largest size asked for so far.
    static size_t opted = 48 * 1024;
    if (smem > opted) {
      const cudaError_t err =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (err != cudaSuccess) return err;
      opted = smem;
    }
  }
  const int n_units = kMode == kRope ? a.n_out / 2 : a.n_out;
  int ctas = (n_units + kWarps - 1) / kWarps;
  if (a.max_ctas > 0 && ctas > a.max_ctas) ctas = a.max_ctas;
  return p04::launch(kernel, dim3(ctas), dim3(kWarps * 32), smem, stream, a.pdl,
                     static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
                     static_cast<T*>(a.residual_out), static_cast<const T*>(a.norm_w),
                     static_cast<const T*>(a.w), static_cast<T*>(a.out), a.tokens, a.k,
                     a.n_out, n_units, a.eps, a.rope);
}

template <typename T, int NT>
cudaError_t launch_mode(const GemvArgs& a, cudaStream_t stream) {
  const bool norm = a.norm_w != nullptr, res = a.residual != nullptr;
  const bool rope = a.rope.cos_sin != nullptr;
  if (rope) {  // the QKV projection: normalised input, with or without the residual add
    const int D = a.rope.head_dim;
    if (!norm || a.silu_mul || D <= 0 || D % 2 ||
        a.n_out != (a.rope.n_heads + 2 * a.rope.n_kv_heads) * D)
      return cudaErrorInvalidValue;
    return res ? launch_typed<T, NT, true, true, kRope>(a, stream)
               : launch_typed<T, NT, true, false, kRope>(a, stream);
  }
  if (!norm) {
    if (res || a.silu_mul) return cudaErrorInvalidValue;  // not a combination the model uses
    return launch_typed<T, NT, false, false, kPlain>(a, stream);
  }
  if (!res) {
    return a.silu_mul ? launch_typed<T, NT, true, false, kSilu>(a, stream)
                      : launch_typed<T, NT, true, false, kPlain>(a, stream);
  }
  return a.silu_mul ? launch_typed<T, NT, true, true, kSilu>(a, stream)
                    : launch_typed<T, NT, true, true, kPlain>(a, stream);
}

// One and two rows. Measured on an H200 (bench gemv-kernel), the kernel beats cuBLAS and the
// separate norm and activation kernels there or matches it (the LM head: 1.00x and 0.98x); from
// four rows on, converting the staged rows for every weight chunk makes it compute-bound and
// cuBLAS's GEMMs catch up or win.
template <typename T>
cudaError_t launch_tokens(const GemvArgs& a, cudaStream_t stream) {
  if (a.tokens <= 1) return launch_mode<T, 1>(a, stream);
  return launch_mode<T, 2>(a, stream);
}

}  // namespace

cudaError_t launch_gemv(const GemvArgs& a, DType dtype, cudaStream_t stream) {
  if (a.tokens == 0 || a.n_out == 0) return cudaSuccess;
  if (a.tokens > 2 || a.k % kVec != 0 || a.k <= 0) return cudaErrorInvalidValue;
  if (a.residual != nullptr && a.residual_out == nullptr) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kBF16: return launch_tokens<__nv_bfloat16>(a, stream);
    case DType::kF16: return launch_tokens<__half>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
