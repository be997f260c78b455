// Step 8: bfloat16/float16 on tensor cores (float32 accumulation) with the Ampere-style tools:
// - mma.sync.m16n8k16: a warp multiplies a 16x16 A fragment by a 16x8 B fragment out of
//   registers; 8 warp-level MMAs replace 2048 scalar FMAs.
// - ldmatrix: fragments come from shared memory with one instruction per four 8x8 matrices;
//   ldmatrix.trans turns B's row-major (k, n) tile into the column fragments the MMA wants.
// - cp.async: a 4-stage pipeline of global->shared copies that bypass registers, so three tiles
//   are in flight while the tensor cores work on the fourth.
// - XOR-swizzled shared-memory layouts: the 8 rows one ldmatrix reads sit in 8 different bank
//   groups (no bank conflicts, no padding).
// Block tile 128x128x32, 4 warps (2x2), warp tile 64x64 (4x8 MMAs per k16), 64 KB of shared
// memory per block, grouped raster order for L2 reuse.
// Edges: tiles are zero-filled past M, N and K (cp.async with src-size 0). cp.async needs
// 16-byte aligned sources; when K or N is not a multiple of 8 the kernel is instantiated with
// kAligned = false and stages tiles through registers with guarded element loads instead.
// compile-check: no-spill
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"
#include "common/sm80.cuh"
#include "gemm.h"

