// Step 5: 2D register blocking. Each thread computes an 8x8 sub-tile: per k it loads 8 A values
// and 8 B values from shared memory into registers and does 64 FMAs with them (outer product),
// so shared-memory loads per FMA drop to 16/64 = 1/4. Block tile 128x128 (BK = 8), 256 threads,
// 64 accumulators per thread.
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;
constexpr int kThreads = kBM * kBN / (kTM * kTN);  // 256

__global__ void __launch_bounds__(kThreads)
    sgemm_2d_kernel(const float* __restrict__ a, const float* __restrict__ b,
                    float* __restrict__ c, int m, int n, int k) {
  __shared__ float as[kBM][kBK];  // (row, k)
  __shared__ float bs[kBK][kBN];  // (k, col)
  const int t = threadIdx.x;
  const int block_row = blockIdx.y * kBM, block_col = blockIdx.x * kBN;
  const int thread_row = t / (kBN / kTN) * kTM;  // 0..120
  const int thread_col = t % (kBN / kTN) * kTN;  // 0..120
  float acc[kTM][kTN] = {};
  float reg_a[kTM], reg_b[kTN];
  for (int k0 = 0; k0 < k; k0 += kBK) {
    // 1024 elements per tile, 4 per thread; each pass of 256 threads covers 32 rows of A (8 wide)
    // and 2 rows of B (128 wide).
#pragma unroll
    for (int p = 0; p < kBM * kBK / kThreads; ++p) {
      const int idx = p * kThreads + t;
      const int r = idx / kBK, cc = idx % kBK;
      const int gr = block_row + r, gc = k0 + cc;
      as[r][cc] = (gr < m && gc < k) ? a[gr * k + gc] : 0.0f;
    }
#pragma unroll
    for (int p = 0; p < kBK * kBN / kThreads; ++p) {
      const int idx = p * kThreads + t;
      const int r = idx / kBN, cc = idx % kBN;
      const int gr = k0 + r, gc = block_col + cc;
      bs[r][cc] = (gr < k && gc < n) ? b[gr * n + gc] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBK; ++i) {
#pragma unroll
      for (int r = 0; r < kTM; ++r) reg_a[r] = as[thread_row + r][i];
#pragma unroll
      for (int cc = 0; cc < kTN; ++cc) reg_b[cc] = bs[i][thread_col + cc];
#pragma unroll
      for (int r = 0; r < kTM; ++r)
#pragma unroll
        for (int cc = 0; cc < kTN; ++cc) acc[r][cc] += reg_a[r] * reg_b[cc];
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    const int row = block_row + thread_row + r;
    if (row >= m) break;
#pragma unroll
    for (int cc = 0; cc < kTN; ++cc) {
      const int col = block_col + thread_col + cc;
      if (col < n) c[row * n + col] = acc[r][cc];
    }
  }
}

}  // namespace

cudaError_t sgemm_05_2d_blocktiling(const float* a, const float* b, float* c, int m, int n, int k,
                                    cudaStream_t stream) {
  const dim3 grid(p01::ceil_div(n, kBN), p01::ceil_div(m, kBM));
  sgemm_2d_kernel<<<grid, kThreads, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}
