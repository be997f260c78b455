// FlashAttention-2 forward, head dim 128: 4 warps x 16 query rows, 64-key blocks, 64 KB shared.
// compile-check: no-spill
#include "attention/flash_fwd_kernel.cuh"

namespace flash {
cudaError_t flash_fwd_hdim128(const FwdParams& p, cudaStream_t stream) {
  return dispatch_fwd</*D=*/128, /*NWARPS=*/4, /*BN=*/64>(p, stream);
}
}  // namespace flash
