"""The reference transformer: Llama-style (RMSNorm, RoPE, SwiGLU, causal attention).

A plain `nn.Module` with no parallelism inside: FSDP, activation checkpointing and
`torch.compile` are applied from outside (`shared.parallelize`). The attention function is
injectable, so project01's fused kernel can replace SDPA in a training check.

Grouped-query attention: `n_kv_heads` key/value heads shared by groups of `n_heads //
n_kv_heads` query heads (None: one per query head, plain multi-head attention). The fused `wqkv`
projection then has `dim + 2 * n_kv_heads * head_dim` out-features, laid out [q | k | v].

Presets (parameter counts with untied embeddings, vocab 32,000; all multi-head):
- `tiny`: a few hundred thousand parameters, for CPU tests.
- `125m`: 134 M.
- `1b`: 1.11 B (d 2048, 18 layers, 16 heads of 128, SwiGLU hidden 6144).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

# attn_fn(q, k, v, causal=True) -> out, all (B, H, S, D)
AttentionFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 2048
    n_layers: int = 18
    n_heads: int = 16
    vocab_size: int = 32_000
    ffn_hidden: int = 6144
    max_seq_len: int = 2048
    norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    # New fields go last, with defaults that reproduce the earlier model exactly, so positional
    # construction, old config records and checkpoint keys/shapes keep working.
    n_kv_heads: int | None = None  # None: n_heads (multi-head attention)
    tie_embeddings: bool = False  # output head shares the embedding table's weight

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "vocab_size", "ffn_hidden", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelArgs.{name} must be positive, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise ValueError(
                f"ModelArgs.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})"
            )
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head dim {self.dim // self.n_heads} must be even for RoPE")
        if self.n_kv_heads is not None:
            if self.n_kv_heads <= 0:
                raise ValueError(f"ModelArgs.n_kv_heads must be positive, got {self.n_kv_heads}")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(
                    f"ModelArgs.n_heads ({self.n_heads}) must be divisible by n_kv_heads "
                    f"({self.n_kv_heads}): each key/value head serves a whole group of query heads"
                )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads, resolved (n_kv_heads, or n_heads when None)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kv_dim(self) -> int:
        """Out-features of each of the K and V parts of `wqkv`."""
        return self.kv_heads * self.head_dim

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ModelArgs:
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; expected one of {sorted(PRESETS)}")
        return replace(PRESETS[name], **overrides)

    def num_params(self) -> int:
        """Parameter count computed from the shapes (matches Transformer.num_params())."""
        d, h, v, L = self.dim, self.ffn_hidden, self.vocab_size, self.n_layers
        attn = 2 * d * d + 2 * d * self.kv_dim  # q and o, then k and v (4 d^2 without GQA)
        per_block = attn + 3 * d * h + 2 * d  # attention, SwiGLU, two RMSNorm weights
        tables = 1 if self.tie_embeddings else 2  # a tied output head adds no parameters
        return L * per_block + tables * v * d + d  # embedding, output head, final norm

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(
        dim=64, n_layers=2, n_heads=4, vocab_size=256, ffn_hidden=192, max_seq_len=64
    ),
    "125m": ModelArgs(
        dim=768, n_layers=12, n_heads=12, vocab_size=32_000, ffn_hidden=2048, max_seq_len=2048
    ),
    "1b": ModelArgs(
        dim=2048, n_layers=18, n_heads=16, vocab_size=32_000, ffn_hidden=6144, max_seq_len=2048
    ),
}


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, enable_gqa: bool = False
):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=enable_gqa)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the input dtype, as Llama does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None):
    """cos, sin tables (S, D/2) in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    t = torch.arange(seq_len, device=device).float()
    freqs = torch.outer(t, inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, S, D) by position; pairs are (x[..., :D/2], x[..., D/2:])."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[None, None], sin[None, None]  # (1, 1, S, D/2)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.split = (args.dim, args.kv_dim, args.kv_dim)  # [q | k | v] along out-features
        self.wqkv = nn.Linear(args.dim, sum(self.split), bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x, cos, sin, attn_fn: AttentionFn) -> torch.Tensor:
        B, S, _ = x.shape
        q, k, v = self.wqkv(x).split(self.split, dim=-1)
        q = q.view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, D)
        k = k.view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        v = v.view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv_heads == self.n_heads:
            out = attn_fn(q, k, v, causal=True)  # (B, H, S, D)
        elif attn_fn is sdpa_attention:  # SDPA pairs query head h with kv head h // group itself
            out = attn_fn(q, k, v, causal=True, enable_gqa=True)
        else:
            # Injected kernels expect one K/V head per query head: query head h reads kv head
            # h // group, so each kv head is copied `group` times, copies adjacent.
            group = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            out = attn_fn(q, k, v, causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, S, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(args.dim, args.ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(args.ffn_hidden, args.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x, cos, sin, attn_fn: AttentionFn) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, attn_fn)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, attn_fn: AttentionFn | None = None) -> None:
        super().__init__()
        self.args = args
        self.attn_fn = attn_fn or sdpa_attention
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # A ModuleList indexed by position: FSDP and checkpoint keys stay stable.
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:  # one Parameter under two names; FSDP keeps both in the root unit
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        # Not parameters, not in the state dict: recomputed on construction.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, loss_chunk: int = 0
    ) -> torch.Tensor:
        """tokens (B, S) int64 -> logits (B, S, vocab). With targets (B, S) int64: the mean
        cross-entropy instead (float32, float64 for a float64 model), the output projection and
        the loss computed together `loss_chunk` tokens at a time (`shared.fused_loss`; 0: its
        default), so the (B, S, vocab) logits are never held. `compute_dtype` then records the
        dtype the projection ran in."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq), got shape {tuple(tokens.shape)}")
        S = tokens.shape[1]
        if S > self.args.max_seq_len:
            raise ValueError(f"sequence length {S} exceeds max_seq_len {self.args.max_seq_len}")
        cos, sin = self.rope_cos[:S], self.rope_sin[:S]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, self.attn_fn)
        h = self.norm(h)
        if targets is None:
            return self.output(h)
        from shared.fused_loss import DEFAULT_CHUNK, linear_cross_entropy

        weight = self.output.weight
        if h.dtype != weight.dtype:  # autocast-free mixed precision: the projection's dtype
            h = h.to(weight.dtype)
        self.compute_dtype = h.dtype
        return linear_cross_entropy(h, weight, targets, loss_chunk or DEFAULT_CHUNK)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Deterministic init: normal(0, 0.02), output projections scaled by 1/sqrt(2 L)."""
        gen = None
        if seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(seed)
        std = 0.02
        out_std = std / math.sqrt(2 * self.args.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:  # RMSNorm weights
                p.fill_(1.0)
                continue
            s = out_std if name.endswith(("wo.weight", "w2.weight")) else std
            # Draw on the CPU so the result does not depend on the device or its RNG.
            p.copy_(torch.empty(p.shape).normal_(0.0, s, generator=gen))
        cos, sin = rope_tables(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)


def build_model(
    preset_or_args: str | ModelArgs, *, seed: int = 0, attn_fn: AttentionFn | None = None
) -> Transformer:
    args = (
        ModelArgs.from_preset(preset_or_args) if isinstance(preset_or_args, str) else preset_or_args
    )
    model = Transformer(args, attn_fn=attn_fn)
    model.init_weights(seed)
    return model
