// PyTorch binding of the FlashAttention kernels: checks tensors, fills the parameter structs and
// launches on the current stream. Argument checking for users lives in attention.py; the checks
// here are the last line of defence against a kernel reading memory it does not own.
#include <algorithm>
#include <cmath>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "attention/flash_api.h"

namespace {

void check_kernel_layout(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 4, name, " must have 4 dimensions (B, H, S, D), got ", t.dim());
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.stride(3) == 1, name, " must be contiguous along the head dimension");
  TORCH_CHECK(t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0, name,
              " strides must be multiples of 8 elements");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must be 16-byte aligned");
}

flash::DType to_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? flash::DType::kFloat16 : flash::DType::kBFloat16;
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* name) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), name, " dtype differs from q's");
  TORCH_CHECK(a.device() == b.device(), name, " is on another device than q");
}

void check_f32(const at::Tensor& t, at::IntArrayRef shape, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CUDA tensor");
  TORCH_CHECK(t.sizes() == shape, name, " has shape ", t.sizes(), ", expected ", shape);
}

// Grouped-query attention: k/v heads (dividing q's heads) and the causal mask's offset (row i
// sees keys j <= i + offset: 0 top-left, Sk - Sq bottom-right).
void check_kv_heads(const at::Tensor& q, const at::Tensor& k) {
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) >= 1 && q.size(1) % k.size(1) == 0 &&
                  k.size(3) == q.size(3),
              "k must be (B, Hk, Sk, D) with Hk dividing q's heads");
  // The grid's y dimension; also what makes kv_head_of's multiply exact (flash_api.h).
  TORCH_CHECK(q.size(1) <= 65535, "at most 65535 heads, got ", q.size(1));
}

int causal_offset(bool causal, bool bottom_right, int64_t Sq, int64_t Sk) {
  return causal && bottom_right ? static_cast<int>(Sk - Sq) : 0;
}

// Sliding window and soft-capping (flash_api.h). window_left/right: -1 unbounded, else the
// FlashAttention window aligned bottom-right: row i sees key j iff
// Sk - Sq - left <= j - i <= Sk - Sq + right; causal replaces the right bound by j - i <=
// causal_offset (FlashAttention: causal means right = 0). Fills p.local, window_lo/hi, softcap
// and softcap_in. An unbounded side, or one that hides no key from any row, becomes an offset
// past every key (hi = Sk, lo = -Sq - kWindowPad): the kernels keep one test and, with the
// length check below, every sum of an offset and a row or key index stays inside int.
// local: a side that hides a key from some row (left < Sk - 1 / right < Sq - 1, tested as
// left < Sk, right < Sq), or softcap > 0; otherwise the causal / unmasked instances run.
template <typename Params>
void set_window(Params& p, bool causal, bool bottom_right, int64_t window_left,
                int64_t window_right, double softcap, double softmax_scale, int64_t Sq,
                int64_t Sk) {
  TORCH_CHECK(window_left >= -1 && window_right >= -1,
              "window_size entries must be -1 (unbounded) or >= 0, got (", window_left, ", ",
              window_right, ")");
  TORCH_CHECK(softcap >= 0.0 && softcap < INFINITY, "softcap must be finite and >= 0, got ",
              softcap);
  const bool left_bounded = window_left >= 0 && window_left < Sk;
  const bool right_bounded = !causal && window_right >= 0 && window_right < Sq;
  // A window with the top-left causal mask: the two alignments meet only when Sq == Sk
  // (attention.py refuses the others with a message; this is the last line of defence).
  TORCH_CHECK(!(causal && !bottom_right && left_bounded && Sq != Sk),
              "a window is aligned bottom-right: use it with causal 'bottom_right' (or True, "
              "equal lengths)");
  p.local = left_bounded || right_bounded || softcap > 0.0;
  if (p.local) {
    TORCH_CHECK(Sq + Sk < INT32_MAX - 4 * flash::kWindowPad,
                "a window or softcap needs seq_q + seq_k < 2^31 - 1024");
  }
  const int64_t hi = causal ? causal_offset(causal, bottom_right, Sq, Sk)
                            : (right_bounded ? Sk - Sq + window_right : Sk);
  const int64_t lo = left_bounded ? Sk - Sq - window_left : -Sq - flash::kWindowPad;
  p.window_hi = static_cast<int>(std::min(hi, Sk));
  p.window_lo = static_cast<int>(std::max(lo, -Sq - static_cast<int64_t>(flash::kWindowPad)));
  p.softcap = static_cast<float>(softcap);
  p.softcap_in = softcap > 0.0 ? static_cast<float>(softmax_scale / softcap) : 0.f;
}

