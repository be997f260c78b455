// Plain C++ entry points of the FlashAttention kernels: raw pointers, strides in elements, sizes
// and a CUDA stream. No torch headers here, so the .cu files compile on their own.
//
// Layout: q (B, H, Sq, D), k and v (B, Hk, Sk, D) with Hk dividing H, o and do (B, H, Sq, D), any
// strides for the B, H and S dimensions (multiples of 8 elements) and stride 1 along D, base
// pointers 16-byte aligned. lse and dpre (B, H, Sq) float32, contiguous. dq_accum (B, H, Sq, D)
// float32, contiguous, zeroed.
//
// Grouped-query attention: query head h reads k/v head h / h_h_k_ratio (h_h_k_ratio = H / Hk; 1
// is multi-head attention), through the k/v head strides; K/V are never repeated in memory.
// The backward writes dK/dV per *query* head (dk/dv have H heads, the caller sums each group of
// h_h_k_ratio heads; with ratio 1 they are the gradients themselves).
//
// Causal mask: query row i (0-based) may attend key j iff j <= i + causal_offset. 0 aligns the
// diagonal top-left (SDPA's is_causal), seqlen_k - seqlen_q bottom-right (FlashAttention >= 2.1).
// A row that sees no key (i + causal_offset < 0) gets O = 0 and lse = +inf, so the backward's
// exp(S - lse) is 0 there and its gradients are 0.
//
// Sliding window (local attention) and logit soft-capping, FlashAttention's window_size and
// softcap: the "local" kernels (params.local), separate template instances, so the kernels
// without them compile exactly as before. Row i sees key j iff
// window_lo <= j - i <= window_hi; the host (flash_binding.cpp, window_bounds) derives the two
// offsets from window_size = (left, right), -1 unbounded, aligned bottom-right as FlashAttention
// aligns it: Sk - Sq - left <= j - i <= Sk - Sq + right, and causal replaces the right bound by
// causal_offset (FlashAttention: causal means right = 0). An unbounded side is an offset past
// every key (window_hi = Sk, window_lo = -Sq - kWindowPad), so the kernels have one test. With
// softcap > 0 the scores are softcap * tanh(softmax_scale * q.k / softcap) before the softmax
// (Gemma 2's logit soft-capping); the backward multiplies dS by 1 - tanh^2. A softcap without a
// window runs the local kernels too, with unbounded (or causal) offsets.
//
// Variable length ("varlen", packed sequences; flash-attn's flash_attn_varlen_func), the
// VARLEN template instances selected by params.varlen: q, o, do (total_q, H, D) and k, v
// (total_k, Hk, D) token-major (the kernels see batch stride 0, head stride D-ish and row stride
// H * D-ish: any strides as above), sequence b holding rows cu_seqlens_q[b] ..
// cu_seqlens_q[b + 1] - 1 of q and cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k/v. The
// prefix sums are int32 in device memory and read by the kernels (no host read: the launch can
// be captured in a CUDA graph); the grid is sized from seqlen_q / seqlen_k, which the host sets
// to the max lengths, and the tiles past a sequence's end exit at once. Each sequence's causal
// mask and window are aligned bottom-right on its own lengths (flash-attn's convention):
// causal_offset = Sk_b - Sq_b, and window_lo/hi computed per sequence from window_left/right
// (varlen_offsets, flash_common.cuh). lse, dpre are (H, total_q) and dq_accum (H, total_q, D).
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
  int heads_k;      // k/v heads; heads % heads_k == 0
  int h_h_k_ratio;  // heads / heads_k: query heads per k/v head
  uint64_t h_h_k_ratio_inv;  // kv_head_inverse(h_h_k_ratio), for kv_head_of (flash_common.cuh)
  float softmax_scale;
  bool causal;
  int causal_offset;  // causal: row i sees keys j <= i + causal_offset (see above)
  DType dtype;
  // 16-row MMA tiles per warp: 1 (Q held in registers) or 2 (Q re-read from shared memory, the
  // FlashAttention-2 layout; the default). Kept selectable so the benchmark can compare them.
  int m_tiles_per_warp;
  // Window and soft-capping (see above; appended so the fields before keep their offsets).
  // local: run the local kernels (a window, or softcap > 0), which mask by window_lo/window_hi
  // and ignore causal/causal_offset (folded into window_hi by the host).
  bool local;
  int window_lo, window_hi;  // row i sees keys j with window_lo <= j - i <= window_hi
  float softcap;             // > 0: soft-capping on (only with local); 0: off
  float softcap_in;          // softmax_scale / softcap: the tanh argument per unit of q.k
  // Varlen (see above; appended, so the fields before keep their offsets). varlen: run the
  // VARLEN instances; seqlen_q/seqlen_k then hold the max lengths (the grid), batch strides are
  // 0, and window_left/right are the raw sides (-1 unbounded, causal folded in as right = 0,
  // clamped by the host to the packed totals), from which each sequence's window_lo/hi follow.
  bool varlen;
  const int* cu_seqlens_q;  // (batch + 1,) int32 prefix sums, device memory
  const int* cu_seqlens_k;
  int total_q;  // packed q rows: lse and dpre are (heads, total_q)
  int window_left, window_right;
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
  void* dk;  // (B, H, Sk, D): per query head (summed over each group by the caller)
  void* dv;
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t do_batch_stride, do_head_stride, do_row_stride;
  int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  int batch, heads, seqlen_q, seqlen_k, head_dim;
  int heads_k;      // k/v heads; heads % heads_k == 0
  int h_h_k_ratio;  // heads / heads_k
  uint64_t h_h_k_ratio_inv;  // kv_head_inverse(h_h_k_ratio)
  float softmax_scale;
  bool causal;
  int causal_offset;  // as in FwdParams
  DType dtype;
  // Warps per CTA of the main kernel, 16 keys each: 8 (128 keys a CTA, the default) or 4 (64).
  int warps;
  bool local;                // as in FwdParams
  int window_lo, window_hi;  // as in FwdParams
  float softcap;             // as in FwdParams
  float softcap_in;          // as in FwdParams
  bool varlen;              // as in FwdParams
  const int* cu_seqlens_q;  // as in FwdParams
  const int* cu_seqlens_k;
  int total_q;
  int window_left, window_right;
};

