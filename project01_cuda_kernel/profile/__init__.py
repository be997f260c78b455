"""Nsight Compute profiles of project01's kernels, each `run(config)` -> one JSON record:

- `gemm`: occupancy (theoretical, achieved, and what limits it), DRAM and SM throughput of every
  ladder kernel and of cuBLAS (`python -m project01_cuda_kernel profile-gemm`);
- `attention`: the same figures and tensor-pipe use for the FlashAttention kernels
  (`... profile-attention`);
- `ncu`: finding ncu, running it over a command (clocks left alone: --clock-control none) and
  reading its CSV, for both.
"""
