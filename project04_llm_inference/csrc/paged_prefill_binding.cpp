// PyTorch binding of paged_prefill.cu: checks that keep the kernel inside memory it owns, the
// parameter struct, the current stream. Checks with user-facing messages live in
// kernels/prefill.py.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "paged_prefill.h"

namespace {

void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.device() == q.device(), name, " must be on q's device");
}

// The last line of defence against out-of-bounds accesses; user-facing checks with clear
// messages live in kernels/prefill.py.
at::Tensor paged_prefill_fwd(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables,
                             const at::Tensor& cu_seqlens_q, const at::Tensor& context_lens,
                             double softmax_scale, const std::optional<at::Tensor>& k_scale,
                             const std::optional<at::Tensor>& v_scale) {
  check_cuda(q, "q", q);
  check_cuda(k_cache, "k_cache", q);
  check_cuda(v_cache, "v_cache", q);
  check_cuda(block_tables, "block_tables", q);
  check_cuda(cu_seqlens_q, "cu_seqlens_q", q);
  check_cuda(context_lens, "context_lens", q);
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "q must be float16 or bfloat16");
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK((fp8 || k_cache.scalar_type() == q.scalar_type()) &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "k_cache and v_cache must have q's dtype, or both be float8_e4m3fn");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "q must be (T, Hq, D) and k_cache, v_cache (num_blocks, block_size, Hkv, D)");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t bs = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(D == 64 || D == 128, "head dim must be 64 or 128, got ", D);
  TORCH_CHECK(k_cache.size(3) == D, "cache head dim differs from q's");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "Hq must be a multiple of Hkv");
  TORCH_CHECK(bs >= 1 && (bs & (bs - 1)) == 0, "block size must be a power of two");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0,
              "q must be unit-stride along D with strides that are multiples of 8");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(k_cache.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(v_cache.data_ptr()) % 16 == 0,
              "q and the caches must be 16-byte aligned");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && cu_seqlens_q.scalar_type() == at::kInt &&
                  context_lens.scalar_type() == at::kInt,
              "block_tables, cu_seqlens_q and context_lens must be int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.stride(1) == 1,
              "block_tables must be (N, max_blocks), unit stride along blocks");
  const int64_t N = block_tables.size(0);
  TORCH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.size(0) == N + 1 &&
                  cu_seqlens_q.is_contiguous(),
              "cu_seqlens_q must be contiguous (N + 1,)");
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.size(0) == N && context_lens.is_contiguous(),
              "context_lens must be contiguous (N,)");
  if (fp8) {
    TORCH_CHECK(k_scale.has_value() && v_scale.has_value(), "an FP8 cache needs k_scale, v_scale");
    for (const at::Tensor* s : {&*k_scale, &*v_scale}) {
      check_cuda(*s, "k_scale / v_scale", q);
      TORCH_CHECK(s->scalar_type() == at::kFloat && s->numel() == Hkv && s->is_contiguous(),
                  "k_scale and v_scale must be contiguous float32 (Hkv,)");
    }
  }
  const int64_t G = Hq / Hkv;
  TORCH_CHECK(T * G < INT32_MAX && N < INT32_MAX && k_cache.size(0) * bs < INT32_MAX,
              "sizes exceed 32-bit indexing");

  at::Tensor out = at::empty({T, Hq, D}, q.options());
  if (T == 0 || N == 0) return out;
  const c10::cuda::CUDAGuard guard(q.device());

  p04::PrefillParams p{};
  p.q = q.data_ptr();
  p.o = out.data_ptr();
  p.k_cache = k_cache.data_ptr();
  p.v_cache = v_cache.data_ptr();
  p.block_tables = block_tables.data_ptr<int>();
  p.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
  p.context_lens = context_lens.data_ptr<int>();
  p.q_tok_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.o_tok_stride = out.stride(0);
  p.o_head_stride = out.stride(1);
  p.slot_stride = Hkv * D;
  p.bt_stride = static_cast<int>(block_tables.stride(0));
  p.max_blocks = static_cast<int>(block_tables.size(1));
  p.num_seqs = static_cast<int>(N);
  p.group = static_cast<int>(G);
  p.log2_block_size = __builtin_ctzll(static_cast<unsigned long long>(bs));
  p.softmax_scale = static_cast<float>(softmax_scale);
  const cudaError_t err = p04::launch_paged_prefill(
      p, fp8 ? k_scale->data_ptr<float>() : nullptr, fp8 ? v_scale->data_ptr<float>() : nullptr,
      q.scalar_type() == at::kHalf, static_cast<int>(D), T * G, static_cast<int>(Hkv),
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "paged_prefill: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_prefill_fwd", &paged_prefill_fwd,
        "Chunked-prefill attention over a paged KV cache, 16-bit or FP8 with per-KV-head "
        "scales (see kernels/reference.py)");
}
