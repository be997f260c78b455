// FlashAttention-2 forward, head dim 256: 8 warps, 16 query rows a warp (128 rows a CTA), Q
// re-read from shared memory, 32-key blocks, 128 KiB shared (Q 64 KiB + two K/V stages of
// 32 KiB). One variant: m_tiles_per_warp is ignored (32 rows a warp would need a 256-float O
// accumulator). See NOTES.md, "Head dim 256".
// compile-check: no-spill
#include "attention/flash_fwd_kernel.cuh"

namespace flash {
cudaError_t flash_fwd_hdim256(const FwdParams& p, cudaStream_t stream) {
  return dispatch_fwd</*D=*/256, /*NWARPS=*/8, /*MT=*/1, /*BN=*/32>(p, stream);
}
}  // namespace flash
