// Step 6: 128-bit memory operations. Same 128x128 block tile and 8x8 thread tile as step 5, but
// - global loads are float4 (one LDG.128 instead of four LDG.32),
// - the A tile is stored transposed in shared memory, (k, row), so a thread's 8 A values for one
//   k are contiguous and come in two LDS.128, like its 8 B values,
// - C is written with float4 stores.
// Fewer, wider instructions for the same bytes: load/store instruction count drops ~4x.
// float4 needs 16-byte alignment: when K or N is not a multiple of 4 (or a pointer is not 16-byte
// aligned) the kernel is instantiated with kVec = false and falls back to guarded scalar accesses.
// compile-check: no-spill
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;
constexpr int kThreads = kBM * kBN / (kTM * kTN);  // 256
constexpr int kPadA = 4;  // keeps the transposed stores of two k-halves off the same banks

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    sgemm_vec_kernel(const float* __restrict__ a, const float* __restrict__ b,
                     float* __restrict__ c, int m, int n, int k) {
  __shared__ __align__(16) float as[kBK][kBM + kPadA];  // (k, row): A transposed
  __shared__ __align__(16) float bs[kBK][kBN];          // (k, col)
  const int t = threadIdx.x;
  const int block_row = blockIdx.y * kBM, block_col = blockIdx.x * kBN;
  const int thread_row = t / (kBN / kTN) * kTM;
  const int thread_col = t % (kBN / kTN) * kTN;
  // Loader roles: A tile 128 x 8 = 256 float4 (one per thread), B tile 8 x 128 likewise.
  const int a_r = t / (kBK / 4), a_c = t % (kBK / 4) * 4;
  const int b_r = t / (kBN / 4), b_c = t % (kBN / 4) * 4;
  float acc[kTM][kTN] = {};
  float reg_a[kTM], reg_b[kTN];
  for (int k0 = 0; k0 < k; k0 += kBK) {
    float4 va = make_float4(0.f, 0.f, 0.f, 0.f), vb = va;
    {
      const int gr = block_row + a_r, gc = k0 + a_c;
      if (kVec) {
        if (gr < m && gc < k) va = *reinterpret_cast<const float4*>(a + gr * k + gc);
      } else if (gr < m) {
        const float* p = a + gr * k;
        va.x = gc < k ? p[gc] : 0.f;
        va.y = gc + 1 < k ? p[gc + 1] : 0.f;
        va.z = gc + 2 < k ? p[gc + 2] : 0.f;
        va.w = gc + 3 < k ? p[gc + 3] : 0.f;
      }
    }
    {
      const int gr = k0 + b_r, gc = block_col + b_c;
      if (kVec) {
        if (gr < k && gc < n) vb = *reinterpret_cast<const float4*>(b + gr * n + gc);
      } else if (gr < k) {
        const float* p = b + gr * n;
        vb.x = gc < n ? p[gc] : 0.f;
        vb.y = gc + 1 < n ? p[gc + 1] : 0.f;
        vb.z = gc + 2 < n ? p[gc + 2] : 0.f;
        vb.w = gc + 3 < n ? p[gc + 3] : 0.f;
      }
    }
    as[a_c + 0][a_r] = va.x;
    as[a_c + 1][a_r] = va.y;
    as[a_c + 2][a_r] = va.z;
    as[a_c + 3][a_r] = va.w;
    *reinterpret_cast<float4*>(&bs[b_r][b_c]) = vb;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kBK; ++i) {
#pragma unroll
      for (int r = 0; r < kTM; r += 4) {
        const float4 v = *reinterpret_cast<const float4*>(&as[i][thread_row + r]);
        reg_a[r] = v.x, reg_a[r + 1] = v.y, reg_a[r + 2] = v.z, reg_a[r + 3] = v.w;
      }
#pragma unroll
      for (int cc = 0; cc < kTN; cc += 4) {
        const float4 v = *reinterpret_cast<const float4*>(&bs[i][thread_col + cc]);
        reg_b[cc] = v.x, reg_b[cc + 1] = v.y, reg_b[cc + 2] = v.z, reg_b[cc + 3] = v.w;
      }
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
    for (int cc = 0; cc < kTN; cc += 4) {
      const int col = block_col + thread_col + cc;
      float* p = c + row * n + col;
      if (kVec) {
        if (col < n) *reinterpret_cast<float4*>(p) =
            make_float4(acc[r][cc], acc[r][cc + 1], acc[r][cc + 2], acc[r][cc + 3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (col + j < n) p[j] = acc[r][cc + j];
      }
    }
  }
}

}  // namespace

cudaError_t sgemm_06_vectorized(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream) {
  const dim3 grid(p01::ceil_div(n, kBN), p01::ceil_div(m, kBM));
  const bool vec = k % 4 == 0 && n % 4 == 0 && p01::aligned16(a) && p01::aligned16(b) &&
                   p01::aligned16(c);
  if (vec)
    sgemm_vec_kernel<true><<<grid, kThreads, 0, stream>>>(a, b, c, m, n, k);
  else
    sgemm_vec_kernel<false><<<grid, kThreads, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}
