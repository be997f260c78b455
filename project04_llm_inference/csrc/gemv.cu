// Matrix-vector products for decode steps of a few tokens, with the RMSNorm in front and SwiGLU
// behind folded in.
//
// At batch 1 a decode step is a chain of weight reads: every projection reads its whole weight
// matrix to produce a handful of outputs, so its floor is bytes / HBM bandwidth. cuBLAS runs
// these shapes as GEMMs of M = 1..8 and, for the small ones, stays well under that floor; each
// RMSNorm and each silu-and-mul between them is one more launch of a short kernel that moves a
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
// That is the kernel for one and two tokens. For three to eight, gemv_mma_kernel (below) keeps
// the prologue and the epilogues and runs the product on tensor cores instead (sm_80+).
// FP8 weights (e4m3, a float32 scale per row; one and two tokens, sm_89+): the same kernel with
// W = __nv_fp8_e4m3 reads 16 weights per 16-byte load, half the bytes of a 16-bit weight, and
// multiplies each row's float32 dot product by its scale before the epilogue.
//
// Torch-free (launcher declared in gemv.h) so CI compiles it with nvcc alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "gemv.h"
#include "pdl.cuh"

namespace {

constexpr int kWarps = 8;     // warps per CTA
constexpr int kUnroll = 8;    // 16-byte weight loads in flight per lane and row
constexpr int kVec = 8;       // 16-bit elements per 16-byte load
constexpr int kFp8MaxTokens = 2;  // FP8 weights: the SIMT kernel's one and two tokens

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

// ---- FP8 weights (e4m3, W8A16) -----------------------------------------------------------
// A 16-byte load holds 16 e4m3 weights. Each pair becomes an f16x2 in one instruction
// (cvt.rn.f16x2.e4m3x2, sm_89+), each half then a float: 1.5 instructions a weight, exact (every
// e4m3 value, subnormals included, is an f16 value). The alternatives cost more: the scalar
// cuda_fp8.h conversion to float goes through the same f16 step one value at a time (2 a weight);
// sm_89/sm_90 have no e4m3 -> bf16 instruction (it goes through f16 or float); shifting the
// e4m3 bits into a bf16 or float exponent field scales every value by 2^-120, and the products
// of small weights then fall below float32's normal range, which --use_fast_math flushes to zero.
// Below sm_89 there is no such instruction: the FP8 instantiations trap there (the Python side
// never launches them: it asks for compute capability 8.9 first).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define P04_GEMV_NO_FP8 1
#endif

// Sixteen e4m3 weights (byte i of the load is k = i) -> sixteen floats.
__device__ __forceinline__ void unpack16_e4m3(const uint4& v, float (&f)[16]) {
#ifndef P04_GEMV_NO_FP8
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // the word's two 16-bit halves as the conversion's operands (register halves: no shift)
    uint32_t lo, hi;
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\n"
        "cvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(words[i]));
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    f[4 * i] = a.x, f[4 * i + 1] = a.y, f[4 * i + 2] = b.x, f[4 * i + 3] = b.y;
  }
#else
  __trap();  // launched only on compute capability 8.9 and newer
#pragma unroll
  for (int i = 0; i < 16; ++i) f[i] = 0.f;
#endif
}

