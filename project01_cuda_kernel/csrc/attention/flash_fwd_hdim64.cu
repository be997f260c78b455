// FlashAttention-2 forward, head dim 64, 4 warps. m_tiles_per_warp 2: 128 query rows per CTA
// (32 per warp), 64-key blocks, 48 KB shared. 1: 64 rows (16 per warp, Q in registers), 128-key
// blocks, 64 KB shared.
// compile-check: no-spill
#include "attention/flash_fwd_kernel.cuh"

namespace flash {
cudaError_t flash_fwd_hdim64(const FwdParams& p, cudaStream_t stream) {
  if (p.m_tiles_per_warp == 1) return dispatch_fwd</*D=*/64, /*NWARPS=*/4, /*MT=*/1, /*BN=*/128>(p, stream);
  if (p.m_tiles_per_warp == 2) return dispatch_fwd</*D=*/64, /*NWARPS=*/4, /*MT=*/2, /*BN=*/64>(p, stream);
  return cudaErrorInvalidValue;
}
}  // namespace flash