// The forward's checks and parameters (both kernels read the same ones).
flash::FwdParams fwd_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            at::Tensor& o, at::Tensor& lse, bool causal, bool bottom_right,
                            double softmax_scale, int64_t m_tiles_per_warp,
                            int64_t window_left = -1, int64_t window_right = -1,
                            double softcap = 0.0) {
  check_kernel_layout(q, "q");
  check_kernel_layout(k, "k");
  check_kernel_layout(v, "v");
  check_kernel_layout(o, "o");
  check_same(k, q, "k");
  check_same(v, q, "v");
  check_same(o, q, "o");
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2);
  const int64_t Hk = k.size(1);
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape");
  check_kv_heads(q, k);
  TORCH_CHECK(o.sizes() == q.sizes(), "o must have q's shape");
  TORCH_CHECK(D == 64 || D == 128 || D == 256, "head dim must be 64, 128 or 256, got ", D);
  TORCH_CHECK(Sq > 0 && Sk > 0 && Sq < INT32_MAX / 2 && Sk < INT32_MAX / 2,
              "bad sequence lengths");
  check_f32(lse, {B, H, Sq}, "lse");

  flash::FwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_batch_stride = q.stride(0), p.q_head_stride = q.stride(1), p.q_row_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_head_stride = k.stride(1), p.k_row_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_head_stride = v.stride(1), p.v_row_stride = v.stride(2);
  p.o_batch_stride = o.stride(0), p.o_head_stride = o.stride(1), p.o_row_stride = o.stride(2);
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.seqlen_q = static_cast<int>(Sq);
  p.seqlen_k = static_cast<int>(Sk);
  p.head_dim = static_cast<int>(D);
  p.heads_k = static_cast<int>(Hk);
  p.h_h_k_ratio = static_cast<int>(H / Hk);
  p.h_h_k_ratio_inv = flash::kv_head_inverse(p.h_h_k_ratio);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = causal;
  p.causal_offset = causal_offset(causal, bottom_right, Sq, Sk);
  p.dtype = to_dtype(q);
  p.m_tiles_per_warp = static_cast<int>(m_tiles_per_warp);
  set_window(p, causal, bottom_right, window_left, window_right, softcap, softmax_scale, Sq, Sk);
  return p;
}

// Forward (FlashAttention-2 kernel): writes o (B, H, Sq, D) and lse (B, H, Sq) float32. k, v
// (B, Hk, Sk, D). causal with bottom_right: the diagonal aligned bottom-right (else top-left).
// m_tiles_per_warp: 1 or 2 (the kernel variant; see flash_api.h). window_left/right (-1:
// unbounded) and softcap (0: off): see set_window.
void fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o,
         at::Tensor& lse, bool causal, bool bottom_right, double softmax_scale,
         int64_t m_tiles_per_warp, int64_t window_left, int64_t window_right, double softcap) {
  TORCH_CHECK(m_tiles_per_warp == 1 || m_tiles_per_warp == 2,
              "m_tiles_per_warp must be 1 or 2, got ", m_tiles_per_warp);
  const c10::cuda::CUDAGuard guard(q.device());
  const flash::FwdParams p = fwd_params(q, k, v, o, lse, causal, bottom_right, softmax_scale,
                                        m_tiles_per_warp, window_left, window_right, softcap);
  const cudaError_t err = flash::flash_fwd(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "flash_fwd launch failed: ", cudaGetErrorString(err));
}

