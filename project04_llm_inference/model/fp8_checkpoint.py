"""Hugging Face folders whose safetensors already hold FP8 weights, read as FP8 without
re-quantizing.

Two layouts, told apart by config.json's `quantization_config.quant_method`:
- "compressed-tensors" (llm-compressor's FP8 and FP8-dynamic exports): each quantized
  projection `<name>.weight` is float8_e4m3fn (N, K) with `<name>.weight_scale`, float32 or
  bfloat16, of shape (N, 1) or (N,) for the "channel" strategy and (), (1,) or (1, 1) for
  "tensor". A static `<name>.input_scale` is ignored: activations are scaled per token at run
  time, which bounds each token's error by its own range rather than a calibrated one. An
  attention layer's `self_attn.k_scale` / `v_scale` are the KV cache's scales
  (`kv_cache_scheme`), read by the loader into the layer.
- "fbgemm_fp8": `<name>.weight` float8_e4m3fn with a per-channel `<name>.weight_scale`
  (N, 1) float32; `input_scale_ub` (the activation scale's upper bound) is ignored.

Both map onto `kernels.fp8.Fp8Weight` (q (N, K) e4m3 and one float32 scale per output row): a
per-tensor scale becomes that tensor's rows' scale, so the fused q|k|v and gate|up weights keep
each part's scale. A projection the checkpoint left in 16 bits (its `ignore` list) is quantized
per row at load, like `--quantization fp8` does. Any other quant_method, or a compressed-tensors
scheme that is not 8-bit float weights per channel or per tensor, is refused naming it.
"""

from __future__ import annotations

import torch

FP8_METHODS = ("compressed-tensors", "fbgemm_fp8")
_STRATEGIES = ("channel", "tensor")
# tensors of an FP8 checkpoint the engine does not use (static activation scales, bounds)
IGNORED_SUFFIXES = (".input_scale", ".input_scale_ub")
# where exporters put the KV cache's scales of layer i ("model.layers.<i>." + one of these)
KV_SCALE_NAMES = {
    "self_attn.k_scale": "k_scale",
    "self_attn.v_scale": "v_scale",
    "self_attn.k_proj.k_scale": "k_scale",
    "self_attn.v_proj.v_scale": "v_scale",
    "self_attn.attn.k_scale": "k_scale",
    "self_attn.attn.v_scale": "v_scale",
}


def checkpoint_quantization(hf_config: dict) -> str | None:
    """The folder's FP8 layout ('compressed-tensors' or 'fbgemm_fp8'), or None for a 16/32-bit
    checkpoint. Raises ValueError naming an unknown quant_method or an unsupported scheme."""
    qc = hf_config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"config.json quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method not in FP8_METHODS:
        raise ValueError(
            f"config.json quantization_config.quant_method {method!r} is not supported "
            f"(FP8 checkpoints: {', '.join(FP8_METHODS)})"
        )
    if method == "compressed-tensors":
        _check_compressed_tensors(qc)
    return method


def _check_compressed_tensors(qc: dict) -> None:
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("config.json: compressed-tensors quantization_config has no config_groups")
    for name, group in groups.items():
        w = (group or {}).get("weights") or {}
        bits, kind, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
        if bits != 8 or kind != "float" or strategy not in _STRATEGIES:
            raise ValueError(
                f"config.json: compressed-tensors group {name!r} has weights num_bits={bits}, "
                f"type={kind!r}, strategy={strategy!r}; supported: 8-bit float weights per "
                f"channel or per tensor (FP8)"
            )


def weight_scale_rows(scale: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """A checkpoint's weight_scale as (rows,) float32: a per-channel (rows, 1) / (rows,) scale
    as it is, a per-tensor () / (1,) / (1, 1) scale repeated for every row."""
    s = scale.float().reshape(-1)
    if s.numel() == 1:
        return s.expand(rows)
    if s.numel() != rows:
        raise ValueError(
            f"{name} has shape {tuple(scale.shape)}: expected one scale per output channel "
            f"({rows}) or one for the tensor"
        )
    return s


def kv_scale_heads(scale: torch.Tensor, heads: int, name: str) -> torch.Tensor:
    """A checkpoint's k_scale / v_scale as (heads,) float32: per tensor (one value) or per KV
    head (heads values; this rank's heads under tensor parallelism). Refuses non-positive or
    non-finite scales, which would turn the cache into zeros or NaN."""
    s = scale.float().reshape(-1)
    if s.numel() == 1:
        s = s.expand(heads)
    elif s.numel() != heads:
        raise ValueError(
            f"{name} has shape {tuple(scale.shape)}: expected one scale or one per KV head "
            f"({heads})"
        )
    if not (torch.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"{name} must hold finite scales > 0, got {s.tolist()}")
    return s
