// Small utilities shared by the GEMM kernel files (pure CUDA, no torch headers).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace p01 {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Map a linear block index to a (tile_m, tile_n) pair in groups of `group_m` tile rows, so that
// blocks running at the same time share A rows and B columns in L2 (the "grouped raster" order).
__device__ __forceinline__ void grouped_tile(int block, int tiles_m, int tiles_n, int group_m,
                                             int& tile_m, int& tile_n) {
  const int per_group = group_m * tiles_n;
  const int group = block / per_group;
  const int first_m = group * group_m;
  const int rows = min(tiles_m - first_m, group_m);
  const int in_group = block % per_group;
  tile_m = first_m + in_group % rows;
  tile_n = in_group / rows;
}

// True when a pointer can be read or written 16 bytes at a time.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace p01
