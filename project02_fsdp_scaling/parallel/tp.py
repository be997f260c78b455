"""Tensor parallelism (Megatron) and sequence parallelism for the shared transformer, as DTensor
plans applied with `torch.distributed.tensor.parallel.parallelize_module`.

Per block, on a tensor-parallel mesh of t ranks:
- attention: `wqkv` column-parallel (each rank projects to its n_heads / t query heads and
  n_kv_heads / t key/value heads: attention needs no communication), `wo` row-parallel (each
  rank multiplies its heads' slice; the partial sums meet in one reduce-scatter);
- MLP: `w1`, `w3` column-parallel, `w2` row-parallel: one reduce-scatter per MLP;
- the norms and the residual stream sequence-parallel (split along the sequence, so neither
  their activations nor their work is repeated t times): an all-gather of the sequence before
  each column-parallel linear, a reduce-scatter after each row-parallel one. Megatron-SP: the
  same bytes as plain TP's all-reduce (an all-reduce is a reduce-scatter plus an all-gather).
- the output head column-parallel over the vocabulary; with loss parallel the logits stay split
  into the cross-entropy (`loss_context`), never gathered as a (tokens, vocab) tensor.

The fused [q | k | v] weight: a contiguous split of its out-features would give rank 0 all of q
and half of k. So its rows are first permuted so that rank r's contiguous shard is
[q_r | k_r | v_r], and each attention module is told its local head counts. A checkpoint and
`full_params` see the weight in the model's own [q | k | v] order (`canonical_qkv`): a
checkpoint written under TP loads under any other layout.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

QKV_SUFFIX = "attention.wqkv.weight"


def qkv_permutation(split: tuple[int, int, int], tp: int) -> torch.Tensor:
    """Row order that puts rank r's [q_r | k_r | v_r] in the r-th contiguous shard."""
    starts = [0, split[0], split[0] + split[1]]
    rows = []
    for r in range(tp):
        for start, n in zip(starts, split):
            local = n // tp
            rows.append(torch.arange(start + r * local, start + (r + 1) * local))
    return torch.cat(rows)


def canonical_qkv(weight: torch.Tensor, split: tuple[int, int, int], tp: int) -> torch.Tensor:
    """The full TP-ordered qkv weight (or an optimizer moment of it) back in [q | k | v] order."""
    return weight[torch.argsort(qkv_permutation(split, tp)).to(weight.device)]


def tp_qkv(weight: torch.Tensor, split: tuple[int, int, int], tp: int) -> torch.Tensor:
    """A [q | k | v] ordered weight in the TP order (the inverse of `canonical_qkv`)."""
    return weight[qkv_permutation(split, tp).to(weight.device)]


def check_tp_degree(args, tp: int) -> None:
    """ValueError naming the dimension that the tensor-parallel degree does not divide."""
    for name, n in (
        ("n_heads", args.n_heads),
        ("key/value heads", args.kv_heads),
        ("ffn_hidden", args.ffn_hidden),
        ("vocab_size", args.vocab_size),
    ):
        if n % tp:
            raise ValueError(f"tensor-parallel degree {tp} must divide the model's {name} ({n})")


def apply_tp(model: nn.Module, tp_mesh, *, loss_parallel: bool = True) -> nn.Module:
    """Megatron TP + sequence parallel over `tp_mesh` (1-D), in place; returns the model."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    check_tp_degree(model.args, tp)
    parallelize_module(
        model,
        tp_mesh,
        {
            # tokens replicated in, embeddings split along the sequence out
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            ),
        },
    )
    for block in model.layers:
        attn = block.attention
        with torch.no_grad():
            attn.wqkv.weight.copy_(tp_qkv(attn.wqkv.weight, attn.split, tp))
        attn.qkv_global_split = attn.split  # what canonical_qkv needs
        attn.split = tuple(n // tp for n in attn.split)
        attn.n_heads //= tp
        attn.n_kv_heads //= tp
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                # x (B, S/t, d) gathered to (B, S, d); cos, sin and attn_fn pass through
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None, None),
                    desired_input_layouts=(Replicate(), None, None, None),
                ),
                "attention.wqkv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    model.tp_degree = tp
    model.loss_parallel = loss_parallel
    return model


def loss_context(model: nn.Module) -> contextlib.AbstractContextManager:
    """Where the loss and its backward run: `loss_parallel()` when the logits stay split."""
    if getattr(model, "loss_parallel", False):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def qkv_splits(model: nn.Module) -> dict[str, tuple[tuple[int, int, int], int]]:
    """{canonical qkv weight name: (its [q, k, v] sizes, tp degree)} of a TP model."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "qkv_global_split"):
            clean = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
            out[f"{clean}.wqkv.weight"] = (module.qkv_global_split, model.tp_degree)
    return out
