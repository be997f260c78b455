// FlashAttention-2 forward, head dim 128, 4 warps. m_tiles_per_warp 2: 128 query rows per CTA
// (32 per warp), 32-key blocks (64-key blocks spill past 255 registers), 64 KB shared.
// 1: 64 rows (16 per warp, Q in registers), 64-key blocks, 64 KB shared.
// compile-check: no-spill
#include "attention/flash_fwd_kernel.cuh"

namespace flash {
cudaError_t flash_fwd_hdim128(const FwdParams& p, cudaStream_t stream) {
  if (p.m_tiles_per_warp == 1) return dispatch_fwd</*D=*/128, /*NWARPS=*/4, /*MT=*/1, /*BN=*/64>(p, stream);
  if (p.m_tiles_per_warp == 2) return dispatch_fwd</*D=*/128, /*NWARPS=*/4, /*MT=*/2, /*BN=*/32>(p, stream);
  return cudaErrorInvalidValue;
}
}  // namespace flash
