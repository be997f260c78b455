// Plain C++ entry points of the FlashAttention kernels: raw pointers, strides in elements, sizes
// and a CUDA stream. No torch headers here, so the .cu files compile on their own.
//
// Layout: q (B, H, Sq, D), k and v (B, H, Sk, D), o and do (B, H, Sq, D), any strides for the B,
// H and S dimensions (multiples of 8 elements) and stride 1 along D, base pointers 16-byte aligned.
// lse and dpre (B, H, Sq) float32, contiguous. dq_accum (B, H, Sq, D) float32, contiguous, zeroed.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace flash {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // (B, H, Sq) natural-log log-sum-exp of the scaled scores, for the backward
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int batch, heads, seqlen_q, seqlen_k, head_dim;
  float softmax_scale;
  bool causal;  // top-left aligned; callers require seqlen_q == seqlen_k
  DType dtype;
  // 16-row MMA tiles per warp: 1 (Q held in registers) or 2 (Q re-read from shared memory, the
  // FlashAttention-2 layout; the default). Kept selectable so the benchmark can compare them.
  int m_tiles_per_warp;
};

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;  // (B, H, Sq) from the forward
  float* dpre;       // (B, H, Sq) scratch: rowsum(dO * O), written by the pre-pass
  float* dq_accum;   // (B, H, Sq, D) float32, zero on entry; holds dQ on return
  void* dk;
  void* dv;
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t do_batch_stride, do_head_stride, do_row_stride;
  int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  int batch, heads, seqlen_q, seqlen_k, head_dim;
  float softmax_scale;
  bool causal;
  DType dtype;
  // Warps per CTA of the main kernel, 16 keys each: 8 (128 keys a CTA, the default) or 4 (64).
  int warps;
};

// Per head-dimension launchers (one .cu file each, so they compile in parallel). Each returns
// cudaSuccess or the first CUDA error met.
cudaError_t flash_fwd_hdim64(const FwdParams& params, cudaStream_t stream);
cudaError_t flash_fwd_hdim128(const FwdParams& params, cudaStream_t stream);
// Hopper forward (wgmma + TMA, warp-specialised; flash_fwd_hopper.cuh): compute capability 9.0
// only, cudaErrorNotSupported elsewhere. Same parameters and outputs as the FlashAttention-2
// forward (m_tiles_per_warp is ignored).
cudaError_t flash_fwd_hopper_hdim64(const FwdParams& params, cudaStream_t stream);
cudaError_t flash_fwd_hopper_hdim128(const FwdParams& params, cudaStream_t stream);
cudaError_t flash_bwd_hdim64(const BwdParams& params, cudaStream_t stream);
cudaError_t flash_bwd_hdim128(const BwdParams& params, cudaStream_t stream);

// Dispatch on head_dim; any other head_dim gives cudaErrorInvalidValue.
inline cudaError_t flash_fwd(const FwdParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return flash_fwd_hdim64(params, stream);
    case 128:
      return flash_fwd_hdim128(params, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

inline cudaError_t flash_fwd_hopper(const FwdParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return flash_fwd_hopper_hdim64(params, stream);
    case 128:
      return flash_fwd_hopper_hdim128(params, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

inline cudaError_t flash_bwd(const BwdParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return flash_bwd_hdim64(params, stream);
    case 128:
      return flash_bwd_hdim128(params, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flash