// Forward (Hopper kernel, compute capability 9.0 only): same outputs as fwd, without window and
// softcap and head dim 64 or 128 only (attention.py runs fwd for the others).
void fwd_hopper(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o,
                at::Tensor& lse, bool causal, bool bottom_right, double softmax_scale) {
  TORCH_CHECK(q.size(-1) != 256,
              "the Hopper forward has no head-dim-256 instance (the FlashAttention-2 forward runs "
              "it)");
  const c10::cuda::CUDAGuard guard(q.device());
  const flash::FwdParams p = fwd_params(q, k, v, o, lse, causal, bottom_right, softmax_scale, 2);
  const cudaError_t err = flash::flash_fwd_hopper(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err != cudaErrorNotSupported,
              "the Hopper forward needs a GPU of compute capability 9.0 (H100/H200)");
  TORCH_CHECK(err == cudaSuccess, "flash_fwd_hopper launch failed: ", cudaGetErrorString(err));
}

// Backward: writes dq, dk, dv (shapes of q, k, v). dq is accumulated in float32 and cast.
// Grouped-query attention (Hk < H): the kernel writes dK, dV per query head into (B, H, Sk, D)
// buffers of the input dtype, summed here over each group of H / Hk heads; with Hk == H it
// writes dk, dv directly (no buffer, no copy).
// warps: 8 or 4 warps (128 or 64 keys) per CTA of the main kernel (see flash_api.h).
// window_left/right and softcap: as in fwd (the forward's own, which produced o and lse).
// hopper: run the Hopper backward (flash_bwd_hopper.cuh) instead of the FlashAttention-2 one;
// same buffers, pre-pass and dQ conversion, dense attention at head dim 64 or 128 only.
void bwd_impl(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse, at::Tensor& dq,
              at::Tensor& dk, at::Tensor& dv, bool causal, bool bottom_right,
              double softmax_scale, int64_t warps, int64_t window_left, int64_t window_right,
              double softcap, bool hopper) {
  TORCH_CHECK(warps == 4 || warps == 8, "warps must be 4 or 8, got ", warps);
  const std::pair<const at::Tensor*, const char*> tensors[] = {
      {&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"},
      {&dq, "dq"},     {&dk, "dk"}, {&dv, "dv"}};
  for (const auto& [t, name] : tensors) {
    check_kernel_layout(*t, name);
    check_same(*t, q, name);
  }
  const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2);
  const int64_t Hk = k.size(1);
  TORCH_CHECK(k.sizes() == v.sizes() && dk.sizes() == k.sizes() && dv.sizes() == k.sizes(),
              "k, v, dk, dv must have the same shape");
  check_kv_heads(q, k);
  TORCH_CHECK(o.sizes() == q.sizes() && dout.sizes() == q.sizes() && dq.sizes() == q.sizes(),
              "o, dout, dq must have q's shape");
  TORCH_CHECK(D == 64 || D == 128 || D == 256, "head dim must be 64, 128 or 256, got ", D);
  TORCH_CHECK(Sq > 0 && Sk > 0 && Sq < INT32_MAX / 2 && Sk < INT32_MAX / 2,
              "bad sequence lengths");
  check_f32(lse, {B, H, Sq}, "lse");

  const c10::cuda::CUDAGuard guard(q.device());
  auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dpre = at::empty({B, H, Sq}, f32);
  at::Tensor dq_accum = at::zeros({B, H, Sq, D}, f32);
  // Per-query-head dK, dV for grouped-query attention; dk, dv themselves otherwise.
  const bool grouped = Hk != H;
  at::Tensor dk_heads = grouped ? at::empty({B, H, Sk, D}, q.options()) : dk;
  at::Tensor dv_heads = grouped ? at::empty({B, H, Sk, D}, q.options()) : dv;

  flash::BwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.dpre = dpre.data_ptr<float>();
  p.dq_accum = dq_accum.data_ptr<float>();
  p.dk = dk_heads.data_ptr();
  p.dv = dv_heads.data_ptr();
  p.q_batch_stride = q.stride(0), p.q_head_stride = q.stride(1), p.q_row_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_head_stride = k.stride(1), p.k_row_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_head_stride = v.stride(1), p.v_row_stride = v.stride(2);
  p.o_batch_stride = o.stride(0), p.o_head_stride = o.stride(1), p.o_row_stride = o.stride(2);
  p.do_batch_stride = dout.stride(0), p.do_head_stride = dout.stride(1);
  p.do_row_stride = dout.stride(2);
  p.dk_batch_stride = dk_heads.stride(0), p.dk_head_stride = dk_heads.stride(1);
  p.dk_row_stride = dk_heads.stride(2);
  p.dv_batch_stride = dv_heads.stride(0), p.dv_head_stride = dv_heads.stride(1);
  p.dv_row_stride = dv_heads.stride(2);
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.seqlen_q = static_cast<int>(Sq);
  p.seqlen_k = static_cast<int>(Sk);
  p.head_dim = static_cast<int>(D);
  p.heads_k = static_cast<int>(Hk);
  p.h_h_k_ratio = static_cast<int>(H / Hk);
  p.h_h_k_ratio_inv = flash::kv_head_inverse(p.h_h_k_ratio);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = causal;
  p.causal_offset = causal_offset(causal, bottom_right, Sq, Sk);
  p.dtype = to_dtype(q);
  p.warps = static_cast<int>(warps);
  set_window(p, causal, bottom_right, window_left, window_right, softcap, softmax_scale, Sq, Sk);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (hopper) {
    TORCH_CHECK(!p.local, "the Hopper backward has no window or softcap (the FlashAttention-2 "
                          "backward runs them)");
    const cudaError_t err = flash::flash_bwd_hopper(p, stream);
    TORCH_CHECK(err != cudaErrorNotSupported,
                "the Hopper backward needs a GPU of compute capability 9.0 (H100/H200)");
    TORCH_CHECK(err == cudaSuccess, "flash_bwd_hopper launch failed: ", cudaGetErrorString(err));
  } else {
    const cudaError_t err = flash::flash_bwd(p, stream);
    TORCH_CHECK(err == cudaSuccess, "flash_bwd launch failed: ", cudaGetErrorString(err));
  }
  dq.copy_(dq_accum);
  if (grouped) {
    // Query heads g * H / Hk .. (g + 1) * H / Hk - 1 share k/v head g: sum them (in float32,
    // rounded once to the input dtype).
    const int64_t G = H / Hk;
    const int64_t group_dim[] = {2};
    const at::IntArrayRef dims(group_dim);
    dk.copy_(dk_heads.view({B, Hk, G, Sk, D}).sum(dims, /*keepdim=*/false, at::kFloat));
    dv.copy_(dv_heads.view({B, Hk, G, Sk, D}).sum(dims, /*keepdim=*/false, at::kFloat));
  }
}

void bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
         const at::Tensor& o, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk,
         at::Tensor& dv, bool causal, bool bottom_right, double softmax_scale, int64_t warps,
         int64_t window_left, int64_t window_right, double softcap) {
  bwd_impl(dout, q, k, v, o, lse, dq, dk, dv, causal, bottom_right, softmax_scale, warps,
           window_left, window_right, softcap, /*hopper=*/false);
}

// Backward (Hopper kernel, compute capability 9.0 only): same outputs as bwd, dense attention
// (no window, softcap or varlen) at head dim 64 or 128 (attention.py runs bwd for the others).
void bwd_hopper(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse, at::Tensor& dq,
                at::Tensor& dk, at::Tensor& dv, bool causal, bool bottom_right,
                double softmax_scale) {
  TORCH_CHECK(q.size(-1) == 64 || q.size(-1) == 128,
              "the Hopper backward is compiled for head dims 64 and 128, got ", q.size(-1));
  bwd_impl(dout, q, k, v, o, lse, dq, dk, dv, causal, bottom_right, softmax_scale, 8, -1, -1, 0.0,
           /*hopper=*/true);
}

// ---- variable length (packed sequences) -------------------------------------------------------
// q, o (total_q, H, D), k, v (total_k, Hk, D) token-major; cu_seqlens_q/k (B + 1,) int32 CUDA
// prefix sums (read by the kernels only: no host read here, so the launch can be captured in a
// CUDA graph); max_seqlen_q/k size the grid (attention.py checks the values when it reads them;
// a max below a real length leaves that sequence's tail unwritten, as in flash-attn). Causal is
// bottom-right per sequence (flash-attn's varlen convention).

