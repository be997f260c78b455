"""A parallel layout applied to a plain model: what the one training loop drives.

`apply_layout` takes the CPU-built `shared.model.Transformer` and returns a `Parallelized`:
the modules this rank trains (`parts`), the mesh, and the few calls where strategies differ:
gradient-sync control across micro-batches, the loss context (loss parallel), one pipeline step,
the global gradient norm, and the full parameters (gathered, in the model's own names and
layout). Everything else in the loop (data, optimizer, schedule of the learning rate, logging,
records) is the same for every strategy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from project02_fsdp_scaling.parallel import pipeline, tp
from project02_fsdp_scaling.parallel.mesh import MeshInfo, build_mesh


@dataclass
class Parallelized:
    model: nn.Module  # the model as wrapped (DDP, FSDP, TP); for a pipeline, the plain model
    parts: list[nn.Module]  # what this rank trains: [model] or its pipeline stages
    mesh: MeshInfo
    strategy: str
    autocast: torch.dtype | None = None  # bf16 without FSDP's mixed precision
    schedule: object = None  # a torch.distributed.pipelining schedule
    has_first: bool = True  # this rank feeds tokens (pipeline: holds stage 0)
    has_last: bool = True  # this rank computes a loss (pipeline: holds the last stage)
    timer: pipeline.BusyTimer | None = None
    qkv: dict = field(default_factory=dict)  # TP: {qkv weight name: (split, tp)}

    # ---- what differs between strategies -------------------------------------------------
    @property
    def uses_fsdp(self) -> bool:
        return self.strategy in ("fsdp", "fsdp-tp", "pp-fsdp")

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's parameters under the model's own names (wrapper prefixes removed)."""
        out, seen = [], set()
        for part in self.parts:
            for name, p in part.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((canonical_name(name), p))
        return out

    def param_container(self) -> nn.Module:
        """One module whose parameters are this rank's, under the model's names: what the
        optimizer and the checkpoint's state dicts are built from."""
        if len(self.parts) == 1:
            return self.parts[0]
        return _RankModule(self.parts)

    def set_grad_sync(self, sync: bool) -> None:
        """Reduce gradients at the end of this micro-batch's backward, or keep accumulating."""
        if self.strategy == "ddp":
            self.model.require_backward_grad_sync = sync
        elif self.uses_fsdp:
            self.model.set_requires_gradient_sync(sync)

    def compute_context(self) -> contextlib.AbstractContextManager:
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.mesh.mesh.device_type, dtype=self.autocast)

    def loss_context(self) -> contextlib.AbstractContextManager:
        return tp.loss_context(self.model)

    def pipeline_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of every micro-batch through the schedule; the mean loss of the
        batch on ranks holding the last stage, else None."""
        losses: list[torch.Tensor] = []
        args = (x,) if self.has_first else ()
        kwargs = {"target": y, "losses": losses} if self.has_last else {}
        with self.compute_context():
            self.schedule.step(*args, **kwargs)
        if not self.has_last:
            return None
        return torch.stack([loss.detach().double() for loss in losses]).mean()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The global gradient norm (over shards, tensor-parallel slices and pipeline stages),
        clipped to max_norm when max_norm > 0; returns the norm before clipping."""
        from torch.distributed.tensor import DTensor

        params = [p for _, p in self.named_parameters()]
        grads = [p.grad for p in params if p.grad is not None]
        # One norm per placement group: foreach over DTensors needs a common placement.
        groups: dict = {}
        for g in grads:
            key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else None
            groups.setdefault(key, []).append(g)
        sq = torch.zeros((), dtype=torch.float64, device=grads[0].device)
        for gs in groups.values():
            n = torch.nn.utils.get_total_norm(gs, norm_type=2.0, foreach=True)
            if isinstance(n, DTensor):
                n = n.full_tensor()
            sq = sq + n.double() ** 2
        pp = self.mesh.sub("pp")
        if pp is not None:  # each stage's parameters live on its own ranks
            dist.all_reduce(sq, group=pp.get_group())
        total = sq.sqrt()
        if max_norm > 0:
            dtype = grads[0].dtype
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.to(dtype), foreach=True)
        return total

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter of the model gathered in full on every rank, float32 (float64 when
        trained in float64), on the CPU, in the model's names and [q | k | v] layout (a
        collective: call on all ranks)."""
        from torch.distributed.tensor import DTensor

        local = {}
        for name, p in self.named_parameters():
            t = p.full_tensor() if isinstance(p, DTensor) else p
            t = t.detach().to(torch.promote_types(t.dtype, torch.float32)).cpu()
            if name in self.qkv:
                t = tp.canonical_qkv(t, *self.qkv[name])
            local[name] = t
        if self.mesh.sub("pp") is None:
            return local
        gathered: list[dict] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        return {k: v for part in gathered for k, v in part.items()}


class _RankModule(nn.Module):
    """The union of a rank's pipeline stages, under the model's parameter names."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        for part in parts:
            for name in ("tok_embeddings", "norm", "output"):
                if getattr(part, name, None) is not None:
                    setattr(self, name, getattr(part, name))
            self.layers.update(part.layers)


