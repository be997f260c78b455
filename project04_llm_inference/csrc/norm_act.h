// Launchers of norm_act.cu (torch-free, so CI compiles the kernels with nvcc alone).
#pragma once
#include <cuda_runtime.h>

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// residual == nullptr: out = rms_norm(x) * w. Otherwise, in place: residual += x;
// x = rms_norm(residual) * w (out unused). Rows of `hidden` contiguous elements.
// pdl: launch with programmatic dependent launch (pdl.cuh), sm_90 and newer.
cudaError_t launch_rms_norm(void* out, void* x, void* residual, const void* w, int rows,
                            int hidden, float eps, DType dtype, cudaStream_t stream, bool pdl);

// out (rows, f) = silu(in[:, :f]) * in[:, f:], in (rows, 2f).
cudaError_t launch_silu_and_mul(void* out, const void* in, int rows, int f, DType dtype,
                                cudaStream_t stream, bool pdl);
