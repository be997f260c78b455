"""What FP8 costs in accuracy: the same model's logits, greedy choices and perplexity on held-out
text, with float32 (CPU) or bfloat16 (GPU) weights and KV cache against three FP8 variants:
FP8 e4m3 weights (per-output-channel scales, the engine's `--quantization fp8`), an FP8 KV cache
(per-(layer, KV head) scales, `--kv-cache-dtype fp8`) and both together.

The text is the code model's held-out files (every 20th file of the standard library corpus it
trains on, never seen in training), tokenized by the model's own tokenizer and cut into windows;
each window is one prefill through the engine's model over a paged KV cache, logits at every
position; the window's K and V are written to the cache and read back from it, so an FP8 cache's
rounding reaches every position after the first. Reported per variant: the max and mean
absolute logit error, the share of positions whose argmax (the greedy next token) is unchanged,
and both perplexities with the relative change. The KV scales are the checkpoint's `k_scale` /
`v_scale` where it has them, else 1 (the engine's rule). With no
`--model`, the repo's code model is trained first (`train-code-model`'s tiny preset, a short run)
into the run's folder. On the CPU the FP8 path is the dequantizing reference (weights-only); on
a GPU of compute capability >= 8.9 it is `torch._scaled_mm` (W8A8, per-token activation scales).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

PROJECT = "project04_llm_inference"


@dataclass
class Fp8AccuracyConfig:
    """Accuracy of FP8 weights, an FP8 KV cache and both against the model's own dtype, on
    held-out code (JSON record)."""

    model: str | None = None
    """Hugging Face model folder with tokenizer.json; none: train the code model (tiny) first."""
    train_steps: int = 600
    """Optimizer steps of the code model trained when no --model is given."""
    eval_tokens: int = 4096
    """Held-out tokens scored (whole windows)."""
    window: int = 128
    """Tokens per scored window (one prefill each)."""
    device: Literal["auto", "cuda", "cpu"] = "cpu"
    """'auto': cuda when a GPU is visible. The baseline is float32 on the CPU, bfloat16 on CUDA."""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""

    def __post_init__(self) -> None:
        for name in ("train_steps", "eval_tokens", "window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Fp8AccuracyConfig.{name} must be an integer >= 1, got {v!r}")
        if self.window < 2:
            raise ValueError(f"Fp8AccuracyConfig.window must be >= 2, got {self.window}")
        if self.model is not None and not self.model.strip():
            raise ValueError("Fp8AccuracyConfig.model: empty path")


def heldout_ids(model_dir: Path, n_tokens: int) -> list[int]:
    """The code model's held-out files, tokenized, first n_tokens tokens."""
    from ..code_model import PRESETS
    from ..model.tokenizer import Tokenizer
    from ..spec import train_corpus as tc

    tok = Tokenizer.from_dir(model_dir)
    if tok is None:
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json (the held-out text needs one)")
    _, held = tc.corpus_files(tc.TrainCorpusConfig(max_files=PRESETS["tiny"]["max_files"]))
    ids: list[int] = []
    for f in held:
        ids += tok.encode(f.read_text(errors="replace"))
        if len(ids) >= n_tokens:
            break
    return ids[:n_tokens]


