// PyTorch binding for the GEMM ladder: the only file of the extension that includes torch headers
// (compiled once, at first use on a GPU machine). It checks the tensors, takes the current CUDA
// stream and calls the plain launchers declared in gemm.h. Python (gemm.py) validates the inputs
// with clear messages first; the checks here are a second line of defence.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "gemm.h"

namespace {

using SgemmFn = cudaError_t (*)(const float*, const float*, float*, int, int, int, cudaStream_t);
using HgemmFn = cudaError_t (*)(const void*, const void*, void*, int, int, int, int, cudaStream_t);

void check_operands(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && c.is_cuda(), "a, b and c must be CUDA tensors");
  TORCH_CHECK(a.device() == b.device() && a.device() == c.device(),
              "a, b and c must be on the same device");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "a, b and c must be 2-D");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(),
              "a, b and c must be contiguous (row-major)");
  TORCH_CHECK(a.size(1) == b.size(0), "a is (M, K) and b must be (K, N)");
  TORCH_CHECK(c.size(0) == a.size(0) && c.size(1) == b.size(1), "c must be (M, N)");
  TORCH_CHECK(a.scalar_type() == b.scalar_type() && a.scalar_type() == c.scalar_type(),
              "a, b and c must share a dtype");
  TORCH_CHECK(a.numel() < (int64_t(1) << 31) && b.numel() < (int64_t(1) << 31) &&
                  c.numel() < (int64_t(1) << 31),
              "each operand must have fewer than 2^31 elements (32-bit indexing)");
}

void check_launch(cudaError_t err, const char* name) {
  TORCH_CHECK(err == cudaSuccess, name, " failed to launch: ", cudaGetErrorString(err));
}

// step: 1..7, the float32 ladder.
void sgemm(int64_t step, const at::Tensor& a, const at::Tensor& b, at::Tensor& c) {
  static const SgemmFn fns[] = {sgemm_01_naive,          sgemm_02_coalesced,
                                sgemm_03_smem_tiling,    sgemm_04_1d_blocktiling,
                                sgemm_05_2d_blocktiling, sgemm_06_vectorized,
                                sgemm_07_warptiling};
  TORCH_CHECK(step >= 1 && step <= 7, "sgemm step must be 1..7, got ", step);
  check_operands(a, b, c);
  TORCH_CHECK(a.scalar_type() == at::kFloat, "sgemm kernels take float32");
  const c10::cuda::CUDAGuard guard(a.device());
  check_launch(fns[step - 1](a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                             static_cast<int>(a.size(0)), static_cast<int>(b.size(1)),
                             static_cast<int>(a.size(1)), c10::cuda::getCurrentCUDAStream()),
               "sgemm");
}

// step: 8 (mma.sync) or 9 (wgmma + TMA, Hopper only).
void hgemm(int64_t step, const at::Tensor& a, const at::Tensor& b, at::Tensor& c) {
  TORCH_CHECK(step == 8 || step == 9, "hgemm step must be 8 or 9, got ", step);
  check_operands(a, b, c);
  const auto dt = a.scalar_type();
  TORCH_CHECK(dt == at::kBFloat16 || dt == at::kHalf, "hgemm kernels take bfloat16 or float16");
  const c10::cuda::CUDAGuard guard(a.device());
  const HgemmFn fn = step == 8 ? hgemm_08_mma_sync : hgemm_09_wgmma_tma;
  check_launch(fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), static_cast<int>(a.size(0)),
                  static_cast<int>(b.size(1)), static_cast<int>(a.size(1)),
                  dt == at::kBFloat16 ? kP01BFloat16 : kP01Float16,
                  c10::cuda::getCurrentCUDAStream()),
               step == 8 ? "hgemm_08_mma_sync" : "hgemm_09_wgmma_tma");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "project01 GEMM ladder: float32 CUDA-core steps 1-7, tensor-core steps 8-9";
  m.def("sgemm", &sgemm, "C = A @ B with float32 ladder step 1..7 (writes into c)");
  m.def("hgemm", &hgemm, "C = A @ B with tensor-core step 8 or 9 (writes into c)");
}