// acc += dot(w, x) over sixteen elements: w converted once (unpack16_e4m3), x the two staged
// 16-byte chunks of the same sixteen k (the first eight in lo, the last eight in hi).
template <typename T>
__device__ __forceinline__ float dot16(const float (&w)[16], const uint4& lo, const uint4& hi,
                                       float acc) {
  float a[8];
  unpack8<T>(lo, a);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(w[i], a[i], acc);
  unpack8<T>(hi, a);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(w[8 + i], a[i], acc);
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

// W: the weight's element type, T (the model's 16-bit dtype) or __nv_fp8_e4m3 (FP8 weights,
// one float32 scale per row in w_scale, applied to the row's float32 dot product before the
// epilogue; the activations stay in T: W8A16). The 16-bit instantiations (W = T) compile to the
// code they compiled to before FP8 existed: every FP8 difference is an `if constexpr`, and
// w_scale is the last parameter, so the others keep their places.
//   FP8 layout: a lane's 16-byte weight chunk c holds k = 16c .. 16c + 15, which are the
//   staged 16-byte chunks 2c and 2c + 1; the prologue stores even chunks in the first half of
//   a staged row and odd ones in the second (`slot`), so a warp reads both halves at
//   consecutive 16-byte addresses (no bank conflicts). K % 16 == 0 (checked by the launcher).
template <typename T, typename W, int NT, bool kNorm, bool kResidual, int kMode>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                T* __restrict__ residual_out, const T* __restrict__ norm_w,
                const W* __restrict__ w, T* __restrict__ out, int tokens, int k, int n_out,
                int n_units, float eps, const GemvRope rope,
                const float* __restrict__ w_scale) {
  extern __shared__ uint4 staged[];  // (NT, k / 8) 16-byte chunks of the (normalised) inputs
  constexpr bool kFp8 = !std::is_same_v<W, T>;
  const int kvec = k / kVec;
  const int wvec = kFp8 ? k / 16 : kvec;  // 16-byte chunks of a weight row
  // where staged chunk c of a row lies in it (FP8: even chunks first, then odd ones)
  auto slot = [&](int c) { return kFp8 ? (c & 1) * (kvec / 2) + (c >> 1) : c; };
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
        wl[q][u] = c < wvec ? load_stream(wv + (int64_t)(r + q * second) * wvec + c)
                            : make_uint4(0, 0, 0, 0);
    }
  };
  float wsn[R];  // FP8: the scales of the unit whose first chunk was loaded last
  auto load_scale = [&](int unit) {
    if constexpr (kFp8) {
#pragma unroll
      for (int q = 0; q < R; ++q) wsn[q] = __ldg(w_scale + first_row(unit) + q * second);
    }
  };
  int row = blockIdx.x * kWarps + warp;  // the unit
  if (row < n_units) {
    load_chunk(row, lane);
    load_scale(row);
  }
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
      staged[t * kvec + slot(c)] = v;
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
        unpack8<T>(staged[t * kvec + slot(c)], a);
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = Vec<T>::round(a[i] * inv[t]) * g[i];
        staged[t * kvec + slot(c)] = pack8<T>(a);
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
    float ws[R];  // FP8: this unit's row scales
    if constexpr (kFp8) {
#pragma unroll
      for (int r = 0; r < R; ++r) ws[r] = wsn[r];
    }
    for (int c0 = lane; c0 < wvec; c0 += 32 * kUnroll) {
      // wl holds chunk c0 of this row
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * 32;
        if (c < wvec) {
          if constexpr (kFp8) {
            float wf[R][16];  // converted once, used for every token
#pragma unroll
            for (int r = 0; r < R; ++r) unpack16_e4m3(wl[r][u], wf[r]);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
              const uint4 lo = staged[t * kvec + c], hi = staged[t * kvec + kvec / 2 + c];
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][t] = dot16<T>(wf[r], lo, hi, acc[r][t]);
            }
          } else {
#pragma unroll
            for (int t = 0; t < NT; ++t) {
              const uint4 xs = staged[t * kvec + c];
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][t] = dot8<T>(wl[r][u], xs, acc[r][t]);
            }
          }
        }
      }
      // the next chunk, or the next row's first: in flight during the reduction and the store
      const int next = c0 + 32 * kUnroll;
      if (next < wvec) {
        load_chunk(row, next);
      } else if (row + stride < n_units) {
        load_chunk(row + stride, lane);
        load_scale(row + stride);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    if constexpr (kFp8) {  // the row's dot product of e4m3 values times its scale, in float32
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] *= ws[r];
    }
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

