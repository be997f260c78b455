"""Checkpoints that load under any parallel layout: `torch.distributed.checkpoint` (DCP) of the
model, the optimizer and the step count, keyed by the model's own parameter names.

DCP stores each rank's shards with their place in the full tensor, and a load reads whichever
pieces the new layout's shards need: a checkpoint written by TP=2 loads under FSDP2 on two ranks,
under a pipeline, or in one process. The optimizer state is flattened to one entry per parameter
(`flatten_optimizer_state_dict`), so it no longer depends on which parameters one rank's
optimizer holds (a pipeline rank holds only its stages'). Tensor parallelism stores its fused qkv
weight in a permuted row order (`tp.py`); here that weight and its Adam moments are written in
the model's [q | k | v] order, as full tensors (every rank holds the same; DCP writes one copy),
and permuted back on load.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from project02_fsdp_scaling.parallel import tp
from project02_fsdp_scaling.parallel.apply import Parallelized


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _qkv_entries(par: Parallelized, msd: dict, osd: dict):
    """(state dict, key, (split, tp)) of every TP-ordered qkv tensor in the two state dicts."""
    for name, spec in par.qkv.items():
        if name in msd:
            yield msd, name, spec
        for key in osd:
            if key.startswith(f"state.{name}.") and torch.is_tensor(osd[key]) and osd[key].dim():
                yield osd, key, spec


def state_dicts(par: Parallelized, optimizer) -> tuple[dict, dict]:
    """(model, flattened optimizer) state dicts in the model's names, TP's qkv canonical."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(par.param_container(), optimizer, options=_options())
    for sd, key, spec in list(_qkv_entries(par, msd, osd)):
        sd[key] = tp.canonical_qkv(sd[key].full_tensor(), *spec)
    return msd, osd


def save(path: str | Path, par: Parallelized, optimizer, step: int) -> None:
    """Write the checkpoint of `step` completed steps to the folder `path` (all ranks)."""
    import torch.distributed.checkpoint as dcp

    msd, osd = state_dicts(par, optimizer)
    state = {"model": msd, "optim": osd, "step": torch.tensor(step)}
    dcp.save(state, checkpoint_id=str(path))
    dist.barrier()


def load(path: str | Path, par: Parallelized, optimizer) -> int:
    """Load the checkpoint in `path` into this layout's model and optimizer (all ranks);
    returns the step count it was written at."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import distribute_tensor

    container = par.param_container()
    msd, osd = get_state_dict(container, optimizer, options=_options())
    layouts = {}
    for sd, key, spec in list(_qkv_entries(par, msd, osd)):
        layouts[(id(sd), key)] = (sd[key], spec)
        sd[key] = torch.empty(sd[key].shape, dtype=sd[key].dtype, device=sd[key].device)
    state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    for sd in (msd, osd):
        for key in list(sd):
            if (id(sd), key) in layouts:
                like, spec = layouts[(id(sd), key)]
                ordered = tp.tp_qkv(sd[key], *spec)
                sd[key] = distribute_tensor(ordered, like.device_mesh, like.placements)
    set_state_dict(
        container, optimizer, model_state_dict=msd, optim_state_dict=osd, options=_options()
    )
    return int(state["step"])


def full_state(par: Parallelized, optimizer) -> dict[str, torch.Tensor]:
    """The whole training state in full on every rank, on the CPU: `model.<name>` and
    `optim.<flattened key>` (a collective: call on all ranks). What two layouts' checkpoints
    are compared by."""
    from torch.distributed.tensor import DTensor

    msd, osd = state_dicts(par, optimizer)
    local = {}
    for prefix, sd in (("model", msd), ("optim", osd)):
        for key, v in sd.items():
            if torch.is_tensor(v):
                v = v.full_tensor() if isinstance(v, DTensor) else v
                local[f"{prefix}.{key}"] = v.detach().cpu().clone()
    if par.mesh.sub("pp") is None:
        return local
    gathered: list[dict] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return {k: v for part in gathered for k, v in part.items()}