def canonical_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP, checkpoint wrapper, compile)."""
    name = name.removeprefix("module.")
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name


def apply_layout(
    model: nn.Module,
    layout,
    device: torch.device,
    *,
    param_dtype: str | None,
    fsdp: Callable[[nn.Module, object], nn.Module],
    loss_fn: Callable | None = None,
    compile_blocks: Callable[[nn.Module], None] | None = None,
    checkpoint_blocks: Callable[[nn.Module], None] | None = None,
) -> Parallelized:
    """Apply `layout` (a `ParallelLayout`) to the plain CPU `model` in place.

    fsdp(module, dp_mesh): the FSDP2 wrapping of the caller (its mixed precision and resharding
    settings); param_dtype: the recipe's compute dtype ("bfloat16" turns on autocast where no
    FSDP mixed precision runs); loss_fn(logits, targets): the pipeline's loss;
    compile_blocks / checkpoint_blocks: torch.compile and activation checkpointing of the blocks,
    applied before any wrapping (the torchtitan order)."""
    world = dist.get_world_size()
    degrees = layout.degrees(world)
    name = layout.parallel
    keep = ("tp",) if layout.uses_tp() else ("pp",) if layout.uses_pipeline() else ()
    mesh = build_mesh(device.type, degrees, keep)
    autocast = torch.bfloat16 if param_dtype == "bfloat16" and name in ("ddp", "tp", "pp") else None
    if checkpoint_blocks is not None:
        checkpoint_blocks(model)
    if compile_blocks is not None:
        compile_blocks(model)

    if name == "fsdp":
        fsdp(model, mesh.sub("dp"))
        return Parallelized(model, [model], mesh, name)
    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model.to(device)
        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model, device_ids=ids, process_group=mesh.sub("dp").get_group()
        )
        return Parallelized(ddp, [ddp], mesh, name, autocast=autocast)
    if name in ("tp", "fsdp-tp"):
        model.to(device)
        tp.apply_tp(model, mesh.sub("tp"), loss_parallel=layout.loss_parallel)
        qkv = tp.qkv_splits(model)
        if name == "fsdp-tp":
            fsdp(model, mesh.sub("dp"))
        return Parallelized(model, [model], mesh, name, autocast=autocast, qkv=qkv)

    # pipeline: this rank's stages of consecutive blocks
    pp, v = degrees["pp"], layout.resolved_stages_per_rank()
    pp_rank = mesh.local_rank("pp")
    modules = pipeline.build_stage_modules(model, pp_rank, pp, v)
    for m in modules:
        m.to(device)
        if name == "pp-fsdp":
            fsdp(m, mesh.sub("dp"))
    ids = pipeline.stage_ids(pp_rank, pp, v)
    stages, schedule = pipeline.build_schedule(
        modules,
        ids,
        n_stages=pp * v,
        pp_group=mesh.sub("pp").get_group(),
        device=device,
        schedule=layout.pp_schedule,
        microbatches=layout.pp_microbatches,
        loss_fn=loss_fn,
    )
    return Parallelized(
        model,
        modules,
        mesh,
        name,
        autocast=autocast,
        schedule=schedule,
        has_first=0 in ids,
        has_last=pp * v - 1 in ids,
        timer=pipeline.BusyTimer(stages, device),
    )
