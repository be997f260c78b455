// FlashAttention-2 backward, head dim 128: 64 keys per CTA (4 warps x 16), 64-row query steps.
// compile-check: no-spill
#include "attention/flash_bwd_kernel.cuh"

namespace flash {
cudaError_t flash_bwd_hdim128(const BwdParams& p, cudaStream_t stream) {
  return dispatch_bwd</*D=*/128>(p, stream);
}
}  // namespace flash
