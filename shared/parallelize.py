"""Parallelism applied from outside the model (the torchtitan order): activation checkpointing,
then `torch.compile` per block, then FSDP2 (`fully_shard`), one unit per block plus the root.

The model file stays a plain `nn.Module`; everything here takes a `shared.model.Transformer`
(or any module with a `.layers` ModuleList of blocks) and changes it in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


@dataclass
class ParallelConfig:
    param_dtype: str = "bfloat16"  # FSDP's compute dtype for parameters (mixed precision)
    reduce_dtype: str = "float32"  # gradient reduce-scatter dtype
    reshard_after_forward: bool = True  # ZeRO-3 style; False keeps params gathered (ZeRO-2)
    activation_checkpointing: bool = False
    compile: bool = False


def _blocks(model: nn.Module) -> nn.ModuleList:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError("model must have a `.layers` nn.ModuleList of transformer blocks")
    return layers


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward: less memory, about 1/3 more compute."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = _blocks(model)
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """`torch.compile` each block in place: the blocks repeat, so one compiled graph serves all
    and parameter names do not change."""
    for block in _blocks(model):
        block.compile(fullgraph=True)


def apply_fsdp(
    model: nn.Module,
    *,
    mesh=None,
    param_dtype: torch.dtype | str | None = torch.bfloat16,
    reduce_dtype: torch.dtype | str | None = torch.float32,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """FSDP2: one unit per block plus the root (embedding, final norm, output head).

    Needs an initialised process group (`shared.distributed.init_distributed`). With
    param_dtype=None the parameters stay in their own dtype (pure fp32 training).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=parse_dtype(param_dtype), reduce_dtype=parse_dtype(reduce_dtype)
    )
    layers = _blocks(model)
    for i, block in enumerate(layers):
        # The last block is needed again at the start of backward: keeping it gathered saves an
        # all-gather per step.
        last = i == len(layers) - 1
        fully_shard(
            block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and not last
        )
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def parallelize(model: nn.Module, cfg: ParallelConfig, *, mesh=None) -> nn.Module:
    """Activation checkpointing, compile, then FSDP, in that order."""
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    if cfg.compile:
        apply_compile(model)
    return apply_fsdp(
        model,
        mesh=mesh,
        param_dtype=cfg.param_dtype,
        reduce_dtype=cfg.reduce_dtype,
        reshard_after_forward=cfg.reshard_after_forward,
    )