void check_varlen_layout(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == 3, name, " must have 3 dimensions (total, H, D), got ", t.dim());
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.stride(2) == 1, name, " must be contiguous along the head dimension");
  TORCH_CHECK(t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0, name,
              " strides must be multiples of 8 elements");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must be 16-byte aligned");
}

void check_cu_seqlens(const at::Tensor& cu, const at::Tensor& q, int64_t batch, const char* name) {
  TORCH_CHECK(cu.is_cuda() && cu.device() == q.device(), name, " must be on q's device");
  TORCH_CHECK(cu.scalar_type() == at::kInt && cu.dim() == 1 && cu.is_contiguous(), name,
              " must be a contiguous 1-D int32 tensor");
  TORCH_CHECK(cu.size(0) == batch + 1, name, " must have batch + 1 = ", batch + 1,
              " entries, got ", cu.size(0));
}

// The parameters both varlen launches share: sizes (seqlen_q/k = the max lengths, batch = B),
// batch strides 0, varlen fields, the mask (causal is bottom-right per sequence: folded into
// window_right = 0, and causal_offset is per sequence in the kernels) and softcap.
template <typename Params>
void set_varlen(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cu_q,
                const at::Tensor& cu_k, int64_t max_sq, int64_t max_sk, bool causal,
                double softmax_scale, int64_t window_left, int64_t window_right,
                double softcap) {
  const int64_t total_q = q.size(0), total_k = k.size(0), H = q.size(1), Hk = k.size(1);
  const int64_t B = cu_q.size(0) - 1;
  TORCH_CHECK(B >= 1 && B <= 65535, "batch (cu_seqlens entries - 1) must be 1..65535, got ", B);
  check_cu_seqlens(cu_q, q, B, "cu_seqlens_q");
  check_cu_seqlens(cu_k, q, B, "cu_seqlens_k");
  TORCH_CHECK(k.size(1) >= 1 && H % Hk == 0 && k.size(2) == q.size(2),
              "k must be (total_k, Hk, D) with Hk dividing q's heads");
  TORCH_CHECK(H <= 65535, "at most 65535 heads, got ", H);
  TORCH_CHECK(max_sq >= 0 && max_sk >= 0 && max_sq <= total_q && max_sk <= total_k,
              "max_seqlen_q/k must be in 0..total tokens");
  TORCH_CHECK(total_q + total_k < INT32_MAX - 4 * flash::kWindowPad,
              "varlen needs total_q + total_k < 2^31 - 1024");
  TORCH_CHECK(window_left >= -1 && window_right >= -1,
              "window_size entries must be -1 (unbounded) or >= 0");
  TORCH_CHECK(softcap >= 0.0 && softcap < INFINITY, "softcap must be finite and >= 0");
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.seqlen_q = static_cast<int>(max_sq);
  p.seqlen_k = static_cast<int>(max_sk);
  p.head_dim = static_cast<int>(q.size(2));
  p.heads_k = static_cast<int>(Hk);
  p.h_h_k_ratio = static_cast<int>(H / Hk);
  p.h_h_k_ratio_inv = flash::kv_head_inverse(p.h_h_k_ratio);
  p.softmax_scale = static_cast<float>(softmax_scale);
  p.causal = causal;
  p.causal_offset = 0;  // per sequence in the kernels
  p.dtype = to_dtype(q);
  p.varlen = true;
  p.cu_seqlens_q = cu_q.data_ptr<int>();
  p.cu_seqlens_k = cu_k.data_ptr<int>();
  p.total_q = static_cast<int>(total_q);
  // A side >= every length hides nothing: clamp to the totals (so the kernels' sums stay in int).
  p.window_left = static_cast<int>(std::min(window_left, total_k));
  p.window_right = causal ? 0 : static_cast<int>(std::min(window_right, total_q));
  // The local instances whenever a side is bounded or softcap > 0 (per sequence a side may hide
  // nothing: the kernels then use unbounded offsets, as a softcap without a window does).
  p.local = window_left >= 0 || (!causal && window_right >= 0) || softcap > 0.0;
  p.window_lo = p.window_hi = 0;  // per sequence in the kernels
  p.softcap = static_cast<float>(softcap);
  p.softcap_in = softcap > 0.0 ? static_cast<float>(softmax_scale / softcap) : 0.f;
}

