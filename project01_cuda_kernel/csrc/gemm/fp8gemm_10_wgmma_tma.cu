// Step 10: FP8 on Hopper (sm_90a). C = (scale_a A) (scale_b B)^T with A (M, K) and B (N, K)
// float8 e4m3, both row-major, scale_a and scale_b float32 scalars in device memory, C (M, N)
// bfloat16: torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16). What changes
// from step 9:
// - Operands: FP8 wgmma reads both operands K-major only (no transpose), so B comes as (N, K),
//   the layout of an nn.Linear weight. One byte per element: a 128-byte swizzled TMA row holds
//   128 values of K, and one wgmma m64n128k32 consumes 32 of them (the 32 bytes of step 9's
//   k16), so the shared-memory descriptors advance exactly as step 9's K-major A does.
// - Two-level accumulation: the tensor cores' FP8 accumulation keeps fewer bits than float32,
//   so each 128-wide k-tile (4 instructions, the first with scale-d = 0) goes into a fresh set of
//   wgmma accumulators that are then added into float32 registers ("promotion" every 128 of K,
//   as cuBLAS does unless fast accumulation is asked for). Two such sets alternate, so the next
//   k-tile is issued before the last one is added: a consumer warpgroup holds its 64x128 of C
//   three times (3 x 64 floats a thread), hence the 128x128 tile (step 9's 64x256 per
//   warpgroup would need 384 registers). P01_FP8_PROMOTE=serial picks the instance that waits
//   for each k-tile before issuing the next, for A/B runs.
// - Epilogue: C = scale_a * scale_b * acc, rounded to bfloat16, stored from registers with a
//   predicate on each row and column: any M and N (odd N stores element by element).
// Kept from step 9: one producer thread issuing TMA copies into a ring of full/empty mbarriers
// (6 stages of 32 KB), two consumer warpgroups (setmaxnreg moves registers to them), and one CTA
// per SM walking the tiles in grouped raster order, the pipeline running across tiles.
// Requirements (TMA's): 16-byte aligned base pointers and K % 16 == 0 (the row stride is K
// bytes); M and N edges are zero-filled by TMA and masked in the epilogue.
// compile-check: no-spill
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "common/fp8.cuh"
#include "common/sm90.cuh"
#include "common/wgmma.cuh"
#include "gemm.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define P01_SM90A 1
#endif

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 128, kStages = 6;  // kBK in elements = bytes
constexpr int kConsumers = 2;                                  // consumer warpgroups, 64 rows each
constexpr int kThreads = 128 * (1 + kConsumers);               // 384
constexpr int kABytes = kBM * kBK;                             // 16 KB: one TMA box
constexpr int kBBytes = kBN * kBK;                             // 16 KB: one TMA box
constexpr int kStageBytes = kABytes + kBBytes;                 // 32 KB
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 2 * kStages * 8;  // + align + barriers
[[maybe_unused]] constexpr int kGroupM = 8;
constexpr int kAcc = kBN / 2;  // float accumulators a thread holds for 64 x kBN

