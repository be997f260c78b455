// Step 3: shared-memory tiling. A block stages a 32x32 tile of A and of B in shared memory, then
// every thread runs 32 FMAs out of it. Each global element is read once per block instead of
// once per thread: global traffic drops 32x. But every FMA still needs two shared-memory loads,
// so the kernel is now bound by shared-memory load instructions (LDS), not DRAM.
// Edges: out-of-range elements of the tiles are zero-filled, so any M, N, K works.
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int kTile = 32;

__global__ void sgemm_smem_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ c, int m, int n, int k) {
  __shared__ float as[kTile][kTile];      // (row, k)
  __shared__ float bs[kTile][kTile + 1];  // (k, col); +1 keeps column reads off one bank
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty;
  const int col = blockIdx.x * kTile + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    as[ty][tx] = (row < m && k0 + tx < k) ? a[row * k + k0 + tx] : 0.0f;
    bs[ty][tx] = (k0 + ty < k && col < n) ? b[(k0 + ty) * n + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += as[ty][i] * bs[i][tx];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = acc;
}

}  // namespace

cudaError_t sgemm_03_smem_tiling(const float* a, const float* b, float* c, int m, int n, int k,
                                 cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(p01::ceil_div(n, kTile), p01::ceil_div(m, kTile));
  sgemm_smem_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}
