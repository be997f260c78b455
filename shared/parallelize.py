"""Parallelism applied from outside the model (the torchtitan order): float8 linears (torchao),
activation checkpointing, then `torch.compile` per block, then FSDP2 (`fully_shard`), one unit
per block plus the root.

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
    compile_mode: str = (
        "default"  # torch.compile mode of the blocks, e.g. "max-autotune-no-cudagraphs"
    )
    float8: str | None = None  # torchao float8 training recipe: "tensorwise", "rowwise" or None


def _blocks(model: nn.Module) -> nn.ModuleList:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError("model must have a `.layers` nn.ModuleList of transformer blocks")
    return layers


def _block_list(model: nn.Module) -> list[nn.Module]:
    """The blocks of `.layers`, a ModuleList or a ModuleDict (a pipeline stage keeps the
    model's block indices as its keys)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleDict):
        return list(layers.values())
    return list(_blocks(model))


FLOAT8_RECIPES = ("tensorwise", "rowwise")


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """The linears that train in float8: those of the blocks (attention and FFN projections)
    whose two dimensions are multiples of 16 (what the float8 GEMM needs). The output head
    stays in the compute dtype, as torchtitan leaves it: its logits feed the loss directly."""
    return (
        isinstance(module, nn.Linear)
        and fqn.startswith("layers.")
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def apply_float8(model: nn.Module, recipe: str) -> int:
    """Swap the block linears for torchao's `Float8Linear` (dynamic scaling: e4m3 operands, e5m2
    or e4m3 gradients, one scale per tensor or per row); returns how many were swapped.

    tensorwise also all-gathers the FSDP2 weight shards in float8 (half the bytes of bf16), which
    needs `precompute_float8_scales(model)` after each optimizer step. Needs torchao."""
    if recipe not in FLOAT8_RECIPES:
        raise ValueError(f"float8 recipe must be one of {FLOAT8_RECIPES}, got {recipe!r}")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear
    except ImportError as e:
        raise RuntimeError(
            f"float8 training needs torchao ({e}): pip install -e '.[fp8]'"
        ) from None
    import dataclasses

    config = Float8LinearConfig.from_recipe_name(recipe)
    if recipe == "tensorwise":
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=float8_filter)
    swapped = sum(isinstance(m, Float8Linear) for m in model.modules())
    if swapped == 0:
        raise ValueError("no linear of the model can train in float8 (dimensions not % 16)")
    return swapped


def float8_all_gather(recipe: str | None) -> bool:
    """Whether the recipe all-gathers weights in float8 (and so needs precomputed scales)."""
    return recipe == "tensorwise"


def precompute_float8_scales(model: nn.Module) -> None:
    """After an optimizer step of a tensorwise float8 model: one all-reduce computes every
    weight's scale for the next float8 all-gather (instead of one per weight)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward: less memory, about 1/3 more compute."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = _blocks(model)
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")


def apply_compile(model: nn.Module, mode: str = "default") -> None:
    """`torch.compile` each block in place: the blocks repeat, so one compiled graph serves all
    and parameter names do not change. mode: `COMPILE_MODES` ("max-autotune-no-cudagraphs"
    benchmarks Triton GEMM templates and kernel configurations at the first call; CUDA graphs
    stay off: FSDP's hooks run between the blocks)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    for block in _blocks(model):
        block.compile(fullgraph=True, mode=None if mode == "default" else mode)


def apply_fsdp(
    model: nn.Module,
    *,
    mesh=None,
    param_dtype: torch.dtype | str | None = torch.bfloat16,
    reduce_dtype: torch.dtype | str | None = torch.float32,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """FSDP2: one unit per block plus the root (embedding, final norm, output head). `.layers`
    may be a ModuleList or a ModuleDict (a pipeline stage's blocks).

    Needs an initialised process group (`shared.distributed.init_distributed`). With
    param_dtype=None the parameters stay in their own dtype (pure fp32 training).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=parse_dtype(param_dtype), reduce_dtype=parse_dtype(reduce_dtype)
    )
    layers = _block_list(model)
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
    """Float8 linears, activation checkpointing, compile, then FSDP, in that order."""
    if cfg.float8 is not None:
        apply_float8(model, cfg.float8)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    if cfg.compile:
        apply_compile(model, cfg.compile_mode)
    return apply_fsdp(
        model,
        mesh=mesh,
        param_dtype=cfg.param_dtype,
        reduce_dtype=cfg.reduce_dtype,
        reshard_after_forward=cfg.reshard_after_forward,
    )
