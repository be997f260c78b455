"""Pipeline parallelism with `torch.distributed.pipelining`: the shared transformer cut into
stages of consecutive blocks, driven by GPipe, 1F1B or interleaved 1F1B.

A stage is a `StageModule` built from outside the model: it holds references to the model's own
submodules (the embedding on the first stage, the final norm and the head on the last), keyed so
that its parameter names are the model's (`layers.5.attention.wqkv.weight`): checkpoints and
parameter comparisons need no renaming. With v stages per rank (interleaved 1F1B), rank r of p
holds stages r, r + p, ..., r + (v - 1) p (the looped placement the schedule expects).

The bubble: with m micro-batches over p ranks, GPipe and 1F1B leave each rank idle for
(p - 1) forward+backward slots out of m + p - 1, a share of (p - 1) / (m + p - 1); interleaving
v stages per rank makes each slot v times shorter: (p - 1) / (v m + p - 1). `BusyTimer`
measures it: the time a rank spends inside its stages' forward and backward chunks, against the
step's wall time (the rest is bubble plus point-to-point waits).
"""

from __future__ import annotations

import time

import torch
from torch import nn

SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
}


def bubble_formula(pp: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """The idle share of a rank's step: (p - 1) / (v m + p - 1)."""
    return (pp - 1) / (stages_per_rank * microbatches + pp - 1)


def split_layers(n_layers: int, n_stages: int) -> list[list[int]]:
    """Consecutive blocks per stage, as even as the count allows (earlier stages one more)."""
    if n_stages > n_layers:
        raise ValueError(f"{n_stages} pipeline stages need >= {n_stages} blocks, got {n_layers}")
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        n = base + (s < extra)
        out.append(list(range(start, start + n)))
        start += n
    return out


class StageModule(nn.Module):
    """Blocks `layer_ids` of `model`, with its embedding when first and its norm and head when
    last. forward: tokens (B, S) int64 or hidden (B, S, d) -> hidden, or logits on the last."""

    def __init__(self, model: nn.Module, layer_ids: list[int], *, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.attn_fn = model.attn_fn
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layer_ids})
        self.norm = model.norm if last else None
        self.output = model.output if last else None
        self.register_buffer("rope_cos", model.rope_cos, persistent=False)
        self.register_buffer("rope_sin", model.rope_sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.first else x
        S = h.shape[1]
        cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        for layer in self.layers.values():
            h = layer(h, cos, sin, self.attn_fn)
        if self.last:
            h = self.output(self.norm(h))
        return h


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """The looped placement: rank r holds stages r, r + p, ..."""
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def build_stage_modules(model: nn.Module, pp_rank: int, pp: int, v: int) -> list[StageModule]:
    parts = split_layers(len(model.layers), pp * v)
    n = pp * v
    return [
        StageModule(model, parts[s], first=s == 0, last=s == n - 1)
        for s in stage_ids(pp_rank, pp, v)
    ]


def build_schedule(
    modules: list[StageModule],
    ids: list[int],
    *,
    n_stages: int,
    pp_group,
    device: torch.device,
    schedule: str,
    microbatches: int,
    loss_fn,
):
    """The stages of this rank and the schedule that drives them."""
    from torch.distributed import pipelining

    stages = [
        pipelining.PipelineStage(m, i, n_stages, device, group=pp_group)
        for m, i in zip(modules, ids)
    ]
    cls = getattr(pipelining, SCHEDULES[schedule])
    if schedule == "interleaved-1f1b":
        return stages, cls(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    return stages, cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)


class BusyTimer:
    """Wall time this rank spends inside its stages' forward and backward chunks (the schedule's
    own calls, wrapped per stage instance); `busy` is reset each step by the caller. On a GPU
    each chunk is bracketed by device synchronisations, so its kernels are counted, not only
    their launches."""

    def __init__(self, stages, device: torch.device) -> None:
        self.busy = 0.0
        self.cuda = device.type == "cuda"
        for stage in stages:
            for name in ("forward_one_chunk", "backward_one_chunk"):
                setattr(stage, name, self._timed(getattr(stage, name)))

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            if self.cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.cuda:
                    torch.cuda.synchronize()
                self.busy += time.perf_counter() - t

        return wrapper