// ---- tensor-core path: 3 to 8 tokens -------------------------------------------------------
// The SIMT kernel above converts every staged row for every weight chunk, which makes it
// compute-bound from about four rows on. Here the product runs on mma.sync m16n8k16 (sm_80+):
// the weight is the A operand (16 rows x 16 k), the staged inputs the B operand (16 k x 8
// tokens, columns t >= tokens zero), so a 16-byte weight load costs one mma and no conversion.
//
//   unit      16 weight rows: 16 consecutive output rows (plain); 8 gate rows and their 8 up
//             rows (SwiGLU); 8 row pairs (j, j + head_dim / 2) of the QKV projection (RoPE). A
//             CTA takes one unit at a time; its 8 warps split K (warp w: 256 consecutive k of
//             every 2,048), each warp's partial 16 x 8 tile goes to shared memory and warp 0
//             sums the 8 in a fixed order and runs the epilogue.
//   A         lane (g, q) = (lane / 4, lane % 4) streams weight rows r0 (A row g) and r1 (A row
//             g + 8): 16-byte loads of chunk c (k = 8c .. 8c + 7), the four lanes of a group on
//             consecutive chunks. Such a load holds two mma's worth of A: the mma's k index is
//             a permutation of the physical k (mma 0: k 8c + 0..3 as its columns 2q, 2q + 1,
//             2q + 8, 2q + 9; mma 1: 8c + 4..7), and B is read with the same permutation, so
//             the loads land in the A registers as they are: no shuffles, no ldmatrix.
//   B         lane (g, q) needs token g's elements 8c .. 8c + 7: one 16-byte shared load of
//             the staged row g (a row stride of 4 mod 8 chunks keeps a quarter-warp's eight
//             16-byte reads on distinct banks).
//   prologue  as the SIMT kernel's, for 3..8 rows, the same arithmetic in the same order: the
//             normalised rows are bitwise the ones the one- and two-token kernel stages.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define P04_GEMV_NO_MMA 1
#endif

constexpr int kMmaTokens = 8;   // B's columns
constexpr int kMmaUnroll = 8;   // 16-byte loads in flight per lane and weight row (2 rows)
constexpr int kMmaGroup = 4;    // lanes per weight row in an A tile (consecutive chunks)
constexpr int kMmaStep = kMmaGroup * kMmaUnroll * kWarps;  // chunks a CTA covers per step

// Staged row stride in 16-byte chunks: >= kvec and 4 mod 8 (see B above).
__host__ __device__ constexpr int mma_staged_stride(int kvec) { return kvec + (12 - kvec % 8) % 8; }

// d += A (16 x 16) B (16 x 8), float32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
#ifndef P04_GEMV_NO_MMA
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the launcher's caller only dispatches here on sm_80 and newer
#endif
}

template <typename T, bool kNorm, bool kResidual, int kMode>
__global__ void __launch_bounds__(kWarps * 32, 2)  // two CTAs an SM: <= 128 registers
    gemv_mma_kernel(const T* __restrict__ x, const T* __restrict__ residual,
                    T* __restrict__ residual_out, const T* __restrict__ norm_w,
                    const T* __restrict__ w, T* __restrict__ out, int tokens, int k, int n_out,
                    int n_units, float eps, const GemvRope rope) {
  extern __shared__ uint4 staged[];  // (tokens, mma_staged_stride(k / 8)) 16-byte chunks
  __shared__ float4 partial_tile[2][kWarps][32];  // per warp, its lanes' accumulator fragments
  const int kvec = k / kVec, ks = mma_staged_stride(kvec);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, q = lane % 4;
  p04::allow_next_kernel();  // the next kernel may start prefetching its own weights

  // ---- the unit's weight rows r0 (A row g) and r1 (A row g + 8) of this lane; -1: none ------
  const int half = kMode == kRope ? rope.head_dim / 2 : 0;
  const int n_pairs = kMode == kRope ? n_out / 2 : n_out;  // kSilu / kRope: pairs of rows
  auto rows_of = [&](int unit, int& r0, int& r1) {
    if constexpr (kMode == kPlain) {
      r0 = unit * 16 + g;
      r1 = r0 + 8 < n_out ? r0 + 8 : -1;
      r0 = r0 < n_out ? r0 : -1;
    } else {
      const int p = unit * 8 + g;
      if (p >= n_pairs) {
        r0 = r1 = -1;
      } else if constexpr (kMode == kSilu) {
        r0 = p, r1 = p + n_out;  // gate row, up row
      } else {
        r0 = (p / half) * rope.head_dim + p % half, r1 = r0 + half;
      }
    }
  };
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const int n_steps = (kvec + kMmaStep - 1) / kMmaStep;
  uint4 wa[kMmaUnroll], wb[kMmaUnroll];  // rows r0 and r1
  // chunk of slot u at step s: warp w covers chunks [(s kWarps + w) 32, + 32) of the rows
  auto chunk = [&](int s, int u) { return ((s * kWarps + warp) * kMmaUnroll + u) * kMmaGroup + q; };
  auto load_step = [&](int unit, int s) {
    int r0, r1;
    rows_of(unit, r0, r1);
    const uint4* p0 = wv + (int64_t)(r0 < 0 ? 0 : r0) * kvec;
    const uint4* p1 = wv + (int64_t)(r1 < 0 ? 0 : r1) * kvec;
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int c = chunk(s, u);
      wa[u] = r0 >= 0 && c < kvec ? load_stream(p0 + c) : make_uint4(0, 0, 0, 0);
      wb[u] = r1 >= 0 && c < kvec ? load_stream(p1 + c) : make_uint4(0, 0, 0, 0);
    }
  };
  int unit = blockIdx.x;
  if (unit < n_units) load_step(unit, 0);
  p04::wait_previous_kernel();  // x and residual are the previous kernel's outputs

  // ---- prologue: stage the rows t < tokens (the SIMT kernel's arithmetic and order) ----------
  float ss[kMmaTokens];
