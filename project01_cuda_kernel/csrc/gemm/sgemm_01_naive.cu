// Step 1: one thread per output element, straight from the definition.
//
// threadIdx.x walks down a column of C (consecutive threads take consecutive rows), so a warp's
// 32 loads of A touch 32 different rows (32 sectors for 32 useful floats) and its 32 loads of B
// are all the same address. Nothing is reused from on-chip memory: every FMA reads two floats
// from L1/L2. Expected: a few percent of cuBLAS, bound by load instructions, not DRAM.
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int kTile = 32;

__global__ void sgemm_naive_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ c, int m, int n, int k) {
  const int row = blockIdx.x * kTile + threadIdx.x;  // consecutive threads: consecutive rows
  const int col = blockIdx.y * kTile + threadIdx.y;
  if (row >= m || col >= n) return;
  float acc = 0.0f;
  for (int i = 0; i < k; ++i) acc += a[row * k + i] * b[i * n + col];
  c[row * n + col] = acc;
}

}  // namespace

cudaError_t sgemm_01_naive(const float* a, const float* b, float* c, int m, int n, int k,
                           cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(p01::ceil_div(m, kTile), p01::ceil_div(n, kTile));
  sgemm_naive_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}
