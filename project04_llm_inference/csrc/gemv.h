// Launchers of gemv.cu (torch-free, so CI compiles the kernels with nvcc alone).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "norm_act.h"  // DType

// out (T, n_out) = act(pre(x) @ w^T) for one to eight tokens (three to eight: tensor cores,
// sm_80 and newer), w (rows, K) row-major.
//   pre:  norm_w == nullptr: x as is. Otherwise RMSNorm of h, where h = x + residual when
//         residual != nullptr (rounded to the model dtype, written to residual_out by one CTA),
//         else h = x; normalised in float32, rounded, scaled by norm_w, rounded (Llama's order).
//   act:  silu_mul false: n_out = rows. true: rows = 2 n_out, out = silu(gate) * up with gate
//         the first n_out rows and up the last n_out (each rounded to the model dtype first).
//   rope: cos_sin != nullptr (with silu_mul false): the rows are a fused QKV projection, q
//         (n_heads * head_dim rows), k and v (n_kv_heads * head_dim each), and the epilogue
//         does what rope_cache.cu does after it: RoPE (rotate-half, position positions[t], the
//         float32 table cos_sin (max_positions, head_dim) = [cos | sin]) on q and k, and the
//         rotated k and v written to k_cache / v_cache (num_blocks, block_size, n_kv_heads,
//         head_dim) at slot slots[t] (-1: not written). Each warp computes the row pair (j,
//         j + head_dim / 2) of one head (three to eight tokens: a lane holds both rows of its
//         pair), so the rotation needs nothing from another warp.
//   w_scale != nullptr: w is FP8 (e4m3, one byte a weight) and row r's dot product is multiplied
//         by w_scale[r] (float32) before the epilogue; x, residual, norm_w and out stay in the
//         16-bit dtype (weight-only quantization, W8A16). One and two tokens, K % 16 == 0, and
//         compute capability 8.9 or newer (the caller checks; the kernel traps below it).
// K % 8 == 0 and every pointer 16-byte aligned (checked by the caller); x in a 16-bit dtype.
// max_ctas bounds the grid (warps then loop over rows): a few CTAs per SM is enough.
struct GemvRope {
  const float* cos_sin;      // nullptr: no RoPE
  const int64_t* positions;  // (tokens,)
  const int64_t* slots;      // (tokens,)
  void* k_cache;
  void* v_cache;
  int n_heads, n_kv_heads, head_dim;
};

struct GemvArgs {
  const void* x;
  const void* residual;  // nullable
  void* residual_out;    // nullable; written when residual != nullptr
  const void* norm_w;    // nullable: no RMSNorm
  const void* w;
  void* out;
  int tokens, k, n_out;
  bool silu_mul;
  float eps;
  int max_ctas;
  bool pdl;  // launch with programmatic dependent launch (pdl.cuh); sm_90 and newer
  GemvRope rope;
  const float* w_scale;  // nullptr: w in x's dtype; else w is e4m3 with these (rows,) scales
};

cudaError_t launch_gemv(const GemvArgs& a, DType dtype, cudaStream_t stream);