#pragma unroll
  for (int t = 0; t < kMmaTokens; ++t) ss[t] = 0.f;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const uint4* rv = reinterpret_cast<const uint4*>(residual);
  for (int c = tid; c < kvec; c += blockDim.x) {
#pragma unroll
    for (int t = 0; t < kMmaTokens; ++t) {
      if (t < tokens) {
        uint4 v = xv[(int64_t)t * kvec + c];
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
        staged[t * ks + c] = v;
      }
    }
  }
  if constexpr (kNorm) {
    __shared__ float partial[kWarps][kMmaTokens];
#pragma unroll
    for (int t = 0; t < kMmaTokens; ++t) {
      float v = ss[t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) partial[warp][t] = v;
    }
    __syncthreads();
    float inv[kMmaTokens];
#pragma unroll
    for (int t = 0; t < kMmaTokens; ++t) {
      float s = 0.f;
      for (int i = 0; i < kWarps; ++i) s += partial[i][t];
      inv[t] = rsqrtf(s / k + eps);
    }
    const uint4* nw = reinterpret_cast<const uint4*>(norm_w);
    for (int c = tid; c < kvec; c += blockDim.x) {
      float gw[8];
      unpack8<T>(nw[c], gw);
#pragma unroll
      for (int t = 0; t < kMmaTokens; ++t) {
        if (t < tokens) {
          float a[8];
          unpack8<T>(staged[t * ks + c], a);
#pragma unroll
          for (int i = 0; i < 8; ++i) a[i] = Vec<T>::round(a[i] * inv[t]) * gw[i];
          staged[t * ks + c] = pack8<T>(a);
        }
      }
    }
  }
  __syncthreads();

  // ---- main loop: a unit per CTA, K split over its warps -------------------------------------
  const uint4* xs = staged + g * ks;  // B column g: token g's staged row
  const bool has_token = g < tokens;
  for (int parity = 0; unit < n_units; unit += gridDim.x, parity ^= 1) {
    float acc[4][4];  // four independent accumulators: shorter chains of dependent mma
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    for (int s = 0; s < n_steps; ++s) {
      // wa, wb hold step s of this unit
#pragma unroll
      for (int u = 0; u < kMmaUnroll; ++u) {
        const int c = chunk(s, u);
        const uint4 b = has_token && c < kvec ? xs[c] : make_uint4(0, 0, 0, 0);
        float(&d0)[4] = acc[(u % 2) * 2];
        float(&d1)[4] = acc[(u % 2) * 2 + 1];
        mma_16816<T>(d0, wa[u].x, wb[u].x, wa[u].y, wb[u].y, b.x, b.y);  // k 8c + 0..3
        mma_16816<T>(d1, wa[u].z, wb[u].z, wa[u].w, wb[u].w, b.z, b.w);  // k 8c + 4..7
      }
      // the next step, or the next unit's first: in flight during the reduction and epilogue
      if (s + 1 < n_steps) {
        load_step(unit, s + 1);
      } else if (unit + gridDim.x < n_units) {
        load_step(unit + gridDim.x, 0);
      }
    }
    float4 v;
    v.x = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
    v.y = (acc[0][1] + acc[1][1]) + (acc[2][1] + acc[3][1]);
    v.z = (acc[0][2] + acc[1][2]) + (acc[2][2] + acc[3][2]);
    v.w = (acc[0][3] + acc[1][3]) + (acc[2][3] + acc[3][3]);
    partial_tile[parity][warp][lane] = v;
    // One barrier per unit: warp 0 reads this buffer before it reaches the next unit's barrier,
    // and the buffer is written again only after that one (two units on).
    __syncthreads();
    if (warp != 0) continue;
    v = partial_tile[parity][0][lane];
#pragma unroll
    for (int i = 1; i < kWarps; ++i) {
      const float4 p = partial_tile[parity][i][lane];
      v.x += p.x, v.y += p.y, v.z += p.z, v.w += p.w;
    }
    // ---- epilogue: lane (g, q) holds (A row g, tokens 2q, 2q + 1) and (A row g + 8, same) --
    int r0, r1;
    rows_of(unit, r0, r1);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = 2 * q + i;
      if (t >= tokens) continue;
      const float y0 = i ? v.y : v.x, y1 = i ? v.w : v.z;
      T* o = out + (int64_t)t * n_out;
      if constexpr (kMode == kPlain) {
        if (r0 >= 0) o[r0] = Vec<T>::from_f2(y0, y0).x;
        if (r1 >= 0) o[r1] = Vec<T>::from_f2(y1, y1).x;
      } else if (r0 >= 0) {
        if constexpr (kMode == kRope) {
          rope_epilogue<T>(rope, o, r0, half, t, Vec<T>::round(y0), Vec<T>::round(y1));
        } else {
          const float gate = Vec<T>::round(y0), up = Vec<T>::round(y1);
          const float a = gate / (1.f + __expf(-gate)) * up;
          o[r0] = Vec<T>::from_f2(a, a).x;  // r0 is the pair's index: the output column
        }
      }
    }
  }
}

