// Step 9: Hopper (sm_90a). What changes from step 8:
// - TMA: one thread issues cp.async.bulk.tensor copies of whole tiles (A 128x64, B 64x256) into
//   shared memory, 128-byte swizzled, completing on an mbarrier with a byte count. No address
//   arithmetic or bounds checks in the main loop: the copy engine zero-fills outside the tensor.
// - wgmma: a warpgroup (4 warps) multiplies 64x256x16 per instruction straight out of shared
//   memory (matrix descriptors), asynchronously; no ldmatrix, no fragments in registers for A/B.
// - Warp specialisation: warpgroup 0 is the producer (one thread drives TMA; setmaxnreg gives its
//   registers away), warpgroups 1 and 2 are consumers (64 rows each of a 128x256 tile, 128
//   float32 accumulators per thread). A 4-stage ring of full/empty mbarriers connects them.
// - Persistent tile scheduling: one CTA per SM walks the tiles (grouped raster order) with the
//   pipeline running across tile boundaries, so the next tile's loads overlap this one's
//   epilogue, and there is no tail of launches.
// Structure: `producer` (the TMA loads), `consumer_mainloop` (one tile's k-tiles into the
// accumulators) and `epilogue` (the tile's stores), called from a kernel body that only
// specialises the warpgroups; the split left the machine code the same (sass-diff, sm_90a).
// Requirements (TMA's): 16-byte aligned base pointers and row strides, i.e. K % 8 == 0 and
// N % 8 == 0; the Python wrapper pads other shapes. M, N, K edges are zero-filled by TMA and
// masked in the epilogue.
// compile-check: no-spill
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"
#include "common/sm90.cuh"
#include "common/wgmma.cuh"
#include "gemm.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define P01_SM90A 1
#endif

namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 4;
constexpr int kConsumers = 2;                     // consumer warpgroups, 64 rows each
constexpr int kThreads = 128 * (1 + kConsumers);  // 384
constexpr int kABytes = kBM * kBK * 2;            // 16 KB
[[maybe_unused]] constexpr int kBBoxBytes = kBK * 64 * 2;          // one 64(k) x 64(n) TMA box: 8 KB
constexpr int kBBytes = kBK * kBN * 2;            // 32 KB (4 boxes)
constexpr int kStageBytes = kABytes + kBBytes;    // 48 KB
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 2 * kStages * 8;  // + align + barriers
[[maybe_unused]] constexpr int kGroupM = 8;

using namespace p01::sm90;  // mbarrier, TMA and wgmma wrappers (common/sm90.cuh, wgmma.cuh)

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- producer -----------------------------------------------------------------------------------
// One thread of warpgroup 0 walks the CTA's tiles and issues every copy: for each k-tile, once its
// stage is free, A (128 x 64) and B (64 x 256, four 64-column boxes) into the stage, completing
// on the stage's full barrier.
__device__ __forceinline__ void producer(unsigned char* tiles, uint64_t* full, uint64_t* empty,
                                         const CUtensorMap* tma_a, const CUtensorMap* tma_b,
                                         int tiles_m, int tiles_n, int num_tiles, int k_tiles) {
  int it = 0;
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    int tm, tn;
    p01::grouped_tile(tile, tiles_m, tiles_n, kGroupM, tm, tn);
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      const uint32_t phase = (it / kStages) & 1;
      mbar_wait(smem_u32(&empty[s]), phase ^ 1);  // first round passes at once
      const uint32_t bar = smem_u32(&full[s]);
      mbar_expect_tx(bar, kStageBytes);
      unsigned char* st = tiles + s * kStageBytes;
      tma_load_2d(smem_u32(st), tma_a, kt * kBK, tm * kBM, bar);
#pragma unroll
      for (int j = 0; j < kBN / 64; ++j)
        tma_load_2d(smem_u32(st + kABytes + j * kBBoxBytes), tma_b, tn * kBN + j * 64, kt * kBK,
                    bar);
    }
  }
}

// ---- consumer: the main loop --------------------------------------------------------------------
// One tile's k-tiles into acc (rows cw*64 .. cw*64+63 of the tile, 64 x 256 float32 over the
// warpgroup): each stage's wgmmas are issued, then the previous stage is released once its
// wgmmas are done reading it; `it` counts stages across tiles (the ring runs across them).
template <typename T>
__device__ __forceinline__ void consumer_mainloop(unsigned char* tiles, uint64_t* full,
                                                  uint64_t* empty, int cw, int k_tiles, int& it,
                                                  float (&acc)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  fence_regs(acc);
  for (int kt = 0; kt < k_tiles; ++kt, ++it) {
    const int s = it % kStages;
    mbar_wait(smem_u32(&full[s]), (it / kStages) & 1);
    const uint32_t a_base = smem_u32(tiles + s * kStageBytes + cw * 64 * 128);
    const uint32_t b_base = smem_u32(tiles + s * kStageBytes + kABytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // A: +32 bytes per k16 inside the swizzled 128-byte rows; B: +16 k-rows of 128 bytes.
      const uint64_t da = make_desc(a_base + kk * 32, 16, 1024);
      const uint64_t db = make_desc(b_base + kk * 16 * 128, kBBoxBytes, 1024);
      wgmma_ss_m64nNk16_kn<T, kBN>(acc, da, db, 1);
    }
    wgmma_commit();
    fence_regs(acc);
    if (kt > 0) {
      wgmma_wait<1>();  // the previous k-tile's MMAs are done reading their stage
      mbar_arrive(smem_u32(&empty[(it - 1) % kStages]));
    }
  }
  wgmma_wait<0>();
  fence_regs(acc);
  mbar_arrive(smem_u32(&empty[(it - 1) % kStages]));
}