using namespace p01::sm90;  // mbarrier, TMA and wgmma wrappers (common/sm90.cuh, fp8.cuh)

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// kOverlap: two k-tiles in flight per consumer warpgroup (the default); false: each k-tile is
// waited for and promoted before the next is issued (the first form, kept for A/B runs and as a
// cross-check: both add the same groups in the same order, so their outputs are bitwise equal).
template <bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    fp8gemm_wgmma_kernel(const __grid_constant__ CUtensorMap tma_a,
                         const __grid_constant__ CUtensorMap tma_b,
                         const float* __restrict__ scale_a, const float* __restrict__ scale_b,
                         __nv_bfloat16* __restrict__ c, int m, int n, int k) {
#ifdef P01_SM90A
  extern __shared__ unsigned char smem_raw[];
  // TMA's 128-byte swizzle repeats every 1024 bytes: stage buffers start 1024-aligned.
  unsigned char* tiles = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&full[s]), 1);                  // the producer's expect_tx arrive
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
    if (threadIdx.x == 0) {
      int it = 0;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        int tm, tn;
        p01::grouped_tile(tile, tiles_m, tiles_n, kGroupM, tm, tn);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % kStages;
          const uint32_t phase = (it / kStages) & 1;
          mbar_wait(smem_u32(&empty[s]), phase ^ 1);  // first round passes at once
          const uint32_t bar = smem_u32(&full[s]);
          mbar_expect_tx(bar, kStageBytes);  // out-of-bounds bytes are counted (zero-filled)
          unsigned char* st = tiles + s * kStageBytes;
          tma_load_2d(smem_u32(st), &tma_a, kt * kBK, tm * kBM, bar);
          tma_load_2d(smem_u32(st + kABytes), &tma_b, kt * kBK, tn * kBN, bar);
        }
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int cw = wg - 1;  // rows cw*64 .. cw*64+63 of each tile
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const float scale = scale_a[0] * scale_b[0];
    float acc[kAcc];  // float32 sums over the promoted k-tiles
    float p0[kAcc], p1[kAcc];  // wgmma accumulators of two k-tiles (p1 with kOverlap only)
    int it = 0;  // k-tiles started before this tile (the ring position)

    // Wait for k-tile kt of this tile, then issue its four wgmma into p (the first with
    // scale-d = 0, so p starts from zero) as one commit group.
    auto issue = [&](float (&p)[kAcc], int kt) {
      const int s = (it + kt) % kStages;
      mbar_wait(smem_u32(&full[s]), ((it + kt) / kStages) & 1);
      // Both operands K-major, 128-byte rows: +32 bytes per k32 inside the swizzled rows.
      const uint32_t a_base = smem_u32(tiles + s * kStageBytes + cw * 64 * kBK);
      const uint32_t b_base = smem_u32(tiles + s * kStageBytes + kABytes);
      wgmma_fence();
      fence_regs(p);
#pragma unroll
      for (int kk = 0; kk < kBK / 32; ++kk) {
        const uint64_t da = make_desc(a_base + kk * 32, 16, 1024);
        const uint64_t db = make_desc(b_base + kk * 32, 16, 1024);
        wgmma_ss_m64n128k32_e4m3(p, da, db, kk > 0);
      }
      wgmma_commit();
    };
    // After a wgmma_wait that covers k-tile kt: free its stage, add p into acc in float32.
    auto promote = [&](float (&p)[kAcc], int kt) {
      fence_regs(p);
      mbar_arrive(smem_u32(&empty[(it + kt) % kStages]));
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] += p[i];
    };

    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      int tm, tn;
      p01::grouped_tile(tile, tiles_m, tiles_n, kGroupM, tm, tn);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
      if constexpr (kOverlap) {
        // Two k-tiles in flight: k-tile kt is issued before k-tile kt - 1 is promoted, so the
        // tensor cores have the next group while this warpgroup adds the last one.
        // k-tile kt goes to p0 when kt is even, p1 when odd.
        issue(p0, 0);
        int kt = 1;
        for (; kt + 1 < k_tiles; kt += 2) {
          issue(p1, kt);
          wgmma_wait<1>();  // k-tile kt - 1 (p0) is done
          promote(p0, kt - 1);
          issue(p0, kt + 1);
          wgmma_wait<1>();  // k-tile kt (p1) is done
          promote(p1, kt);
        }
        if (kt < k_tiles) {  // one k-tile left to issue (kt = k_tiles - 1, odd)
          issue(p1, kt);
          wgmma_wait<1>();
          promote(p0, kt - 1);
          wgmma_wait<0>();
          promote(p1, kt);
        } else {  // the last k-tile (kt - 1, even) is in p0
          wgmma_wait<0>();
          promote(p0, kt - 1);
        }
      } else {
        for (int kt = 0; kt < k_tiles; ++kt) {
          issue(p0, kt);
          wgmma_wait<0>();
          promote(p0, kt);
        }
      }
      it += k_tiles;

      // Epilogue: warp w holds rows 16w + lane/4 (+8); accumulators 4j..4j+3 cover columns
      // 8j + 2*(lane%4) (+1). With N even a pair is one aligned 4-byte store (it never
      // straddles the edge); with N odd each element is stored on its own.
      const int row0 = tm * kBM + cw * 64 + warp * 16 + lane / 4;
      const int col0 = tn * kBN + (lane % 4) * 2;
      const bool pairs = (n & 1) == 0;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const int col = col0 + j * 8;
        if (col >= n) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row0 + 8 * h;
          if (row >= m) continue;
          const float lo = acc[4 * j + 2 * h] * scale, hi = acc[4 * j + 2 * h + 1] * scale;
          __nv_bfloat16* dst = c + row * n + col;
          if (pairs) {
            *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(lo, hi);
          } else {
            dst[0] = __float2bfloat16_rn(lo);
            if (col + 1 < n) dst[1] = __float2bfloat16_rn(hi);
          }
        }
      }
    }
  }
#else
  // Built for an architecture without wgmma/TMA: the host launcher never starts this.
  __trap();
#endif
}

// A row-major (rows, k) float8 matrix read in boxes of 128 rows x 128 bytes, 128-byte swizzled.
bool make_map(CUtensorMap* map, const void* ptr, int rows, int k, int box_rows) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};  // bytes: one byte an element
  const cuuint32_t box[2] = {kBK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(ptr), dims,
                            strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // NONE: out of bounds reads 0
  return r == CUDA_SUCCESS;
}

// Two k-tiles in flight (the default) or, with P01_FP8_PROMOTE=serial in the environment, one
// (the first form, kept for A/B runs).
bool fp8_promote_serial() {
  const char* v = std::getenv("P01_FP8_PROMOTE");
  return v != nullptr && std::strcmp(v, "serial") == 0;
}

}  // namespace

cudaError_t fp8gemm_10_wgmma_tma(const void* a, const void* b, const float* scale_a,
                                 const float* scale_b, void* c, int m, int n, int k,
                                 cudaStream_t stream) {
  int device = 0, major = 0, minor = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) return err;
  if (major != 9 || minor != 0) return cudaErrorNotSupported;
  if (m < 1 || n < 1 || k < 1 || k % 16 != 0 || !p01::aligned16(a) || !p01::aligned16(b) ||
      (reinterpret_cast<uintptr_t>(c) & 3u) != 0)
    return cudaErrorInvalidValue;
  CUtensorMap map_a, map_b;
  if (!make_map(&map_a, a, m, k, kBM) || !make_map(&map_b, b, n, k, kBN))
    return cudaErrorInvalidValue;
  auto kernel = fp8_promote_serial() ? fp8gemm_wgmma_kernel<false> : fp8gemm_wgmma_kernel<true>;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const int tiles = p01::ceil_div(m, kBM) * p01::ceil_div(n, kBN);
  kernel<<<tiles < sms ? tiles : sms, kThreads, kSmemBytes, stream>>>(
      map_a, map_b, scale_a, scale_b, static_cast<__nv_bfloat16*>(c), m, n, k);
  return cudaGetLastError();
}