// Opts a kernel in to `smem` bytes of dynamic shared memory, the largest size asked for so far
// (`opted`: the caller's, one per kernel instantiation). The 48 KiB that needs no opt-in counts the
// kernel's static shared memory too (the tensor-core kernel's partial tiles), so the opt-in is made
// from the first launch on rather than only past 48 KiB of dynamic memory: 5 rows of K = 4096
// (41 KiB dynamic + 8 KiB static) failed to launch without it.
template <typename Kernel>
cudaError_t opt_in_smem(Kernel* kernel, size_t smem, size_t& opted) {
  if (smem <= opted) return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) opted = smem;
  return err;
}

template <typename T, typename W, int NT, bool kNorm, bool kResidual, int kMode>
cudaError_t launch_typed(const GemvArgs& a, cudaStream_t stream) {
  auto kernel = gemv_kernel<T, W, NT, kNorm, kResidual, kMode>;
  const size_t smem = (size_t)NT * a.k * sizeof(T);
  static size_t opted = 0;  // this instantiation's opt-in so far
  if (const cudaError_t err = opt_in_smem(kernel, smem, opted); err != cudaSuccess) return err;
  const int n_units = kMode == kRope ? a.n_out / 2 : a.n_out;
  int ctas = (n_units + kWarps - 1) / kWarps;
  if (a.max_ctas > 0 && ctas > a.max_ctas) ctas = a.max_ctas;
  return p04::launch(kernel, dim3(ctas), dim3(kWarps * 32), smem, stream, a.pdl,
                     static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
                     static_cast<T*>(a.residual_out), static_cast<const T*>(a.norm_w),
                     static_cast<const W*>(a.w), static_cast<T*>(a.out), a.tokens, a.k,
                     a.n_out, n_units, a.eps, a.rope, a.w_scale);
}

template <typename T, bool kNorm, bool kResidual, int kMode>
cudaError_t launch_mma_typed(const GemvArgs& a, cudaStream_t stream) {
  auto kernel = gemv_mma_kernel<T, kNorm, kResidual, kMode>;
  const size_t smem = (size_t)a.tokens * mma_staged_stride(a.k / kVec) * sizeof(uint4);
  static size_t opted = 0;  // this instantiation's opt-in so far
  if (const cudaError_t err = opt_in_smem(kernel, smem, opted); err != cudaSuccess) return err;
  // 16 rows a unit (plain), else 8 row pairs
  const int n_units = kMode == kPlain ? (a.n_out + 15) / 16
                                      : ((kMode == kRope ? a.n_out / 2 : a.n_out) + 7) / 8;
  int ctas = n_units;
  if (a.max_ctas > 0 && ctas > a.max_ctas) ctas = a.max_ctas;
  return p04::launch(kernel, dim3(ctas), dim3(kWarps * 32), smem, stream, a.pdl,
                     static_cast<const T*>(a.x), static_cast<const T*>(a.residual),
                     static_cast<T*>(a.residual_out), static_cast<const T*>(a.norm_w),
                     static_cast<const T*>(a.w), static_cast<T*>(a.out), a.tokens, a.k,
                     a.n_out, n_units, a.eps, a.rope);
}

