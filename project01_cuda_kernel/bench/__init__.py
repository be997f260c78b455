"""project01's experiments, each `run(config)` -> one JSON record with its environment:

- `gemm`: the matmul ladder against cuBLAS (`python -m project01_cuda_kernel bench-gemm`);
- `attention`: FlashAttention against SDPA's backends (`... bench-attention`).

Their tables and charts are rendered from those records by `project01_cuda_kernel.report`.
"""
