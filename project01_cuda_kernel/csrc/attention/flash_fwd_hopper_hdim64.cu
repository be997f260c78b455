// Hopper (sm_90a) FlashAttention forward, head dim 64: 1 producer + 3 consumer warpgroups, 192
// query rows and 128-key blocks per tile, a 4-stage K/V ring, persistent (see
// flash_fwd_hopper.cuh).
// compile-check: no-spill
#include "attention/flash_fwd_hopper.cuh"

namespace flash {
cudaError_t flash_fwd_hopper_hdim64(const FwdParams& p, cudaStream_t stream) {
  return hopper::dispatch_fwd_hopper</*D=*/64>(p, stream);
}
}  // namespace flash
