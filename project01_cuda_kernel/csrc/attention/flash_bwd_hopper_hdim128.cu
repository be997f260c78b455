// Hopper (sm_90a) FlashAttention backward, head dim 128: 1 producer + 2 consumer warpgroups, 128
// keys a CTA, 64-row query steps through a 2-stage TMA ring (see flash_bwd_hopper.cuh).
// compile-check: no-spill
#include "attention/flash_bwd_hopper.cuh"

namespace flash {
cudaError_t flash_bwd_hopper_hdim128(const BwdParams& p, cudaStream_t stream) {
  return hopper_bwd::dispatch_bwd_hopper</*D=*/128>(p, stream);
}
}  // namespace flash
