"""Tensor parallelism inside one model: which shard a rank holds and the two collectives.

Megatron's split, as nano-vllm lays it out: the fused QKV and gate|up projections are
column-parallel (each rank holds its heads, its KV heads and its slice of the FFN, so attention
and SwiGLU run on local data), o_proj and down_proj are row-parallel (each rank holds the input
columns matching its heads or FFN slice and produces a partial sum), so a layer needs one
all-reduce after the attention output projection and one after the MLP down projection. The
embedding and the LM head are vocab-parallel: each rank holds a contiguous block of vocabulary
rows; an embedding lookup is a masked local lookup plus an all-reduce, the logits an all-gather.
The KV cache of a rank holds only its KV heads.

`TensorParallel` is what a model is handed: rank, size and the process group its collectives
run on (None and size 1: a single process, every collective a no-op).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch


class CollectiveTimer:
    """Time spent in this rank's collectives while `enabled` (benchmarks): CUDA events around
    each on a GPU (read after a synchronize, so timing never stalls the stream), the host clock
    on the CPU. A rank's time includes waiting for the slowest rank to arrive."""

    def __init__(self) -> None:
        self.enabled = False
        self.reset()

    def reset(self) -> None:
        self.calls, self._host_s, self._events = 0, 0.0, []

    def run(self, fn, x: torch.Tensor) -> None:
        if not self.enabled:
            fn()
            return
        self.calls += 1
        if x.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            self._host_s += time.perf_counter() - t0

    def seconds(self) -> float:
        """Total time of the timed collectives so far."""
        if self._events:
            torch.cuda.synchronize()
        return self._host_s + sum(a.elapsed_time(b) for a, b in self._events) / 1e3


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: object | None = None  # torch.distributed ProcessGroup (gloo on CPU, NCCL on GPU)
    timer: CollectiveTimer = field(default_factory=CollectiveTimer, compare=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place (a partial product of a row-parallel projection)."""
        if self.size > 1:
            import torch.distributed as dist

            self.timer.run(lambda: dist.all_reduce(x, group=self.group), x)
        return x

    def all_gather_cols(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C) per rank -> (N, size * C), rank r's block at columns [r*C, (r+1)*C)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.timer.run(lambda: dist.all_gather(parts, x.contiguous(), group=self.group), x)
        return torch.cat(parts, dim=1)

    def span(self, total: int) -> slice:
        """This rank's contiguous share of `total` rows (total divisible by size)."""
        n = total // self.size
        return slice(self.rank * n, (self.rank + 1) * n)


SINGLE = TensorParallel()


def check_tensor_parallel(hf_config: dict, size: int, device_type: str) -> None:
    """Refuse a tensor-parallel size the model or the machine cannot split by, naming every
    reason in one ValueError."""
    if size == 1:
        return
    heads = hf_config.get("num_attention_heads", 0)
    kv = hf_config.get("num_key_value_heads") or heads
    ffn = hf_config.get("intermediate_size", 0)
    vocab = hf_config.get("vocab_size", 0)
    problems = []
    if size > kv:
        problems.append(
            f"it is larger than the model's {kv} KV heads (each rank needs a KV head of its own)"
        )
    for name, n in (("KV heads", kv), ("attention heads", heads)):
        if n % size:
            problems.append(f"it does not divide the {n} {name}")
    if ffn % size:
        problems.append(f"it does not divide the FFN width {ffn}")
    if vocab % size:
        problems.append(f"it does not divide the vocabulary of {vocab}")
    if device_type == "cuda":
        gpus = torch.cuda.device_count()
        if size > gpus:
            problems.append(f"this machine has {gpus} CUDA GPU(s), one per rank is needed")
    if problems:
        raise ValueError(f"EngineArgs.tensor_parallel_size {size}: " + "; ".join(problems))


def shard_config(cfg, size: int):
    """A LlamaConfig with one rank's heads, KV heads and FFN slice (vocabulary unchanged: the
    model splits its embedding itself)."""
    if size == 1:
        return cfg
    return replace(
        cfg,
        num_attention_heads=cfg.num_attention_heads // size,
        num_key_value_heads=cfg.num_key_value_heads // size,
        intermediate_size=cfg.intermediate_size // size,
    )


def vocab_parallel_embedding(
    ids: torch.Tensor, weight: torch.Tensor, tp: TensorParallel
) -> torch.Tensor:
    """ids (T,) -> (T, hidden): each rank looks up the ids in its vocabulary block, zeros the
    rest, and the all-reduce sums the one non-zero row per token (exact in any dtype)."""
    import torch.nn.functional as F

    if tp.size == 1:
        return F.embedding(ids, weight)
    rows = weight.shape[0]
    local = ids - tp.rank * rows
    inside = (local >= 0) & (local < rows)
    x = F.embedding(local.clamp(0, rows - 1), weight) * inside.unsqueeze(1).to(weight.dtype)
    return tp.all_reduce(x)
