"""project01's experiments, each `run(config)` -> one JSON record with its environment:

- `gemm`: the matmul ladder against cuBLAS (`python -m project01_cuda_kernel bench-gemm`);
- `attention`: FlashAttention against SDPA's backends (`... bench-attention`);
- `interleaved`: what both share: each shape timed `--repeats` times (default 5), ours and its
  baselines alternating, every figure recorded as its median with the min-max range.

Their tables and charts are rendered from those records by `project01_cuda_kernel.report`.
"""
