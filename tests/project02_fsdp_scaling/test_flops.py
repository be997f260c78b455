"""FLOPs per token of the model match the formula: counted op by op with FlopCounterMode."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from project02_fsdp_scaling.train import matmul_params, train_flops_per_token
from shared.model import ModelArgs, Transformer


def explicit_attention(q, k, v, causal=True):
    """Attention as two plain matmuls, so the counter sees every FLOP on any backend. The mask
    does not reduce the counted work: this counts the non-causal total."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, S, S)
    if causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    return s.softmax(-1) @ v  # (B, H, S, D)


@pytest.mark.parametrize("preset", ["tiny"])
def test_counted_training_flops_match_formula(preset):
    args = ModelArgs.from_preset(preset)
    model = Transformer(args, attn_fn=explicit_attention)
    B, S = 2, args.max_seq_len
    tokens = torch.randint(0, args.vocab_size, (B, S))
    with FlopCounterMode(display=False) as counter:
        model(tokens).float().pow(2).mean().backward()
    counted = counter.get_total_flops() / (B * S)
    assert counted == pytest.approx(train_flops_per_token(args, S, causal=False), rel=1e-9)


def test_formula_terms():
    a = ModelArgs.from_preset("1b")
    # Matmul parameters: everything but the input embedding table and the norm weights.
    assert matmul_params(a) == a.num_params() - a.vocab_size * a.dim - (2 * a.n_layers + 1) * a.dim
    S = 2048
    causal = 6 * matmul_params(a) + 6 * a.n_layers * a.dim * S
    assert train_flops_per_token(a, S) == pytest.approx(causal, rel=1e-12)
    assert train_flops_per_token(a, S, causal=False) == pytest.approx(
        causal + 6 * a.n_layers * a.dim * S, rel=1e-12
    )
    # ~6.7 GFLOP per token for the ~1.1 B model at S = 2048.
    assert 6.6e9 < train_flops_per_token(a, S) < 6.9e9
