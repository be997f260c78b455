// Step 2: the same arithmetic as step 1, with the thread-to-output map transposed.
//
// threadIdx.x now walks along a row of C: a warp reads one A element (a broadcast) and 32
// consecutive B elements (one 128-byte line), and writes 32 consecutive C elements. Same FLOPs,
// far fewer memory transactions per FMA. Expected: several times step 1.
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int kTile = 32;

__global__ void sgemm_coalesced_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ c, int m, int n, int k) {
  const int col = blockIdx.x * kTile + threadIdx.x;  // consecutive threads: consecutive columns
  const int row = blockIdx.y * kTile + threadIdx.y;
  if (row >= m || col >= n) return;
  float acc = 0.0f;
  for (int i = 0; i < k; ++i) acc += a[row * k + i] * b[i * n + col];
  c[row * n + col] = acc;
}

}  // namespace

cudaError_t sgemm_02_coalesced(const float* a, const float* b, float* c, int m, int n, int k,
                               cudaStream_t stream) {
  const dim3 block(kTile, kTile);
  const dim3 grid(p01::ceil_div(n, kTile), p01::ceil_div(m, kTile));
  sgemm_coalesced_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}
