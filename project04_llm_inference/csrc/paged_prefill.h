// Launcher of paged_prefill.cu (torch-free, so the kernel compiles with nvcc alone); the PyTorch
// binding is paged_prefill_binding.cpp.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

namespace p04 {

struct PrefillParams {
  const void* q;  // (T, Hq, D), strides q_tok_stride, q_head_stride (elements), unit along D
  void* o;        // (T, Hq, D), same layout rules
  const void* k_cache;  // (num_blocks, block_size, Hkv, D), contiguous
  const void* v_cache;
  const int* block_tables;  // (N, max_blocks), row stride bt_stride
  const int* cu_seqlens_q;  // (N + 1,)
  const int* context_lens;  // (N,)
  int64_t q_tok_stride, q_head_stride, o_tok_stride, o_head_stride;
  int64_t slot_stride;  // elements from one cache slot (token) to the next: Hkv * D
  int bt_stride;
  int max_blocks;
  int num_seqs;
  int group;  // G = Hq / Hkv
  int log2_block_size;
  float softmax_scale;
};

// An FP8 cache's launch: the same parameters and the KV heads' scales (a struct of its own, so
// the 16-bit kernels' parameters, and their code, stay as they were).
struct PrefillFp8Params : PrefillParams {
  const float* k_scale;  // (Hkv,)
  const float* v_scale;
};

// Launch on `stream`: grid (upper bound on the query tiles, n_kv_heads). total_rows = T * G, the
// packed (token, head-in-group) rows of the whole batch. k_scale / v_scale non-null: k_cache and
// v_cache hold float8_e4m3fn with these per-KV-head scales. Returns the launch's error, if any.
cudaError_t launch_paged_prefill(const PrefillParams& p, const float* k_scale,
                                 const float* v_scale, bool fp16, int head_dim,
                                 int64_t total_rows, int n_kv_heads, cudaStream_t stream);

}  // namespace p04