// The lower offset that stands for "no lower bound": below -(Sq + the tallest query tile), so
// that even the zero-filled rows past the end of the last tile see every key and the tile-level
// "needs a mask" tests stay exact. Any real row i < Sq has i + window_lo < 0.
constexpr int kWindowPad = 256;

// ceil(2^32 / ratio), so that head / ratio = (head * inverse) >> 32 (kv_head_of): exact for
// head * ratio < 2^32, which heads < 65536 (the grid's limit) guarantees.
inline uint64_t kv_head_inverse(int ratio) {
  return ((uint64_t(1) << 32) + static_cast<uint64_t>(ratio) - 1) / static_cast<uint64_t>(ratio);
}

// Per head-dimension launchers (one .cu file each, so they compile in parallel). Each returns
// cudaSuccess or the first CUDA error met.
cudaError_t flash_fwd_hdim64(const FwdParams& params, cudaStream_t stream);
cudaError_t flash_fwd_hdim128(const FwdParams& params, cudaStream_t stream);
// Head dim 256: one variant (8 warps, 16 rows a warp, Q in shared memory); m_tiles_per_warp is
// ignored.
cudaError_t flash_fwd_hdim256(const FwdParams& params, cudaStream_t stream);
// Hopper forward (wgmma + TMA, warp-specialised; flash_fwd_hopper.cuh): compute capability 9.0
// only, cudaErrorNotSupported elsewhere. Same parameters and outputs as the FlashAttention-2
// forward (m_tiles_per_warp is ignored). No head-dim-256 instance (flash_fwd_hopper returns
// cudaErrorInvalidValue for it; the FlashAttention-2 forward runs head dim 256).
cudaError_t flash_fwd_hopper_hdim64(const FwdParams& params, cudaStream_t stream);
cudaError_t flash_fwd_hopper_hdim128(const FwdParams& params, cudaStream_t stream);
cudaError_t flash_bwd_hdim64(const BwdParams& params, cudaStream_t stream);
cudaError_t flash_bwd_hdim128(const BwdParams& params, cudaStream_t stream);
// Head dim 256: one variant (8 warps in pairs, 64 keys a CTA); warps is ignored.
cudaError_t flash_bwd_hdim256(const BwdParams& params, cudaStream_t stream);
// Hopper backward (wgmma + TMA, warp-specialised; flash_bwd_hopper.cuh): compute capability 9.0
// only (cudaErrorNotSupported elsewhere), head dims 64 and 128, dense attention only: no window,
// softcap or varlen (cudaErrorInvalidValue; the FlashAttention-2 backward runs those). Same
// parameters and outputs as the FlashAttention-2 backward (warps is ignored).
cudaError_t flash_bwd_hopper_hdim64(const BwdParams& params, cudaStream_t stream);
cudaError_t flash_bwd_hopper_hdim128(const BwdParams& params, cudaStream_t stream);

// Dispatch on head_dim; any other head_dim gives cudaErrorInvalidValue.
inline cudaError_t flash_fwd(const FwdParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return flash_fwd_hdim64(params, stream);
    case 128:
      return flash_fwd_hdim128(params, stream);
    case 256:
      return flash_fwd_hdim256(params, stream);
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
    case 256:
      return flash_bwd_hdim256(params, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

inline cudaError_t flash_bwd_hopper(const BwdParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 64:
      return flash_bwd_hopper_hdim64(params, stream);
    case 128:
      return flash_bwd_hopper_hdim128(params, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flash
