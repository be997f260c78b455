// Step 7: warp tiling + double buffering, the last float32 step.
//
// - Warp tiling: the 128x128 block tile is split into 8 warp tiles of 64x32; each lane computes
//   a 2x2 grid of 4x4 sub-tiles inside its warp tile. A warp's shared-memory reads for one k are
//   then 8 distinct float4 of A and 4 of B (broadcast to the other lanes): every LDS.128 is
//   conflict-free and feeds 16 FMAs per lane.
// - Double buffering: two shared-memory stages. The next tile's global loads are issued into
//   registers before the FMAs on the current tile and stored to the other stage afterwards, so
//   DRAM/L2 latency hides behind arithmetic and one __syncthreads per tile suffices.
// - Grouped raster order of blocks (8 tile-rows at a time) for L2 reuse of A and B.
// BK = 16: 33 KB of static shared memory, 2 blocks (16 warps) per SM at <= 128 registers.
// compile-check: no-spill
#include "common.cuh"
#include "gemm.h"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kThreads = 256;
constexpr int kWM = 64, kWN = 32;                  // warp tile; warps are 2 (rows) x 4 (cols)
constexpr int kTM = 4, kTN = 4;                    // lane sub-tile
constexpr int kLaneRows = 8, kLaneCols = 4;        // lanes in a warp: 8 x 4
constexpr int kWMIter = kWM / (kLaneRows * kTM);   // 2
constexpr int kWNIter = kWN / (kLaneCols * kTN);   // 2
constexpr int kPadA = 4;
constexpr int kLoads = kBM * kBK / 4 / kThreads;   // float4 per thread per tile, A and B: 2
constexpr int kGroupM = 8;

template <bool kVec>
__device__ __forceinline__ float4 load4(const float* __restrict__ base, int row, int col,
                                        int rows, int cols) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row >= rows) return v;
  const float* p = base + row * cols + col;
  if (kVec) {
    if (col < cols) v = *reinterpret_cast<const float4*>(p);
  } else {
    v.x = col < cols ? p[0] : 0.f;
    v.y = col + 1 < cols ? p[1] : 0.f;
    v.z = col + 2 < cols ? p[2] : 0.f;
    v.w = col + 3 < cols ? p[3] : 0.f;
  }
  return v;
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads, 2)
    sgemm_warptile_kernel(const float* __restrict__ a, const float* __restrict__ b,
                          float* __restrict__ c, int m, int n, int k) {
  __shared__ __align__(16) float as[2][kBK][kBM + kPadA];  // (k, row): A transposed
  __shared__ __align__(16) float bs[2][kBK][kBN];          // (k, col)

  int tile_m, tile_n;
  p01::grouped_tile(blockIdx.x, p01::ceil_div(m, kBM), p01::ceil_div(n, kBN), kGroupM, tile_m,
                    tile_n);
  const int block_row = tile_m * kBM, block_col = tile_n * kBN;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int warp_row = warp / (kBN / kWN) * kWM;  // 0, 64
  const int warp_col = warp % (kBN / kWN) * kWN;  // 0, 32, 64, 96
  const int lane_row = lane / kLaneCols, lane_col = lane % kLaneCols;

  float acc[kWMIter][kWNIter][kTM][kTN] = {};
  float4 pre_a[kLoads], pre_b[kLoads];

  auto load_global = [&](int k0) {
#pragma unroll
    for (int p = 0; p < kLoads; ++p) {
      const int idx = p * kThreads + t;
      const int ar = idx / (kBK / 4), ac = idx % (kBK / 4) * 4;  // A: 128 rows x 4 float4
      pre_a[p] = load4<kVec>(a, block_row + ar, k0 + ac, m, k);
      const int br = idx / (kBN / 4), bc = idx % (kBN / 4) * 4;  // B: 16 rows x 32 float4
      pre_b[p] = load4<kVec>(b, k0 + br, block_col + bc, k, n);
    }
  };
  auto store_smem = [&](int stage) {
#pragma unroll
    for (int p = 0; p < kLoads; ++p) {
      const int idx = p * kThreads + t;
      const int ar = idx / (kBK / 4), ac = idx % (kBK / 4) * 4;
      as[stage][ac + 0][ar] = pre_a[p].x;
      as[stage][ac + 1][ar] = pre_a[p].y;
      as[stage][ac + 2][ar] = pre_a[p].z;
      as[stage][ac + 3][ar] = pre_a[p].w;
      const int br = idx / (kBN / 4), bc = idx % (kBN / 4) * 4;
      *reinterpret_cast<float4*>(&bs[stage][br][bc]) = pre_b[p];
    }
  };

  const int k_tiles = p01::ceil_div(k, kBK);
  load_global(0);
  store_smem(0);
  __syncthreads();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < k_tiles) load_global((kt + 1) * kBK);  // in flight during the FMAs below
#pragma unroll
    for (int i = 0; i < kBK; ++i) {
      float reg_a[kWMIter][kTM], reg_b[kWNIter][kTN];
#pragma unroll
      for (int wm = 0; wm < kWMIter; ++wm) {
        const float4 v = *reinterpret_cast<const float4*>(
            &as[stage][i][warp_row + wm * kLaneRows * kTM + lane_row * kTM]);
        reg_a[wm][0] = v.x, reg_a[wm][1] = v.y, reg_a[wm][2] = v.z, reg_a[wm][3] = v.w;
      }
#pragma unroll
      for (int wn = 0; wn < kWNIter; ++wn) {
        const float4 v = *reinterpret_cast<const float4*>(
            &bs[stage][i][warp_col + wn * kLaneCols * kTN + lane_col * kTN]);
        reg_b[wn][0] = v.x, reg_b[wn][1] = v.y, reg_b[wn][2] = v.z, reg_b[wn][3] = v.w;
      }
#pragma unroll
      for (int wm = 0; wm < kWMIter; ++wm)
#pragma unroll
        for (int wn = 0; wn < kWNIter; ++wn)
#pragma unroll
          for (int r = 0; r < kTM; ++r)
#pragma unroll
            for (int cc = 0; cc < kTN; ++cc) acc[wm][wn][r][cc] += reg_a[wm][r] * reg_b[wn][cc];
    }
    if (kt + 1 < k_tiles) store_smem(stage ^ 1);  // that stage was last read before the barrier
    __syncthreads();
  }

#pragma unroll
  for (int wm = 0; wm < kWMIter; ++wm)
#pragma unroll
    for (int r = 0; r < kTM; ++r) {
      const int row = block_row + warp_row + wm * kLaneRows * kTM + lane_row * kTM + r;
      if (row >= m) continue;
#pragma unroll
      for (int wn = 0; wn < kWNIter; ++wn) {
        const int col = block_col + warp_col + wn * kLaneCols * kTN + lane_col * kTN;
        float* p = c + row * n + col;
        const float* v = acc[wm][wn][r];
        if (kVec) {
          if (col < n) *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int j = 0; j < kTN; ++j)
            if (col + j < n) p[j] = v[j];
        }
      }
    }
}

}  // namespace

cudaError_t sgemm_07_warptiling(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream) {
  const int blocks = p01::ceil_div(m, kBM) * p01::ceil_div(n, kBN);
  const bool vec = k % 4 == 0 && n % 4 == 0 && p01::aligned16(a) && p01::aligned16(b) &&
                   p01::aligned16(c);
  if (vec)
    sgemm_warptile_kernel<true><<<blocks, kThreads, 0, stream>>>(a, b, c, m, n, k);
  else
    sgemm_warptile_kernel<false><<<blocks, kThreads, 0, stream>>>(a, b, c, m, n, k);
  return cudaGetLastError();
}
