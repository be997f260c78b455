"""Build a model from a Hugging Face folder (config.json + *.safetensors) or dummy weights.

Safetensors are read one tensor at a time (`safe_open`), each copied into its slot of the fused
on-device weights and dropped, so host memory never holds more than one tensor of the model. Under tensor parallelism each
rank reads every tensor and keeps its shard (`_shard`): rows of the column-parallel and
vocabulary-parallel weights, columns of the row-parallel ones. `quantization="fp8"` quantizes
the layers' projections to FP8 once loaded (`quant.py`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

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


def _target(model: LlamaForCausalLM, name: str) -> tuple[torch.Tensor, slice] | None:
    if name == "model.embed_tokens.weight":
        return model.embed_tokens, slice(None)
    if name == "model.norm.weight":
        return model.norm, slice(None)
    if name == "lm_head.weight":
        # a tied model may still ship lm_head: it equals the embedding, which is loaded anyway
        return None if model.cfg.tie_word_embeddings else (model.lm_head, slice(None))
    m = _LAYER.fullmatch(name)
    if m and m.group(2) in _LAYER_MAP:
        layer = model.layers[int(m.group(1))]
        attr, part = _LAYER_MAP[m.group(2)]
        return getattr(layer, attr), _row_slice(layer, part)
    if name.endswith(_IGNORED):
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


@torch.no_grad()
def load_safetensors(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    filled: dict[int, int] = {}  # id(param) -> elements written
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                target = _target(model, name)
                if target is None:
                    continue
                param, rows = target
                dst = param.data[rows]
                src = _shard(name, st.get_tensor(name), model.tp)
                if tuple(src.shape) != tuple(dst.shape):
                    raise ValueError(
                        f"{f.name}: {name} has shape {tuple(src.shape)} (this rank's part), "
                        f"the config implies "
                        f"{tuple(dst.shape)}"
                    )
                dst.copy_(src)  # host -> device and to the model dtype, one tensor at a time
                filled[id(param)] = filled.get(id(param), 0) + src.numel()
    missing = [n for n, p in model.named_parameters() if filled.get(id(p), 0) != p.numel()]
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
    if quantization == "fp8":
        from .quant import check_fp8_device

        check_fp8_device(device)  # before loading: a GPU without FP8 is refused at once
    model = LlamaForCausalLM(cfg, dtype=dtype, device=device, max_positions=max_positions, tp=tp)
    if model_dir is None:
        init_dummy(model, seed)
    else:
        load_safetensors(model, model_dir)
    if quantization == "fp8":
        from .quant import quantize_model_fp8

        quantize_model_fp8(model)
    elif quantization != "none":
        raise ValueError(f"quantization: expected 'none' or 'fp8', got {quantization!r}")
    return model.eval()
