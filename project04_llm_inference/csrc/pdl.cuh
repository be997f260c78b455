// Programmatic dependent launch (PDL, sm_90 and newer) for the kernels of a decode step.
//
// A decode step at batch 1 is a chain of short kernels, each waiting for the one before. Between
// two of them the GPU idles for the launch of the second and for the ramp of its first loads.
// With PDL a kernel launched with `launch(..., pdl = true)` may start as soon as every CTA of the
// kernel before it has called `allow_next_kernel()`; it then does what does not depend on that
// kernel (the GEMV issues its first weight loads) and calls `wait_previous_kernel()`, which
// returns once the previous grid has completed and its writes are visible. Everything a kernel
// reads that an earlier kernel wrote must come after that wait.
//
// On older GPUs and in a normal launch both calls are no-ops and the launch is an ordinary one.
// CUDA graphs keep the dependency (stream capture records a programmatic edge).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace p04 {

__device__ __forceinline__ void wait_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when pdl is true.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace p04
