"""The shared transformer written in MLX, loading the PyTorch weights.

Same parameter names as `shared.model.Transformer` (so the state dict maps one to one), same
maths: RMSNorm in float32, rotary embedding on (first half, second half) pairs, causal attention,
SwiGLU. MLX runs it on the CPU on Linux (`mlx[cpu]`) and on the GPU through Metal on Apple
silicon. The attention function is injectable, as in the PyTorch model, so the Metal attention
kernel of `apple_track.metal_kernels` can replace MLX's fused one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from shared.model import ModelArgs


def mlx_sdpa(q: mx.array, k: mx.array, v: mx.array, causal: bool = True) -> mx.array:
    """(B, H, S, D) causal attention through MLX's fused kernel."""
    return mx.fast.scaled_dot_product_attention(
        q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), mask="causal" if causal else None
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = mx.ones((dim,))

    def __call__(self, x: mx.array) -> mx.array:
        # Normalise in float32, then scale in the input's dtype, as the PyTorch model does.
        xf = x.astype(mx.float32)
        xf = xf * mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return xf.astype(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.theta = args.n_heads, args.head_dim, args.rope_theta
        self.wqkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def __call__(self, x: mx.array, attn_fn: Callable) -> mx.array:
        B, S, _ = x.shape
        qkv = self.wqkv(x).reshape(B, S, 3, self.n_heads, self.head_dim)
        qkv = qkv.transpose(2, 0, 3, 1, 4)  # (3, B, H, S, D)
        q, k, v = qkv[0], qkv[1], qkv[2]
        # traditional=False rotates (x[..., :D/2], x[..., D/2:]) pairs, the PyTorch model's layout.
        q = mx.fast.rope(q, self.head_dim, traditional=False, base=self.theta, scale=1.0, offset=0)
        k = mx.fast.rope(k, self.head_dim, traditional=False, base=self.theta, scale=1.0, offset=0)
        out = attn_fn(q, k, v, causal=True)  # (B, H, S, D)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(B, S, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(args.dim, args.ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(args.ffn_hidden, args.dim, bias=False)  # down

    def __call__(self, x: mx.array) -> mx.array:
        return self.w2(nn.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def __call__(self, x: mx.array, attn_fn: Callable) -> mx.array:
        x = x + self.attention(self.attention_norm(x), attn_fn)
        return x + self.feed_forward(self.ffn_norm(x))


class MLXTransformer(nn.Module):
    def __init__(self, args: ModelArgs, attn_fn: Callable | None = None) -> None:
        super().__init__()
        self.args = args
        self._attn_fn = attn_fn or mlx_sdpa
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = [TransformerBlock(args) for _ in range(args.n_layers)]
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def __call__(self, tokens: mx.array) -> mx.array:
        """tokens (B, S) integer -> logits (B, S, vocab)."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be (batch, seq), got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > self.args.max_seq_len:
            raise ValueError(
                f"sequence length {tokens.shape[1]} exceeds max_seq_len {self.args.max_seq_len}"
            )
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self._attn_fn)
        return self.output(self.norm(h))


def from_torch(torch_model, *, dtype=mx.float32, attn_fn: Callable | None = None) -> MLXTransformer:
    """An MLXTransformer holding `torch_model`'s weights (a shared.model.Transformer).

    Every parameter must map: a missing or extra name, or a shape that differs, raises.
    """
    args = torch_model.args
    model = MLXTransformer(args, attn_fn=attn_fn)
    state = {k: v.detach().float().cpu().numpy() for k, v in torch_model.state_dict().items()}
    weights = [(k, mx.array(v).astype(dtype)) for k, v in state.items()]
    model.load_weights(weights, strict=True)  # checks names and shapes both ways
    mx.eval(model.parameters())
    return model


def to_numpy(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))
