"""The library every capstone draws on.

- `shared.hardware`: GPU spec table (peak TFLOP/s per dtype, bandwidth, memory, prices; sourced
  and dated) and detection of the current GPU.
- `shared.timing`: one timing interface for GPU (events / do_bench, L2 flush) and CPU
  (torch.utils.benchmark).
- `shared.repeat`: headline figures as the median of repetitions interleaving ours and the
  baseline, with their min-max range.
- `shared.gpu_state`: the GPU's clocks, temperature, power and clock-event reasons from NVML.
- `shared.flops`: FLOP and byte counts; `shared.roofline`: roofline position and MFU.
- `shared.cost`: cost per token and per run, on-demand vs spot.
- `shared.testing`: helpers the tests share (the one-line argument-error contract of `shared.cli`).
- `shared.results`: environment capture, atomic JSON result files, Markdown tables.
- `shared.charts`: matplotlib charts readable in a README.
- `shared.model`: the Llama-style reference transformer with presets (`tiny`, `125m`, `1b`).
- `shared.fused_loss`: the output projection and the cross-entropy in chunks of tokens, without
  the (tokens, vocab) logits.
- `shared.data`: a deterministic, resumable synthetic token stream sharded by rank.
- `shared.distributed`: process-group set-up from torchrun variables, rank-aware logging.
- `shared.parallelize`: FSDP2 / activation checkpointing / torch.compile applied from outside.
- `shared.determinism`: deterministic mode (kernels, attention backends, NCCL and cuBLAS
  environment, seeds) for runs that must repeat bit for bit on GPUs.
- `shared.cli`: command lines that answer bad input with one `error:` line naming the argument
  (exit code 2, no traceback); checks of numbers, paths and environment variables.
- `shared.progress`: progress bars with rate and ETA (periodic lines in a log), `human_count`.
"""
