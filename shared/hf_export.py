"""`shared.model.Transformer` to and from a Hugging Face Llama folder (config.json + safetensors).

This is where the training projects hand a model to the inference engine: they meet through the
folder, never through imports. The only layout work is splitting the fused `wqkv` into q/k/v and
renaming. No RoPE permutation is needed: `shared.model.apply_rope` rotates the halves
(x[..., :D/2], x[..., D/2:]) as LlamaForCausalLM's rotate_half does (tests/shared checks it).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from shared.model import ModelArgs, Transformer, rope_tables
from shared.results import _fsync_dir

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Per layer: our name -> HF name. q/k/v come from slicing wqkv and are handled separately.
_LAYER = {
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
_QKV = ("q_proj", "k_proj", "v_proj")
# Llama options shared.model has one fixed answer to: written on export, required on import.
_FIXED = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "rope_scaling": None}


def hf_config(args: ModelArgs, dtype: torch.dtype = torch.float32, **token_ids: int | None) -> dict:
    """The config.json for `args`; bos/eos ids only when given (absent beats a wrong guess)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_seq_len,
        "vocab_size": args.vocab_size,
        **_FIXED,
        "tie_word_embeddings": args.tie_embeddings,
        "torch_dtype": _DTYPES[dtype],
    }
    return cfg | {k: v for k, v in token_ids.items() if v is not None}


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our state dict under HF names (views of the model's tensors, wqkv split into q/k/v)."""
    args, sd = model.args, model.state_dict()
    out = {hf: sd[ours] for ours, hf in _TOP.items()}
    if not args.tie_embeddings:  # tied: HF rebuilds lm_head from embed_tokens
        out["lm_head.weight"] = sd["output.weight"]
    for i in range(args.n_layers):
        pre = f"model.layers.{i}."
        parts = sd[f"layers.{i}.attention.wqkv.weight"].split((args.dim, args.kv_dim, args.kv_dim))
        out |= {f"{pre}self_attn.{n}.weight": t for n, t in zip(_QKV, parts)}
        out |= {pre + hf: sd[f"layers.{i}.{ours}"] for ours, hf in _LAYER.items()}
    return out


def _write_synced(path: Path, data: bytes | None = None) -> None:
    """Write `data` (None: the file is already written) and fsync it before the folder rename."""
    with open(path, "rb+" if data is None else "wb") as f:
        if data is not None:
            f.write(data)
        os.fsync(f.fileno())


def export_hf(
    model: Transformer,
    out_dir: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    tokenizer_json: str | os.PathLike | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `model` as a Hugging Face Llama folder at `out_dir` (replaced only if `overwrite`).

    Built in a hidden sibling folder and renamed into place, so a reader never sees a folder with
    a config but half the weights."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; pass overwrite=True to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"  # hidden siblings: same filesystem, no clash
    tmp, old = (out_dir.with_name(f".{out_dir.name}.{kind}.{tag}") for kind in ("tmp", "old"))
    tmp.mkdir()  # a plain mkdir (umask applies), not mkdtemp's 0700 that a server might not read
    try:
        cfg = hf_config(model.args, dtype, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
        _write_synced(tmp / CONFIG, (json.dumps(cfg, indent=2) + "\n").encode())
        tensors = {k: v.to("cpu", dtype).contiguous() for k, v in hf_state_dict(model).items()}
        save_file(tensors, tmp / WEIGHTS, metadata={"format": "pt"})  # HF refuses files without it
        shutil.copymode(tmp / CONFIG, tmp / WEIGHTS)  # save_file leaves 0600: use umask's mode
        _write_synced(tmp / WEIGHTS)
        if tokenizer_json is not None:
            _write_synced(tmp / TOKENIZER, Path(tokenizer_json).read_bytes())
        if out_dir.exists():  # a folder cannot be renamed onto a non-empty one: move it aside
            os.replace(out_dir, old)
            try:
                os.replace(tmp, out_dir)
            except BaseException:
                os.replace(old, out_dir)  # put the previous export back
                raise
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(out_dir.parent)
    return out_dir


def _args_from_config(cfg: dict, where: Path) -> ModelArgs:
    need = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "max_position_embeddings",
        "rms_norm_eps",
    )
    missing = [k for k in need if k not in cfg]
    if missing:
        raise ValueError(f"{where}: config.json lacks {missing}")
    if cfg.get("model_type") != "llama":
        raise ValueError(f"{where}: model_type must be 'llama', got {cfg.get('model_type')!r}")
    # Features shared.model does not have: refuse them rather than load a different model.
    for key, ok in _FIXED.items():
        if cfg.get(key, ok) != ok:
            raise ValueError(f"{where}: {key}={cfg[key]!r} is not supported (only {ok!r})")
    rope = cfg.get("rope_parameters") or {}  # newer transformers write rope_theta in here
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"{where}: rope_parameters={rope!r} is not supported (no RoPE scaling)")
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, head_dim = cfg.get("num_key_value_heads", h), cfg.get("head_dim", d // h)
    if head_dim * h != d:  # shared.model derives head_dim; it cannot hold any other
        raise ValueError(f"{where}: head_dim {head_dim} * {h} heads != hidden_size {d}")
    return ModelArgs(
        dim=d,
        n_layers=cfg["num_hidden_layers"],
        n_heads=h,
        vocab_size=cfg["vocab_size"],
        ffn_hidden=cfg["intermediate_size"],
        max_seq_len=cfg["max_position_embeddings"],
        norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg.get("rope_theta", rope.get("rope_theta", 1e4)),
        n_kv_heads=None if kv == h else kv,
        tie_embeddings=cfg.get("tie_word_embeddings", False),
    )


def import_hf(model_dir: str | os.PathLike) -> Transformer:
    """A float32 `Transformer` from a folder written by `export_hf` (or any plain HF Llama
    folder with a single safetensors file); names and shapes are checked strictly."""
    model_dir = Path(model_dir)
    for name in (CONFIG, WEIGHTS):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"{model_dir}: no {name}")
    args = _args_from_config(json.loads((model_dir / CONFIG).read_text()), model_dir)
    with torch.device("meta"):  # shapes only: every value comes from the file
        model = Transformer(args)
    expected = {k: tuple(v.shape) for k, v in hf_state_dict(model).items()}
    with safe_open(model_dir / WEIGHTS, framework="pt") as f:
        found = set(f.keys())
        missing, unexpected = sorted(expected.keys() - found), sorted(found - expected.keys())
        if missing or unexpected:
            raise ValueError(f"{model_dir / WEIGHTS}: missing {missing}, unexpected {unexpected}")
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in expected}  # header only, no data
        bad = [f"{k} {shapes[k]} != {want}" for k, want in expected.items() if shapes[k] != want]
        if bad:
            raise ValueError(f"{model_dir / WEIGHTS}: wrong shapes: {'; '.join(bad)}")
        hf = {k: f.get_tensor(k).float() for k in expected}
    sd = {ours: hf[name] for ours, name in _TOP.items()}
    head = "model.embed_tokens.weight" if args.tie_embeddings else "lm_head.weight"
    sd["output.weight"] = hf[head]
    for i in range(args.n_layers):
        pre = f"model.layers.{i}."
        qkv = [hf[f"{pre}self_attn.{n}.weight"] for n in _QKV]
        sd[f"layers.{i}.attention.wqkv.weight"] = torch.cat(qkv)
        sd |= {f"layers.{i}.{ours}": hf[pre + name] for ours, name in _LAYER.items()}
    model.to_empty(device="cpu")
    if args.tie_embeddings:  # to_empty gives each name its own tensor: tie them again
        model.output.weight = model.tok_embeddings.weight
    model.load_state_dict(sd, strict=True)
    cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    return model