// ---- consumer: the epilogue ---------------------------------------------------------------------
// Straight from registers: warp w holds rows 16w + lane/4 (+8); accumulator 4j..4j+3 covers
// columns 8j + 2*(lane%4) (+1). N % 8 == 0, so a pair never straddles the edge.
template <typename T>
__device__ __forceinline__ void epilogue(T* __restrict__ c, int m, int n, int tm, int tn, int cw,
                                         int warp, int lane, const float (&acc)[128]) {
  const int row0 = tm * kBM + cw * 64 + warp * 16 + lane / 4;
  const int col0 = tn * kBN + (lane % 4) * 2;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = col0 + j * 8;
    if (col >= n) break;
    if (row0 < m)
      *reinterpret_cast<uint32_t*>(c + row0 * n + col) = pack2<T>(acc[4 * j], acc[4 * j + 1]);
    if (row0 + 8 < m)
      *reinterpret_cast<uint32_t*>(c + (row0 + 8) * n + col) =
          pack2<T>(acc[4 * j + 2], acc[4 * j + 3]);
  }
}

// ---- the kernel ---------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    hgemm_wgmma_kernel(const __grid_constant__ CUtensorMap tma_a,
                       const __grid_constant__ CUtensorMap tma_b, T* __restrict__ c, int m,
                       int n, int k) {
#ifdef P01_SM90A
  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle repeats every 1024 bytes: stage buffers start 1024-aligned.
  unsigned char* tiles = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&full[s]), 1);                   // the producer's expect_tx arrive
      mbar_init(smem_u32(&empty[s]), kConsumers * 128);  // every consumer thread
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  const int tiles_m = p01::ceil_div(m, kBM), tiles_n = p01::ceil_div(n, kBN);
  const int num_tiles = tiles_m * tiles_n;
  const int k_tiles = p01::ceil_div(k, kBK);
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    // Producer warpgroup: 40 registers are plenty for one thread issuing copies.
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0)
      producer(tiles, full, empty, &tma_a, &tma_b, tiles_m, tiles_n, num_tiles, k_tiles);
  } else {
    setmaxnreg_inc<232>();
    const int cw = wg - 1;  // rows cw*64 .. cw*64+63 of each tile
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    float acc[128];
    int it = 0;
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      int tm, tn;
      p01::grouped_tile(tile, tiles_m, tiles_n, kGroupM, tm, tn);
      consumer_mainloop<T>(tiles, full, empty, cw, k_tiles, it, acc);
      epilogue<T>(c, m, n, tm, tn, cw, warp, lane, acc);
    }
  }
#else
  // Built for an architecture without wgmma/TMA: the host launcher never starts this.
  __trap();
#endif
}

// A row-major (rows, cols) matrix read in boxes of box_rows x 64 columns, 128-byte swizzled.
bool make_map(CUtensorMap* map, const void* ptr, int rows, int cols, int box_rows, int dtype) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};  // bytes
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(
      map, dtype == kP01BFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      2, const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // NONE: out-of-bounds elements read as zero
  return r == CUDA_SUCCESS;
}

template <typename T>
cudaError_t launch(const void* a, const void* b, void* c, int m, int n, int k, int dtype,
                   cudaStream_t stream) {
  CUtensorMap map_a, map_b;
  if (!make_map(&map_a, a, m, k, kBM, dtype) || !make_map(&map_b, b, k, n, kBK, dtype))
    return cudaErrorInvalidValue;
  auto kernel = hgemm_wgmma_kernel<T>;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const int tiles = p01::ceil_div(m, kBM) * p01::ceil_div(n, kBN);
  kernel<<<tiles < sms ? tiles : sms, kThreads, kSmemBytes, stream>>>(map_a, map_b,
                                                                     static_cast<T*>(c), m, n, k);
  return cudaGetLastError();
}

}  // namespace

cudaError_t hgemm_09_wgmma_tma(const void* a, const void* b, void* c, int m, int n, int k,
                               int dtype, cudaStream_t stream) {
  int device = 0, major = 0, minor = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (major != 9 || minor != 0) return cudaErrorNotSupported;
  if (k % 8 != 0 || n % 8 != 0 || !p01::aligned16(a) || !p01::aligned16(b) || !p01::aligned16(c))
    return cudaErrorInvalidValue;
  if (dtype == kP01BFloat16) return launch<__nv_bfloat16>(a, b, c, m, n, k, dtype, stream);
  if (dtype == kP01Float16) return launch<__half>(a, b, c, m, n, k, dtype, stream);
  return cudaErrorInvalidValue;
}