// NT = 1 or 2: the SIMT kernel for that many rows; NT = kMmaTokens: the tensor-core kernel
// (16-bit weights only).
template <typename T, typename W, int NT, bool kNorm, bool kResidual, int kMode>
cudaError_t launch_variant(const GemvArgs& a, cudaStream_t stream) {
  if constexpr (NT == kMmaTokens) {
    static_assert(std::is_same_v<W, T>, "the tensor-core kernel reads 16-bit weights only");
    return launch_mma_typed<T, kNorm, kResidual, kMode>(a, stream);
  } else {
    return launch_typed<T, W, NT, kNorm, kResidual, kMode>(a, stream);
  }
}

template <typename T, typename W, int NT>
cudaError_t launch_mode(const GemvArgs& a, cudaStream_t stream) {
  const bool norm = a.norm_w != nullptr, res = a.residual != nullptr;
  const bool rope = a.rope.cos_sin != nullptr;
  if (rope) {  // the QKV projection: normalised input, with or without the residual add
    const int D = a.rope.head_dim;
    if (!norm || a.silu_mul || D <= 0 || D % 2 ||
        a.n_out != (a.rope.n_heads + 2 * a.rope.n_kv_heads) * D)
      return cudaErrorInvalidValue;
    return res ? launch_variant<T, W, NT, true, true, kRope>(a, stream)
               : launch_variant<T, W, NT, true, false, kRope>(a, stream);
  }
  if (!norm) {
    if (res || a.silu_mul) return cudaErrorInvalidValue;  // not a combination the model uses
    return launch_variant<T, W, NT, false, false, kPlain>(a, stream);
  }
  if (!res) {
    return a.silu_mul ? launch_variant<T, W, NT, true, false, kSilu>(a, stream)
                      : launch_variant<T, W, NT, true, false, kPlain>(a, stream);
  }
  return a.silu_mul ? launch_variant<T, W, NT, true, true, kSilu>(a, stream)
                    : launch_variant<T, W, NT, true, true, kPlain>(a, stream);
}

// One and two rows: the kernel beats cuBLAS and the separate norm and activation kernels there
// or matches it; from four rows on, converting the staged rows for every weight chunk makes it
// compute-bound and cuBLAS's GEMMs catch up or win (gemv_kernel.json).
// Three to eight: the tensor-core kernel (gemv_kernel_mma.json; the Python wrapper dispatches
// here up to kernels/gemv.py's MMA_MAX_TOKENS).
// FP8 weights (W = __nv_fp8_e4m3): one and two tokens only (the caller checked).
template <typename T, typename W = T>
cudaError_t launch_tokens(const GemvArgs& a, cudaStream_t stream) {
  if (a.tokens <= 1) return launch_mode<T, W, 1>(a, stream);
  if (a.tokens == 2) return launch_mode<T, W, 2>(a, stream);
  if constexpr (std::is_same_v<W, T>) {
    return launch_mode<T, W, kMmaTokens>(a, stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_gemv(const GemvArgs& a, DType dtype, cudaStream_t stream) {
  if (a.tokens == 0 || a.n_out == 0) return cudaSuccess;
  if (a.tokens > kMmaTokens || a.k % kVec != 0 || a.k <= 0) return cudaErrorInvalidValue;
  if (a.residual != nullptr && a.residual_out == nullptr) return cudaErrorInvalidValue;
  if (a.w_scale != nullptr) {  // e4m3 weights: one and two tokens, K a multiple of 16
    if (a.tokens > kFp8MaxTokens || a.k % 16 != 0) return cudaErrorInvalidValue;
    switch (dtype) {
      case DType::kBF16: return launch_tokens<__nv_bfloat16, __nv_fp8_e4m3>(a, stream);
      case DType::kF16: return launch_tokens<__half, __nv_fp8_e4m3>(a, stream);
      default: return cudaErrorInvalidValue;
    }
  }
  switch (dtype) {
    case DType::kBF16: return launch_tokens<__nv_bfloat16>(a, stream);
    case DType::kF16: return launch_tokens<__half>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}
