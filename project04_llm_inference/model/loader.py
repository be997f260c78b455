"""Build a model from a Hugging Face folder (config.json + *.safetensors) or dummy weights.

Safetensors are read one tensor at a time (`safe_open`), each copied into its slot of the fused
on-device weights and dropped, so host memory never holds more than one tensor of the model. Under tensor parallelism each
rank reads every tensor and keeps its shard (`_shard`): rows of the column-parallel and
vocabulary-parallel weights, columns of the row-parallel ones. `quantization="fp8"` quantizes
the layers' projections to FP8 once loaded (`quant.py`). A folder whose safetensors already hold
FP8 weights (`fp8_checkpoint.py`: compressed-tensors, fbgemm_fp8) is read into FP8 projections
as stored, with its weight scales, and its KV-cache scales (`k_scale`, `v_scale`) when it has
them; FP8 is then implied whatever `quantization` says.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..kernels.fp8 import FP8_DTYPE, Fp8Weight, quantize_rows
from .fp8_checkpoint import (
    IGNORED_SUFFIXES,
    KV_SCALE_NAMES,
    checkpoint_quantization,
    kv_scale_heads,
    weight_scale_rows,
)
from .llama import LlamaConfig, LlamaForCausalLM
from .parallel import SINGLE, TensorParallel

# Hugging Face name -> (our parameter, which row block of a fused weight: (index, of how many))
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_LAYER_MAP = {
    "self_attn.q_proj.weight": ("qkv_proj", "q"),
    "self_attn.k_proj.weight": ("qkv_proj", "k"),
    "self_attn.v_proj.weight": ("qkv_proj", "v"),
    "self_attn.o_proj.weight": ("o_proj", None),
    "mlp.gate_proj.weight": ("gate_up_proj", "gate"),
    "mlp.up_proj.weight": ("gate_up_proj", "up"),
    "mlp.down_proj.weight": ("down_proj", None),
    "input_layernorm.weight": ("input_layernorm", None),
    "post_attention_layernorm.weight": ("post_attention_layernorm", None),
}
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some old exports carry
# HF tensors split by rows (output features) or by columns (input features) across TP ranks
_ROW_PARALLEL_INPUT = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
_NOT_SPLIT = ("input_layernorm.weight", "post_attention_layernorm.weight", "model.norm.weight")


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir}: no config.json (expected a Hugging Face model folder)"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _row_slice(layer, part: str | None) -> slice:
    q, kv, f = layer.q_size, layer.kv_size, layer.gate_up_proj.shape[0] // 2
    return {
        None: slice(None),
        "q": slice(0, q),
        "k": slice(q, q + kv),
        "v": slice(q + kv, q + 2 * kv),
        "gate": slice(0, f),
        "up": slice(f, 2 * f),
    }[part]


def _target(model: LlamaForCausalLM, name: str):
    """Where a Hugging Face tensor goes: (kind, destination, row slice) or None (not used).

    kind: "param" (a 16/32-bit weight), "fp8" (an `Fp8Weight`'s q rows), "scale" (its scale
    rows), "kv_scale" (a layer's KV-cache scales)."""
    if name == "model.embed_tokens.weight":
        return "param", model.embed_tokens, slice(None)
    if name == "model.norm.weight":
        return "param", model.norm, slice(None)
    if name == "lm_head.weight":
        # a tied model may still ship lm_head: it equals the embedding, which is loaded anyway
        tied = model.cfg.tie_word_embeddings
        return None if tied else ("param", model.lm_head, slice(None))
    m = _LAYER.fullmatch(name)
    if m:
        layer, rest = model.layers[int(m.group(1))], m.group(2)
        weight = rest.removesuffix("_scale")
        if rest in _LAYER_MAP or (rest.endswith(".weight_scale") and weight in _LAYER_MAP):
            attr, part = _LAYER_MAP[weight]
            w, rows = getattr(layer, attr), _row_slice(layer, part)
            if isinstance(w, Fp8Weight):
                return ("fp8" if rest == weight else "scale"), w, rows
            if rest == weight:
                return "param", w, rows
            raise ValueError(
                f"unexpected tensor {name!r}: a weight scale, but config.json declares no FP8 "
                "quantization_config"
            )
        if rest in KV_SCALE_NAMES:
            return "kv_scale", getattr(layer, KV_SCALE_NAMES[rest]), slice(None)
    if name.endswith(_IGNORED) or name.endswith(IGNORED_SUFFIXES):
        return None
    raise ValueError(f"unexpected tensor {name!r}: not a Llama weight")


def _shard(name: str, src: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """This rank's part of a full Hugging Face tensor: q/k/v, gate/up, the embedding and the LM
    head by rows (each an equal block: its heads, FFN slice, vocabulary rows), o_proj and
    down_proj by columns, norms whole."""
    if tp.size == 1 or name.endswith(_NOT_SPLIT):
        return src
    if name.endswith(_ROW_PARALLEL_INPUT):
        return src[:, tp.span(src.shape[1])]
    return src[tp.span(src.shape[0])]


def _shard_scale(name: str, src: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """This rank's weight scales: per-channel scales follow their weight's rows (whole for the
    row-parallel o_proj and down_proj, whose output rows are not split); a per-tensor scale is
    the same on every rank."""
    weight = name.removesuffix("_scale")
    if tp.size == 1 or src.numel() == 1 or weight.endswith(_ROW_PARALLEL_INPUT):
        return src
    flat = src.reshape(src.shape[0], -1)[:, 0] if src.dim() else src
    return flat[tp.span(flat.shape[0])]


def _copy(kind: str, name: str, dst_obj, rows: slice, src: torch.Tensor, tp) -> list:
    """Write one checkpoint tensor into the model; returns the tensors it filled, with counts."""
    if kind == "param":
        if src.dtype == FP8_DTYPE:
            raise ValueError(
                f"{name} is float8_e4m3fn but config.json declares no FP8 quantization_config"
            )
        src = _shard(name, src, tp)
        dst = dst_obj.data[rows]
        _check_shape(name, src, dst)
        dst.copy_(src)  # host -> device and to the model dtype, one tensor at a time
        return [(dst_obj, src.numel())]
    if kind == "fp8":
        src = _shard(name, src, tp)
        dst = dst_obj.qweight[rows]
        _check_shape(name, src, dst)
        if src.dtype == FP8_DTYPE:
            dst.copy_(src)  # as stored: no re-quantization
            return [(dst_obj.qweight, src.numel())]
        # a projection the checkpoint kept in 16 bits (its ignore list): quantized per row here
        q, s = quantize_rows(src)
        dst.copy_(q)
        dst_obj.scale[rows].copy_(s)
        return [(dst_obj.qweight, src.numel()), (dst_obj.scale, s.numel())]
    if kind == "scale":
        dst = dst_obj.scale[rows]
        src = weight_scale_rows(_shard_scale(name, src, tp), dst.shape[0], name)
        dst.copy_(src)
        return [(dst_obj.scale, dst.numel())]
    heads = dst_obj.shape[0]  # kv_scale: this rank's KV heads
    flat = src.reshape(-1)
    if tp.size > 1 and flat.numel() == heads * tp.size:
        flat = flat[tp.span(flat.numel())]
    dst_obj.copy_(kv_scale_heads(flat, heads, name))
    return []


def _check_shape(name: str, src: torch.Tensor, dst: torch.Tensor) -> None:
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(
            f"{name} has shape {tuple(src.shape)} (this rank's part), the config implies "
            f"{tuple(dst.shape)}"
        )


def _slots(model: LlamaForCausalLM) -> dict[int, tuple[str, torch.Tensor]]:
    """Every tensor the checkpoint must fill: parameters and the FP8 projections' buffers."""
    out = {id(p): (n, p) for n, p in model.named_parameters()}
    for n, mod in model.named_modules():
        if isinstance(mod, Fp8Weight):
            for b in ("qweight", "scale"):
                out[id(getattr(mod, b))] = (f"{n}.{b}", getattr(mod, b))
    return out


@torch.no_grad()
def load_safetensors(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    filled: dict[int, int] = {}  # id(tensor) -> elements written
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                target = _target(model, name)
                if target is None:
                    continue
                kind, dst, rows = target
                try:
                    done = _copy(kind, name, dst, rows, st.get_tensor(name), model.tp)
                except ValueError as e:
                    raise ValueError(f"{f.name}: {e}") from None
                for t, n in done:
                    filled[id(t)] = filled.get(id(t), 0) + n
    missing = [n for i, (n, t) in _slots(model).items() if filled.get(i, 0) != t.numel()]
    if missing:
        raise ValueError(f"{model_dir}: weights missing or incomplete for {missing[:5]}")


@torch.no_grad()
def init_dummy(model: LlamaForCausalLM, seed: int) -> None:
    """Random weights with a real model's scale: normal(0, 0.02), norm weights 1.

    (vLLM's dummy loader draws U(-1e-3, 1e-3): near-flat logits, meaningless in bf16 checks.)
    Under tensor parallelism each rank draws its own shard (seeded by seed and rank): the same
    shapes and scale as the unsplit model, not its values."""
    seed = seed + 1_000_003 * model.tp.rank
    gen = torch.Generator(device=model.norm.device).manual_seed(seed)
    for _, p in sorted(model.named_parameters()):
        if p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02, generator=gen)


def build_model(
    hf_config: dict,
    *,
    model_dir: str | Path | None,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
    seed: int = 0,
    tp: TensorParallel = SINGLE,
    quantization: str = "none",
) -> LlamaForCausalLM:
    """The model (rank `tp.rank`'s shard) with its weights: from `model_dir`'s safetensors, or
    dummy when it is None; its projections quantized to FP8 with quantization="fp8"."""
    cfg = LlamaConfig.from_hf(hf_config)
    if quantization not in ("none", "fp8"):
        raise ValueError(f"quantization: expected 'none' or 'fp8', got {quantization!r}")
    stored_fp8 = model_dir is not None and checkpoint_quantization(hf_config) is not None
    if stored_fp8:
        quantization = "fp8"  # the weights are FP8 already: implied, and accepted when asked
    if quantization == "fp8":
        from .quant import check_fp8_device

        check_fp8_device(device)  # before loading: a GPU without FP8 is refused at once
    model = LlamaForCausalLM(cfg, dtype=dtype, device=device, max_positions=max_positions, tp=tp)
    if stored_fp8:
        from .quant import fp8_slots

        fp8_slots(model)  # FP8 projections the checkpoint's weights and scales are read into
    if model_dir is None:
        init_dummy(model, seed)
    else:
        load_safetensors(model, model_dir)
    if quantization == "fp8":
        from .quant import quantize_model_fp8

        quantize_model_fp8(model)  # the projections not stored in FP8 (all, from 16 bits)
    return model.eval()
