// Hopper (sm_90a) FlashAttention forward, head dim 128: 1 producer + 2 consumer warpgroups, 128
// query rows and 128-key blocks per tile, a 2-stage K/V ring, persistent (see
// flash_fwd_hopper.cuh).
// compile-check: no-spill
#include "attention/flash_fwd_hopper.cuh"

namespace flash {
cudaError_t flash_fwd_hopper_hdim128(const FwdParams& p, cudaStream_t stream) {
  return hopper::dispatch_fwd_hopper</*D=*/128>(p, stream);
}
}  // namespace flash