@torch.inference_mode()
def window_logits(
    model, ids: torch.Tensor, block_size: int = 16, kv_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """(W,) token ids -> (W, vocab) float32 logits: one prefill over a fresh paged cache of
    kv_dtype (default: the model's dtype; float8_e4m3fn: the FP8 cache)."""
    from ..model.llama import AttnMetadata

    cfg, dev, w = model.cfg, model.norm.device, ids.shape[0]
    blocks = -(-w // block_size)
    shape = (blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    kv_dtype = kv_dtype or model.norm.dtype
    kv = [
        tuple(torch.zeros(shape, dtype=kv_dtype, device=dev) for _ in "kv")
        for _ in range(cfg.num_hidden_layers)
    ]
    i32 = dict(dtype=torch.int32, device=dev)
    meta = AttnMetadata(
        num_decodes=0,
        positions=torch.arange(w, device=dev),
        slot_mapping=torch.arange(w, device=dev),
        decode_block_tables=torch.zeros(0, blocks, **i32),
        decode_context_lens=torch.zeros(0, **i32),
        max_context_len=0,
        prefill_block_tables=torch.arange(blocks, **i32).view(1, blocks),
        cu_seqlens_q=torch.tensor([0, w], **i32),
        prefill_context_lens=torch.tensor([w], **i32),
        max_seqlen_q=w,
    )
    return model.compute_logits(model(ids.to(dev), meta, kv))


def compare(base, fp8, windows: list[torch.Tensor], kv_dtype: torch.dtype | None = None) -> dict:
    """Logit errors, greedy agreement and perplexities of fp8 (its KV cache of kv_dtype, default
    its own dtype) against base (its own dtype) over the windows."""
    max_err, abs_sum, n_logits, agree, n_pos = 0.0, 0.0, 0, 0, 0
    nll = {"base": 0.0, "fp8": 0.0}
    for ids in windows:
        a, b = window_logits(base, ids), window_logits(fp8, ids, kv_dtype=kv_dtype)
        d = (a - b).abs()
        max_err = max(max_err, float(d.max()))
        abs_sum += float(d.double().sum())
        n_logits += d.numel()
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n_pos += a.shape[0]
        target = ids[1:].to(a.device)
        for name, lg in (("base", a), ("fp8", b)):
            nll[name] += float(torch.nn.functional.cross_entropy(lg[:-1], target, reduction="sum"))
    n_pred = sum(w.shape[0] - 1 for w in windows)
    ppl = {k: math.exp(v / n_pred) for k, v in nll.items()}
    return {
        "logits_max_abs_err": max_err,
        "logits_mean_abs_err": abs_sum / n_logits,
        "greedy_agreement": agree / n_pos,
        "positions": n_pos,
        "perplexity_baseline": ppl["base"],
        "perplexity_fp8": ppl["fp8"],
        "perplexity_change_pct": 100.0 * (ppl["fp8"] / ppl["base"] - 1.0),
    }


def run(cfg: Fp8AccuracyConfig) -> dict:
    """Train (or take) the model, score both precisions, save the JSON record, return it."""
    from shared.results import output_root, save_result

    from ..kernels.fp8 import FP8_DTYPE
    from ..model.loader import build_model, read_config
    from ..model.quant import check_fp8_device

    cuda = torch.cuda.is_available()
    device = torch.device(("cuda" if cuda else "cpu") if cfg.device == "auto" else cfg.device)
    if device.type == "cuda" and not cuda:
        raise ValueError("Fp8AccuracyConfig.device: 'cuda' asked for, but torch sees no CUDA GPU")
    check_fp8_device(device)
    if device.type == "cuda" and cfg.model is None:
        # the tiny preset's head dim (128 / 4 heads) is not one the CUDA attention kernels take
        raise ValueError(
            "Fp8AccuracyConfig.model: on CUDA give a model of head dim 64 or 128 (the attention "
            "kernels'), e.g. one from `train-code-model --preset full`; the tiny code model "
            "trained by default has head dim 32"
        )
    out = output_root(cfg.reports_dir)
    train_record = None
    if cfg.model is None:
        from ..code_model import CodeModelConfig
        from ..code_model import run as train_code_model

        model_dir = Path(out) / "code-model"
        train_record = train_code_model(
            CodeModelConfig(
                out_dir=str(model_dir), preset="tiny", max_steps=cfg.train_steps, device="cpu"
            )
        )
    else:
        model_dir = Path(cfg.model)
    hf = read_config(model_dir)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ids = heldout_ids(model_dir, cfg.eval_tokens)
    n = len(ids) // cfg.window
    if n == 0:
        raise ValueError(f"held-out text has {len(ids)} tokens, fewer than one window")
    windows = [torch.tensor(ids[i * cfg.window : (i + 1) * cfg.window]) for i in range(n)]
    common = dict(model_dir=model_dir, dtype=dtype, device=device, max_positions=cfg.window)
    base = build_model(hf, **common)
    fp8 = build_model(hf, quantization="fp8", **common)
    variants = {
        "weights": compare(base, fp8, windows),
        "kv_cache": compare(base, base, windows, kv_dtype=FP8_DTYPE),
        "weights+kv_cache": compare(base, fp8, windows, kv_dtype=FP8_DTYPE),
    }
    unit = all(
        bool((layer.k_scale == 1).all() and (layer.v_scale == 1).all()) for layer in base.layers
    )
    results = {
        "model": str(model_dir),
        "baseline_dtype": str(dtype).removeprefix("torch."),
        "fp8_path": "torch._scaled_mm W8A8" if device.type == "cuda" else "dequantized weights",
        "kv_cache_path": "CUDA kernels, e4m3 tiles converted in shared memory"
        if device.type == "cuda"
        else "reference, dequantized in float32",
        "kv_scales": "1 (none in the checkpoint)" if unit else "the checkpoint's k_scale/v_scale",
        "windows": n,
        "window": cfg.window,
        "variants": variants,
    }
    if train_record is not None:
        results["code_model"] = {
            k: train_record[k] for k in ("params", "train_loss", "heldout_loss", "train_seconds")
        }
    for name, row in variants.items():
        print(name, {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})
    path = save_result(
        PROJECT,
        "fp8_accuracy",
        results,
        baseline=(
            f"the same model with {results['baseline_dtype']} weights and KV cache, same process"
        ),
        config=asdict(cfg),
        reports_dir=str(out),
    )
    print(f"wrote {path}")
    return {**results, "path": str(path)}
