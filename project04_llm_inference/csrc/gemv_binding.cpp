// PyTorch binding of gemv.cu: the current stream and the dtype tag; the Python wrapper
// (kernels/gemv.py) has already checked devices, dtypes, shapes and alignment.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "gemv.h"

namespace {

DType tag(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    default: TORCH_CHECK(false, "gemv: unsupported dtype ", t.scalar_type());
  }
}

void* ptr_or_null(const std::optional<torch::Tensor>& t) {
  return t.has_value() ? t->data_ptr() : nullptr;
}

// out = act(pre(x) @ w^T), or the QKV projection with RoPE and the cache write (cos_sin given);
// with w_scale, w is e4m3 with one float32 scale a row. See gemv.h for what each optional tensor
// switches on.
void gemv(torch::Tensor out, torch::Tensor x, torch::Tensor w,
          std::optional<torch::Tensor> residual, std::optional<torch::Tensor> residual_out,
          std::optional<torch::Tensor> norm_w, bool silu_mul, double eps, int64_t max_ctas,
          bool pdl, std::optional<torch::Tensor> cos_sin, std::optional<torch::Tensor> positions,
          std::optional<torch::Tensor> slots, std::optional<torch::Tensor> k_cache,
          std::optional<torch::Tensor> v_cache, int64_t n_heads, int64_t n_kv_heads,
          std::optional<torch::Tensor> w_scale) {
  const c10::cuda::CUDAGuard guard(x.device());
  if (w_scale.has_value()) {  // e4m3 weights: the conversion instruction is sm_89's
    int major = 0, minor = 0;
    const int dev = x.device().index();
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    TORCH_CHECK(major * 10 + minor >= 89,
                "gemv: FP8 weights need a GPU of compute capability >= 8.9; this GPU has compute "
                "capability ", major, ".", minor);
  }
  GemvArgs a;
  a.x = x.data_ptr();
  a.residual = ptr_or_null(residual);
  a.residual_out = ptr_or_null(residual_out);
  a.norm_w = ptr_or_null(norm_w);
  a.w = w.data_ptr();
  a.out = out.data_ptr();
  a.tokens = static_cast<int>(x.size(0));
  a.k = static_cast<int>(x.size(1));
  a.n_out = static_cast<int>(out.size(1));
  a.silu_mul = silu_mul;
  a.eps = static_cast<float>(eps);
  a.max_ctas = static_cast<int>(max_ctas);
  a.pdl = pdl;
  a.rope = GemvRope{};
  a.w_scale = w_scale.has_value() ? w_scale->data_ptr<float>() : nullptr;
  if (cos_sin.has_value()) {  // RoPE + cache write folded in (see gemv.h)
    a.rope.cos_sin = cos_sin->data_ptr<float>();
    a.rope.positions = positions.value().data_ptr<int64_t>();
    a.rope.slots = slots.value().data_ptr<int64_t>();
    a.rope.k_cache = k_cache.value().data_ptr();
    a.rope.v_cache = v_cache.value().data_ptr();
    a.rope.n_heads = static_cast<int>(n_heads);
    a.rope.n_kv_heads = static_cast<int>(n_kv_heads);
    a.rope.head_dim = static_cast<int>(cos_sin->size(1));
  }
  const cudaError_t err = launch_gemv(a, tag(x), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "gemv: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemv", &gemv, "out = act(rms_norm(x [+ residual]) @ w^T) for a few tokens");
}