namespace {

using namespace p01::sm80;  // cp.async, ldmatrix and mma.sync wrappers (common/sm80.cuh)

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4;
constexpr int kThreads = 128;  // 4 warps, 2 x 2
constexpr int kWM = 64, kWN = 64;
constexpr int kMI = kWM / 16, kNI = kWN / 8;  // 4 x 8 MMAs per warp per k16
constexpr int kGroupM = 8;
constexpr int kStageElems = kBM * kBK + kBK * kBN;                   // A then B, elements
constexpr int kSmemBytes = kStages * kStageElems * 2;                // 64 KB
constexpr int kChunksA = kBM * kBK / 8, kChunksB = kBK * kBN / 8;   // 16-byte chunks per tile

// A tile (128 x 32): row r holds 4 chunks of 8 elements; chunk c lives at c ^ ((r >> 1) & 3),
// so rows r..r+7 of one chunk column cover all 8 positions of a 128-byte bank line.
__device__ __forceinline__ int a_offset(int r, int chunk) {
  return r * kBK + ((chunk ^ ((r >> 1) & 3)) << 3);
}
// B tile (32 x 128): row r holds 16 chunks; chunk c lives at c ^ (r & 7).
__device__ __forceinline__ int b_offset(int r, int chunk) {
  return r * kBN + ((chunk ^ (r & 7)) << 3);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

// One 16-byte chunk (8 elements) of a row, zero past `cols`, without alignment requirements.
template <typename T>
__device__ __forceinline__ uint4 load_chunk_guarded(const T* row_ptr, int col, int cols) {
  uint16_t v[8];
  const uint16_t* p = reinterpret_cast<const uint16_t*>(row_ptr);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = col + j < cols ? p[col + j] : uint16_t(0);
  uint4 out;
  out.x = v[0] | (uint32_t(v[1]) << 16);
  out.y = v[2] | (uint32_t(v[3]) << 16);
  out.z = v[4] | (uint32_t(v[5]) << 16);
  out.w = v[6] | (uint32_t(v[7]) << 16);
  return out;
}

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kThreads)
    hgemm_mma_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int m,
                     int n, int k) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  int tile_m, tile_n;
  p01::grouped_tile(blockIdx.x, p01::ceil_div(m, kBM), p01::ceil_div(n, kBN), kGroupM, tile_m,
                    tile_n);
  const int block_row = tile_m * kBM, block_col = tile_n * kBN;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int warp_row = warp / 2 * kWM, warp_col = warp % 2 * kWN;

  auto load_tile = [&](int stage, int k0) {
    T* as = smem + stage * kStageElems;
    T* bs = as + kBM * kBK;
#pragma unroll
    for (int p = 0; p < kChunksA / kThreads; ++p) {
      const int idx = p * kThreads + t;
      const int r = idx / (kBK / 8), ch = idx % (kBK / 8);
      const int gr = block_row + r, gc = k0 + ch * 8;
      T* dst = as + a_offset(r, ch);
      if constexpr (kAligned) {
        const bool valid = gr < m && gc < k;
        cp_async_16(smem_u32(dst), valid ? a + gr * k + gc : a, valid);
      } else {
        *reinterpret_cast<uint4*>(dst) =
            gr < m ? load_chunk_guarded(a + gr * k, gc, k) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int p = 0; p < kChunksB / kThreads; ++p) {
      const int idx = p * kThreads + t;
      const int r = idx / (kBN / 8), ch = idx % (kBN / 8);
      const int gr = k0 + r, gc = block_col + ch * 8;
      T* dst = bs + b_offset(r, ch);
      if constexpr (kAligned) {
        const bool valid = gr < k && gc < n;
        cp_async_16(smem_u32(dst), valid ? b + gr * n + gc : b, valid);
      } else {
        *reinterpret_cast<uint4*>(dst) =
            gr < k ? load_chunk_guarded(b + gr * n, gc, n) : make_uint4(0, 0, 0, 0);
      }
    }
  };

  float acc[kMI][kNI][4] = {};
  const int k_tiles = p01::ceil_div(k, kBK);

  // Prologue: stages 0..kStages-2 in flight.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(s, s * kBK);
    cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies) ...
    __syncthreads();               // ... and everyone's; everyone is done with tile kt-1
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_tile(next % kStages, next * kBK);  // refills tile kt-1's stage
    cp_async_commit();

    const T* as = smem + (kt % kStages) * kStageElems;
    const T* bs = as + kBM * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t fa[kMI][4], fb[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
        // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15 -> a0..a3
        const int r = warp_row + mi * 16 + (lane % 16);
        const int ch = kk / 8 + lane / 16;
        ldmatrix_x4(fa[mi], smem_u32(as + a_offset(r, ch)));
      }
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {
        // matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
        const int r = kk + (lane % 8) + ((lane / 8) & 1) * 8;
        const int ch = (warp_col + nj * 16) / 8 + lane / 16;
        uint32_t tmp[4];
        ldmatrix_x4_trans(tmp, smem_u32(bs + b_offset(r, ch)));
        fb[2 * nj][0] = tmp[0], fb[2 * nj][1] = tmp[1];
        fb[2 * nj + 1][0] = tmp[2], fb[2 * nj + 1][1] = tmp[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma_16816<T>(acc[mi][ni], fa[mi], fb[ni][0], fb[ni][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue: each lane holds rows (lane/4, lane/4 + 8) x cols (2*(lane%4), +1) of each 16x8.
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = block_row + warp_row + mi * 16 + lane / 4 + half * 8;
      if (row >= m) continue;
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int col = block_col + warp_col + ni * 8 + (lane % 4) * 2;
        const float v0 = acc[mi][ni][half * 2], v1 = acc[mi][ni][half * 2 + 1];
        T* p = c + row * n + col;
        if (kAligned && col + 1 < n) {
          T pair[2] = {from_float<T>(v0), from_float<T>(v1)};
          *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<uint32_t*>(pair);
        } else {
          if (col < n) p[0] = from_float<T>(v0);
          if (col + 1 < n) p[1] = from_float<T>(v1);
        }
      }
    }
#endif
}

template <typename T, bool kAligned>
cudaError_t launch(const void* a, const void* b, void* c, int m, int n, int k,
                   cudaStream_t stream) {
  auto kernel = hgemm_mma_kernel<T, kAligned>;
  static bool configured = false;  // one attribute call per instantiation
  if (!configured) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    configured = true;
  }
  const int blocks = p01::ceil_div(m, kBM) * p01::ceil_div(n, kBN);
  kernel<<<blocks, kThreads, kSmemBytes, stream>>>(static_cast<const T*>(a),
                                                   static_cast<const T*>(b), static_cast<T*>(c),
                                                   m, n, k);
  return cudaGetLastError();
}

}  // namespace

cudaError_t hgemm_08_mma_sync(const void* a, const void* b, void* c, int m, int n, int k,
                              int dtype, cudaStream_t stream) {
  const bool aligned = k % 8 == 0 && n % 8 == 0 && p01::aligned16(a) && p01::aligned16(b) &&
                       p01::aligned16(c);
  if (dtype == kP01BFloat16)
    return aligned ? launch<__nv_bfloat16, true>(a, b, c, m, n, k, stream)
                   : launch<__nv_bfloat16, false>(a, b, c, m, n, k, stream);
  if (dtype == kP01Float16)
    return aligned ? launch<__half, true>(a, b, c, m, n, k, stream)
                   : launch<__half, false>(a, b, c, m, n, k, stream);
  return cudaErrorInvalidValue;
}
