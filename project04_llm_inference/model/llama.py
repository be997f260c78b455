"""The Llama family (Llama 2, Llama 3.x: GQA, Llama-3 RoPE scaling, tied embeddings) over a
paged KV cache.

Tokens of all sequences in a step are packed into one (T,) batch: the first `num_decodes` are
decode tokens (one per sequence), the rest are prefill chunks. Every op runs on the packed batch
except attention, which reads each sequence's paged K/V through its block table (`AttnMetadata`).
Weights are stored fused (q|k|v and gate|up) so each projection is one matmul. Under tensor
parallelism (`parallel.py`) a model holds one rank's shard: its `cfg` counts that rank's heads,
KV heads and FFN slice, and the layers all-reduce after o_proj and after down_proj.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .. import kernels
from ..kernels.fp8 import FP8_DTYPE
from ..kernels.reference import rope_cos_sin_cache
from .parallel import SINGLE, TensorParallel, shard_config, vocab_parallel_embedding


@dataclass
class AttnMetadata:
    """Where each token of the packed batch reads and writes the paged KV cache."""

    num_decodes: int  # the first num_decodes tokens are decodes, one per sequence
    positions: torch.Tensor  # (T,) int64 position of each token in its sequence
    slot_mapping: torch.Tensor  # (T,) int64 cache slot of each token; -1 = padding
    decode_block_tables: torch.Tensor  # (num_decodes, max_blocks) int32
    decode_context_lens: torch.Tensor  # (num_decodes,) int32, the new token included
    max_context_len: int  # host-side upper bound of decode_context_lens (the split plan)
    prefill_block_tables: torch.Tensor | None = None  # (P, max_blocks) int32
    cu_seqlens_q: torch.Tensor | None = None  # (P + 1,) int32, offsets into the prefill part
    prefill_context_lens: torch.Tensor | None = None  # (P,) int32
    max_seqlen_q: int = 0


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Hugging Face Llama config.json that the model reads."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False

    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        missing = [
            k
            for k in ("hidden_size", "intermediate_size", "num_hidden_layers")
            + ("num_attention_heads", "vocab_size")
            if k not in cfg
        ]
        if missing:
            raise ValueError(f"config.json lacks {missing}: not a Llama-family config")
        heads = cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        if heads % kv:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of kv heads {kv}")
        scaling = cfg.get("rope_scaling")
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("llama3", "default", "linear"):
                raise ValueError(f"rope_scaling type {kind!r} is not supported (llama3, linear)")
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(cfg.get("rope_theta", 10_000.0)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies, with Llama-3's (or linear) context scaling applied."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling
    kind = None if s is None else s.get("rope_type", s.get("type"))
    if kind == "linear":
        inv = inv / s["factor"]
    elif kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_len = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = ((old_len / wavelen) - lo) / (hi - lo)
        blended = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wavelen > old_len / lo, inv / factor, inv)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        inv = torch.where(mid, blended, inv)
    return inv.float()


def _param(*shape: int, dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, dtype, device, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.cfg, self.tp = cfg, tp  # cfg: this rank's heads and FFN slice
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size, self.kv_size = hq * d, hkv * d
        p = dict(dtype=dtype, device=device)
        self.input_layernorm = _param(cfg.hidden_size, **p)
        self.qkv_proj = _param(self.q_size + 2 * self.kv_size, cfg.hidden_size, **p)
        self.o_proj = _param(cfg.hidden_size, self.q_size, **p)
        self.post_attention_layernorm = _param(cfg.hidden_size, **p)
        self.gate_up_proj = _param(2 * cfg.intermediate_size, cfg.hidden_size, **p)
        self.down_proj = _param(cfg.hidden_size, cfg.intermediate_size, **p)
        # The FP8 KV cache's scales, one per (this layer, KV head): a cached value is
        # round_e4m3(x / scale). 1 unless the checkpoint gives them (`loader`); unused by a
        # cache in the model dtype.
        for name in ("k_scale", "v_scale"):
            self.register_buffer(name, torch.ones(hkv, dtype=torch.float32, device=device))

    def _kv_scales(self, k_cache) -> tuple:
        """(k_scale, v_scale) for an FP8 cache, (None, None) for one in the model dtype."""
        return (self.k_scale, self.v_scale) if k_cache.dtype == FP8_DTYPE else (None, None)

    def _decode_attention(self, q, meta: AttnMetadata, k_cache, v_cache, scale: float):
        return kernels.paged_decode_attention(
            q,
            k_cache,
            v_cache,
            meta.decode_block_tables,
            meta.decode_context_lens,
            scale,
            meta.max_context_len,
            *self._kv_scales(k_cache),
        )

    def _prefill_attention(self, q, meta: AttnMetadata, k_cache, v_cache, scale: float):
        return kernels.paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.prefill_block_tables,
            meta.cu_seqlens_q,
            meta.prefill_context_lens,
            meta.max_seqlen_q,
            scale,
            *self._kv_scales(k_cache),
        )

    def forward(self, x, residual, meta: AttnMetadata, cos_sin, k_cache, v_cache):
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        # RMSNorm (with the residual add; the first layer's residual stream starts as x), the
        # QKV projection, RoPE and the KV-cache write: one GEMV launch for a few tokens, else
        # the norm kernel, cuBLAS and the RoPE kernel.
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        rope = kernels.RopeWrite(
            hq,
            hkv,
            meta.positions,
            cos_sin,
            k_cache,
            v_cache,
            meta.slot_mapping,
            *self._kv_scales(k_cache),
        )
        qkv, residual = kernels.norm_linear(
            x, residual, self.input_layernorm, self.qkv_proj, eps, rope=rope
        )
        t = qkv.shape[0]
        q, _, _ = kernels.qkv_views(qkv, hq, hkv, d)
        scale = 1.0 / math.sqrt(d)
        nd = meta.num_decodes
        if nd == t:  # decodes only: the kernel reads q strided out of qkv, its output is final
            out = self._decode_attention(q, meta, k_cache, v_cache, scale)
        elif nd == 0:  # prefill chunks only: the kernel reads q strided too, no copies
            out = self._prefill_attention(q, meta, k_cache, v_cache, scale)
        else:
            q = q.contiguous()  # (T, Hq, D)
            out = torch.empty_like(q)
            out[:nd] = self._decode_attention(q[:nd], meta, k_cache, v_cache, scale)
            out[nd:] = self._prefill_attention(q[nd:], meta, k_cache, v_cache, scale)
        # row-parallel o_proj: each rank's heads give a partial sum
        x = self.tp.all_reduce(kernels.linear(out.view(t, self.q_size), self.o_proj))
        h, residual = kernels.norm_linear(
            x, residual, self.post_attention_layernorm, self.gate_up_proj, eps, silu_mul=True
        )
        return self.tp.all_reduce(kernels.linear(h, self.down_proj)), residual


class LlamaForCausalLM(nn.Module):
    """Weights in fused layout; `loader.py` maps Hugging Face tensor names onto them.

    With `tp` of size > 1 the model is rank `tp.rank`'s shard: `cfg` holds that rank's head and
    FFN counts (the full vocabulary), `full_cfg` the model's, and the embedding and LM head hold
    the rank's block of vocab_size / tp.size rows."""

    def __init__(
        self,
        cfg: LlamaConfig,
        *,
        dtype: torch.dtype,
        device,
        max_positions: int,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.full_cfg, self.tp = cfg, tp
        self.cfg = cfg = shard_config(cfg, tp.size)
        p = dict(dtype=dtype, device=device)
        vocab_rows = cfg.vocab_size // tp.size
        self.embed_tokens = _param(vocab_rows, cfg.hidden_size, **p)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, dtype, device, tp) for _ in range(cfg.num_hidden_layers)
        )
        self.norm = _param(cfg.hidden_size, **p)
        self.lm_head = (
            self.embed_tokens
            if cfg.tie_word_embeddings
            else _param(vocab_rows, cfg.hidden_size, **p)
        )
        inv = rope_inv_freq(cfg).to(device)
        self.register_buffer("cos_sin", rope_cos_sin_cache(inv, max_positions), persistent=False)

    def forward(self, input_ids: torch.Tensor, meta: AttnMetadata, kv_caches) -> torch.Tensor:
        """input_ids (T,) -> final hidden states (T, hidden), normalised."""
        x = vocab_parallel_embedding(input_ids, self.embed_tokens, self.tp)
        residual = None
        for layer, (kc, vc) in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, meta, self.cos_sin, kc, vc)
        x, _ = kernels.fused_add_rms_norm(x, residual, self.norm, self.cfg.rms_norm_eps)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, hidden) -> (N, vocab) float32 (each rank's vocabulary block, gathered)."""
        return self.tp.all_gather_cols(kernels.linear(hidden, self.lm_head).float())
