// PyTorch binding of norm_act.cu: the current stream and the dtype tag; the Python wrapper
// (kernels/norm_act.py) has already checked devices, dtypes and shapes with clear messages.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "norm_act.h"

namespace {

DType tag(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    case at::kFloat: return DType::kF32;
    default: TORCH_CHECK(false, "norm_act: unsupported dtype ", t.scalar_type());
  }
}

void check(cudaError_t err) { TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err)); }

void rms_norm(torch::Tensor out, torch::Tensor x, torch::Tensor w, double eps, bool pdl) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int hidden = x.size(-1);
  check(launch_rms_norm(out.data_ptr(), x.data_ptr(), nullptr, w.data_ptr(), x.numel() / hidden,
                        hidden, static_cast<float>(eps), tag(x),
                        c10::cuda::getCurrentCUDAStream(), pdl));
}

void fused_add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps,
                        bool pdl) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int hidden = x.size(-1);
  check(launch_rms_norm(nullptr, x.data_ptr(), residual.data_ptr(), w.data_ptr(),
                        x.numel() / hidden, hidden, static_cast<float>(eps), tag(x),
                        c10::cuda::getCurrentCUDAStream(), pdl));
}

void silu_and_mul(torch::Tensor out, torch::Tensor in, bool pdl) {
  const c10::cuda::CUDAGuard guard(in.device());
  const int f = out.size(-1);
  check(launch_silu_and_mul(out.data_ptr(), in.data_ptr(), out.numel() / f, f, tag(in),
                            c10::cuda::getCurrentCUDAStream(), pdl));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "out = rms_norm(x) * w");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "residual += x; x = rms_norm(residual) * w");
  m.def("silu_and_mul", &silu_and_mul, "out = silu(in[:, :F]) * in[:, F:]");
}
