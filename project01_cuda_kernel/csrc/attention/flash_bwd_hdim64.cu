// FlashAttention-2 backward, head dim 64: 16 keys a warp, 8 warps (128 keys a CTA, the default)
// or 4 warps (64 keys), 64-row query steps.
// compile-check: no-spill
#include "attention/flash_bwd_kernel.cuh"

namespace flash {
cudaError_t flash_bwd_hdim64(const BwdParams& p, cudaStream_t stream) {
  if (p.warps == 8) return dispatch_bwd</*D=*/64, /*NWARPS=*/8>(p, stream);
  if (p.warps == 4) return dispatch_bwd</*D=*/64, /*NWARPS=*/4>(p, stream);
  return cudaErrorInvalidValue;
}
}  // namespace flash
