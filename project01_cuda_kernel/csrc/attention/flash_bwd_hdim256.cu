// FlashAttention-2 backward, head dim 256: 8 warps in pairs, 64 keys a CTA (each pair 16 keys,
// each warp of a pair half of D for dK, dV and half of a step's query rows for S^T, dP^T),
// 64-row query steps, one Q/dO stage, 147,968 bytes of shared memory. One variant: `warps`
// is ignored (4 warps cannot load a 256-column tile in 8-row passes). See NOTES.md, "Head dim
// 256".
// compile-check: no-spill
#include "attention/flash_bwd_kernel.cuh"

namespace flash {
cudaError_t flash_bwd_hdim256(const BwdParams& p, cudaStream_t stream) {
  return dispatch_bwd</*D=*/256, /*NWARPS=*/8>(p, stream);
}
}  // namespace flash
