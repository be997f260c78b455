// The C interface between the pure-CUDA kernel files (sgemm_0*.cu, hgemm_0*.cu) and the one
// PyTorch binding (binding.cpp). Kernel files include no torch headers, so each compiles in
// seconds with plain nvcc (the CPU-tier compile check does exactly that).
//
// Every launcher computes C = A @ B for row-major contiguous A (M, K), B (K, N), C (M, N), any
// M, N, K >= 1, on `stream`, and returns the launch's cudaError_t (cudaGetLastError()).
// Index arithmetic is 32-bit: the caller guarantees M*K, K*N and M*N are below 2^31.
#pragma once

#include <cuda_runtime.h>

// Element type of the tensor-core kernels' A, B and C (accumulation is always float32).
enum P01HalfType : int { kP01Float16 = 0, kP01BFloat16 = 1 };

// float32 on CUDA cores: the ladder's steps 1-7.
cudaError_t sgemm_01_naive(const float* a, const float* b, float* c, int m, int n, int k,
                           cudaStream_t stream);
cudaError_t sgemm_02_coalesced(const float* a, const float* b, float* c, int m, int n, int k,
                               cudaStream_t stream);
cudaError_t sgemm_03_smem_tiling(const float* a, const float* b, float* c, int m, int n, int k,
                                 cudaStream_t stream);
cudaError_t sgemm_04_1d_blocktiling(const float* a, const float* b, float* c, int m, int n, int k,
                                    cudaStream_t stream);
cudaError_t sgemm_05_2d_blocktiling(const float* a, const float* b, float* c, int m, int n, int k,
                                    cudaStream_t stream);
cudaError_t sgemm_06_vectorized(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream);
cudaError_t sgemm_07_warptiling(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream);

// bfloat16/float16 on tensor cores with float32 accumulation: steps 8-9. `dtype` is P01HalfType.
cudaError_t hgemm_08_mma_sync(const void* a, const void* b, void* c, int m, int n, int k,
                              int dtype, cudaStream_t stream);
// Hopper only (sm_90a): returns cudaErrorNotSupported when built for another architecture.
// Needs 16-byte aligned pointers and K % 8 == 0, N % 8 == 0 (TMA's stride rule); the caller
// pads otherwise.
cudaError_t hgemm_09_wgmma_tma(const void* a, const void* b, void* c, int m, int n, int k,
                               int dtype, cudaStream_t stream);

// FP8 on tensor cores, Hopper only (sm_90a), step 10: C (M, N) bfloat16 =
// (scale_a[0] A) (scale_b[0] B)^T for A (M, K) and B (N, K) row-major float8 e4m3 (both K-major,
// as FP8 wgmma reads them) and float32 scales in device memory, float32 accumulation; the
// contract of torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16). Returns
// cudaErrorNotSupported off compute capability 9.0 or when built for another architecture, and
// cudaErrorInvalidValue unless K % 16 == 0 (TMA's stride rule), A and B are 16-byte aligned and
// C is 4-byte aligned. Any M, N >= 1.
cudaError_t fp8gemm_10_wgmma_tma(const void* a, const void* b, const float* scale_a,
                                 const float* scale_b, void* c, int m, int n, int k,
                                 cudaStream_t stream);
