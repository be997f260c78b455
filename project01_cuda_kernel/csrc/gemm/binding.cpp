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

// Step 10: c (M, N) bfloat16 = (scale_a a) (scale_b b)^T for a (M, K), b (N, K) float8 e4m3,
// Hopper only.
void fp8gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
             const at::Tensor& scale_b, at::Tensor& c) {
  const at::Tensor* all[] = {&a, &b, &scale_a, &scale_b, &c};
  for (const at::Tensor* t : all) {
    TORCH_CHECK(t->is_cuda(), "fp8gemm: a, b, scale_a, scale_b and c must be CUDA tensors, got ",
                t->device());
    TORCH_CHECK(t->device() == a.device(), "fp8gemm: every tensor must be on a's device ",
                a.device(), ", got ", t->device());
  }
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "fp8gemm: a, b and c must be 2-D");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(),
              "fp8gemm: a, b and c must be contiguous (row-major)");
  TORCH_CHECK(a.scalar_type() == at::kFloat8_e4m3fn && b.scalar_type() == at::kFloat8_e4m3fn,
              "fp8gemm: a and b must be float8_e4m3fn, got ", a.scalar_type(), " and ",
              b.scalar_type());
  TORCH_CHECK(c.scalar_type() == at::kBFloat16, "fp8gemm: c must be bfloat16, got ",
              c.scalar_type());
  TORCH_CHECK(scale_a.scalar_type() == at::kFloat && scale_b.scalar_type() == at::kFloat &&
                  scale_a.numel() == 1 && scale_b.numel() == 1,
              "fp8gemm: scale_a and scale_b must be float32 tensors of one element");
  TORCH_CHECK(a.size(1) == b.size(1), "fp8gemm: a is (M, K) and b must be (N, K)");
  TORCH_CHECK(c.size(0) == a.size(0) && c.size(1) == b.size(0), "fp8gemm: c must be (M, N)");
  TORCH_CHECK(a.size(1) % 16 == 0, "fp8gemm: K must be a multiple of 16 (TMA's 16-byte row "
              "stride), got K = ", a.size(1));
  TORCH_CHECK(a.numel() < (int64_t(1) << 31) && b.numel() < (int64_t(1) << 31) &&
                  c.numel() < (int64_t(1) << 31),
              "fp8gemm: each operand must have fewer than 2^31 elements (32-bit indexing)");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(c.data_ptr()) % 4 == 0,
              "fp8gemm: a and b must start 16-byte aligned (TMA) and c 4-byte aligned");
  const c10::cuda::CUDAGuard guard(a.device());
  int major = 0, minor = 0;
  const int dev = a.get_device();
  TORCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                      cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ==
                      cudaSuccess,
              "fp8gemm: cannot read the compute capability of ", a.device());
  TORCH_CHECK(major == 9 && minor == 0,
              "fp8gemm_10_wgmma_tma needs compute capability 9.0 (Hopper, sm_90a); this GPU is ",
              major, ".", minor);
  if (a.size(0) == 0 || b.size(0) == 0) return;
  if (a.size(1) == 0) {
    c.zero_();
    return;
  }
  check_launch(fp8gemm_10_wgmma_tma(a.data_ptr(), b.data_ptr(), scale_a.data_ptr<float>(),
                                    scale_b.data_ptr<float>(), c.data_ptr(),
                                    static_cast<int>(a.size(0)), static_cast<int>(b.size(0)),
                                    static_cast<int>(a.size(1)),
                                    c10::cuda::getCurrentCUDAStream()),
               "fp8gemm_10_wgmma_tma");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "project01 GEMM ladder: float32 CUDA-core steps 1-7, tensor-core steps 8-9, FP8 step 10";
  m.def("sgemm", &sgemm, "C = A @ B with float32 ladder step 1..7 (writes into c)");
  m.def("hgemm", &hgemm, "C = A @ B with tensor-core step 8 or 9 (writes into c)");
  m.def("fp8gemm", &fp8gemm,
        "C = (scale_a A) (scale_b B)^T, A (M, K) and B (N, K) float8 e4m3, C bfloat16: step 10 "
        "(writes into c)");
}