// Varlen forward (FlashAttention-2 kernel; the Hopper forward has no varlen instance): writes o
// (total_q, H, D) and lse (H, total_q) float32.
void fwd_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& o,
                at::Tensor& lse, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal, double softmax_scale,
                int64_t m_tiles_per_warp, int64_t window_left, int64_t window_right,
                double softcap) {
  TORCH_CHECK(m_tiles_per_warp == 1 || m_tiles_per_warp == 2,
              "m_tiles_per_warp must be 1 or 2, got ", m_tiles_per_warp);
  const std::pair<const at::Tensor*, const char*> tensors[] = {
      {&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"}};
  for (const auto& [t, name] : tensors) {
    check_varlen_layout(*t, name);
    check_same(*t, q, name);
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape");
  TORCH_CHECK(o.sizes() == q.sizes(), "o must have q's shape");
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128 || q.size(2) == 256,
              "head dim must be 64, 128 or 256, got ", q.size(2));
  check_f32(lse, {q.size(1), q.size(0)}, "lse");
  const c10::cuda::CUDAGuard guard(q.device());
  flash::FwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_head_stride = q.stride(1), p.q_row_stride = q.stride(0);
  p.k_head_stride = k.stride(1), p.k_row_stride = k.stride(0);
  p.v_head_stride = v.stride(1), p.v_row_stride = v.stride(0);
  p.o_head_stride = o.stride(1), p.o_row_stride = o.stride(0);
  p.m_tiles_per_warp = static_cast<int>(m_tiles_per_warp);
  set_varlen(p, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
             softmax_scale, window_left, window_right, softcap);
  if (q.size(0) == 0) return;
  const cudaError_t err = flash::flash_fwd(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "flash_fwd (varlen) launch failed: ", cudaGetErrorString(err));
}

// Varlen backward: writes dq (total_q, H, D), dk, dv (total_k, Hk, D). Grouped-query attention
// as in bwd: per-query-head (total_k, H, D) buffers summed over each group.
void bwd_varlen(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                const at::Tensor& v, const at::Tensor& o, const at::Tensor& lse, at::Tensor& dq,
                at::Tensor& dk, at::Tensor& dv, const at::Tensor& cu_seqlens_q,
                const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                bool causal, double softmax_scale, int64_t warps, int64_t window_left,
                int64_t window_right, double softcap) {
  TORCH_CHECK(warps == 4 || warps == 8, "warps must be 4 or 8, got ", warps);
  const std::pair<const at::Tensor*, const char*> tensors[] = {
      {&dout, "dout"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&o, "o"},
      {&dq, "dq"},     {&dk, "dk"}, {&dv, "dv"}};
  for (const auto& [t, name] : tensors) {
    check_varlen_layout(*t, name);
    check_same(*t, q, name);
  }
  const int64_t total_q = q.size(0), H = q.size(1), D = q.size(2), total_k = k.size(0);
  const int64_t Hk = k.size(1);
  TORCH_CHECK(k.sizes() == v.sizes() && dk.sizes() == k.sizes() && dv.sizes() == k.sizes(),
              "k, v, dk, dv must have the same shape");
  TORCH_CHECK(o.sizes() == q.sizes() && dout.sizes() == q.sizes() && dq.sizes() == q.sizes(),
              "o, dout, dq must have q's shape");
  TORCH_CHECK(D == 64 || D == 128 || D == 256, "head dim must be 64, 128 or 256, got ", D);
  check_f32(lse, {H, total_q}, "lse");
  const c10::cuda::CUDAGuard guard(q.device());
  auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dpre = at::empty({H, total_q}, f32);
  at::Tensor dq_accum = at::zeros({H, total_q, D}, f32);
  const bool grouped = Hk != H;
  at::Tensor dk_heads = grouped ? at::empty({total_k, H, D}, q.options()) : dk;
  at::Tensor dv_heads = grouped ? at::empty({total_k, H, D}, q.options()) : dv;

  flash::BwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.dpre = dpre.data_ptr<float>();
  p.dq_accum = dq_accum.data_ptr<float>();
  p.dk = dk_heads.data_ptr();
  p.dv = dv_heads.data_ptr();
  p.q_head_stride = q.stride(1), p.q_row_stride = q.stride(0);
  p.k_head_stride = k.stride(1), p.k_row_stride = k.stride(0);
  p.v_head_stride = v.stride(1), p.v_row_stride = v.stride(0);
  p.o_head_stride = o.stride(1), p.o_row_stride = o.stride(0);
  p.do_head_stride = dout.stride(1), p.do_row_stride = dout.stride(0);
  p.dk_head_stride = dk_heads.stride(1), p.dk_row_stride = dk_heads.stride(0);
  p.dv_head_stride = dv_heads.stride(1), p.dv_row_stride = dv_heads.stride(0);
  p.warps = static_cast<int>(warps);
  set_varlen(p, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
             softmax_scale, window_left, window_right, softcap);
  if (total_k > 0) {
    const cudaError_t err = flash::flash_bwd(p, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == cudaSuccess, "flash_bwd (varlen) launch failed: ", cudaGetErrorString(err));
  }
  dq.copy_(dq_accum.permute({1, 0, 2}));
  if (grouped) {
    const int64_t G = H / Hk;
    const int64_t group_dim[] = {2};
    const at::IntArrayRef dims(group_dim);
    dk.copy_(dk_heads.view({total_k, Hk, G, D}).sum(dims, /*keepdim=*/false, at::kFloat));
    dv.copy_(dv_heads.view({total_k, Hk, G, D}).sum(dims, /*keepdim=*/false, at::kFloat));
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "FlashAttention forward and backward (FlashAttention-2, Hopper), fp16 and bf16";
  m.def("fwd", &fwd,
        "forward: (q, k, v, o, lse, causal, bottom_right, softmax_scale, m_tiles_per_warp, "
        "window_left, window_right, softcap) -> None");
  m.def("fwd_hopper", &fwd_hopper,
        "forward, Hopper wgmma/TMA kernel: (q, k, v, o, lse, causal, bottom_right, "
        "softmax_scale) -> None");
  m.def("bwd", &bwd,
        "backward: (dout, q, k, v, o, lse, dq, dk, dv, causal, bottom_right, softmax_scale, "
        "warps, window_left, window_right, softcap) -> None");
  m.def("bwd_hopper", &bwd_hopper,
        "backward, Hopper wgmma/TMA kernel: (dout, q, k, v, o, lse, dq, dk, dv, causal, "
        "bottom_right, softmax_scale) -> None");
  m.def("fwd_varlen", &fwd_varlen,
        "varlen forward: (q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
        "max_seqlen_k, causal, softmax_scale, m_tiles_per_warp, window_left, window_right, "
        "softcap) -> None");
  m.def("bwd_varlen", &bwd_varlen,
        "varlen backward: (dout, q, k, v, o, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, "
        "max_seqlen_q, max_seqlen_k, causal, softmax_scale, warps, window_left, window_right, "
        "softcap) -> None");
}
