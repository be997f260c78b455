"""The model every exporter in this track takes: the shared transformer behind a fixed shape.

On-device runtimes compile a graph for one input shape, so the export wrapper pins
(batch, seq_len) and takes int32 tokens (Core ML has no int64 tensors; TFLite's int64 support
is patchy across delegates). Everything here needs only PyTorch, so the main test tier checks
it without coremltools, LiteRT or MLX.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from shared.data import SyntheticTokens
from shared.model import PRESETS, ModelArgs, Transformer, build_model

# Core ML variants: an ML program in float16, then three post-training weight compressions of it
# (coremltools.optimize.coreml). Values say what each one does to the weights.
COREML_VARIANTS: dict[str, str] = {
    "fp16": "float16 weights and compute (no compression)",
    "int8": "int8 linear symmetric weight quantization, per channel",
    "palettize6": "6-bit k-means palettization (64-entry lookup table), per tensor",
    "palettize4": "4-bit k-means palettization (16-entry lookup table), per tensor",
}
# LiteRT variants: float32, and int8 dynamic-range (int8 weights, float activations).
LITERT_VARIANTS: dict[str, str] = {
    "fp32": "float32 weights and compute",
    "int8": "int8 dynamic-range: int8 weights, activations quantized on the fly",
}


# MLX variants: the port in float32 and float16, and MLX's own group-wise affine quantization
# (mlx.nn.quantize) of every Linear and the embedding.
MLX_VARIANTS: dict[str, str] = {
    "fp32": "float32 weights and compute",
    "fp16": "float16 weights and compute",
    "q8": "8-bit affine group-wise quantization (group 32), mlx.nn.quantize",
    "q4": "4-bit affine group-wise quantization (group 32), mlx.nn.quantize",
}
VARIANTS = {"coreml": COREML_VARIANTS, "litert": LITERT_VARIANTS, "mlx": MLX_VARIANTS}

# Stated parity tolerances against the PyTorch float32 logits, as the relative L2 error
# ||out - ref|| / ||ref||, and the least share of positions whose arg-max token must agree.
# float32 runtimes must match to rounding; float16 to half precision; compressed variants to
# what their weight error allows (the records show the measured rel_l2 well below each bound).
TOLERANCES: dict[tuple[str, str], dict[str, float]] = {
    ("litert", "fp32"): {"rel_l2": 1e-5, "top1_agree": 1.0},
    ("litert", "int8"): {"rel_l2": 3e-2, "top1_agree": 0.95},
    ("mlx", "fp32"): {"rel_l2": 1e-5, "top1_agree": 1.0},
    ("mlx", "fp16"): {"rel_l2": 5e-3, "top1_agree": 0.98},
    ("mlx", "q8"): {"rel_l2": 3e-2, "top1_agree": 0.95},
    ("mlx", "q4"): {"rel_l2": 2e-1, "top1_agree": 0.85},
    ("coreml", "fp16"): {"rel_l2": 5e-3, "top1_agree": 0.98},
    ("coreml", "int8"): {"rel_l2": 3e-2, "top1_agree": 0.95},
    ("coreml", "palettize6"): {"rel_l2": 8e-2, "top1_agree": 0.9},
    ("coreml", "palettize4"): {"rel_l2": 2e-1, "top1_agree": 0.85},
}


def within_tolerance(runtime: str, variant: str, parity_result: dict) -> bool:
    tol = TOLERANCES[(runtime, variant)]
    return (
        parity_result["rel_l2"] <= tol["rel_l2"]
        and parity_result["top1_agree"] >= tol["top1_agree"]
    )


def _check_choices(argument: str, values, allowed: dict[str, str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError(
            f"{argument} must be a sequence of variant names, got the string {values!r}"
        )
    values = tuple(values)
    for v in values:
        if v not in allowed:
            raise ValueError(
                f"unsupported {argument} variant {v!r}; expected any of {', '.join(allowed)}"
            )
    if len(set(values)) != len(values):
        raise ValueError(f"{argument} lists a variant twice: {values}")
    return values


@dataclass(frozen=True)
class ExportConfig:
    """What `python -m apple_track export` builds and measures: the model, the fixed input
    shape its exported graphs take, and the variants of each runtime."""

    preset: str = "tiny"
    """a shared.model preset: tiny, 125m or 1b"""
    overrides: dict = field(default_factory=dict)
    """ModelArgs fields set over the preset's (dim, n_layers, ...)"""
    batch: int = 1
    """batch of the fixed input shape"""
    seq_len: int = 64
    """sequence length of the fixed input shape (at most the model's max_seq_len)"""
    seed: int = 0
    """seed of the initial weights, the training stream and the held-out batch"""
    train_steps: int = 300
    """AdamW steps on the synthetic token stream first: trained weights, outliers included"""
    coreml: tuple[str, ...] = tuple(COREML_VARIANTS)
    """Core ML variants to export, any of the default's (none: skip Core ML)"""
    litert: tuple[str, ...] = tuple(LITERT_VARIANTS)
    """LiteRT variants to export, any of the default's (none: skip LiteRT)"""
    mlx: tuple[str, ...] = tuple(MLX_VARIANTS)
    """MLX variants to export, any of the default's (none: skip MLX)"""

    def __post_init__(self) -> None:
        if not isinstance(self.preset, str) or self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        unknown = set(self.overrides) - set(ModelArgs.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown model override(s) {sorted(unknown)}; "
                f"expected fields of ModelArgs: {sorted(ModelArgs.__dataclass_fields__)}"
            )
        args = self.model_args()  # ModelArgs validates the overrides' values
        for name in ("batch", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("seed", "train_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.seq_len > args.max_seq_len:
            raise ValueError(
                f"seq_len {self.seq_len} exceeds the model's max_seq_len {args.max_seq_len}"
            )
        object.__setattr__(self, "coreml", _check_choices("coreml", self.coreml, COREML_VARIANTS))
        object.__setattr__(self, "litert", _check_choices("litert", self.litert, LITERT_VARIANTS))
        object.__setattr__(self, "mlx", _check_choices("mlx", self.mlx, MLX_VARIANTS))

    def model_args(self) -> ModelArgs:
        return ModelArgs.from_preset(self.preset, **self.overrides)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["model_args"] = self.model_args().to_dict()
        d["num_params"] = self.model_args().num_params()
        return d


class FixedShapeLM(nn.Module):
    """tokens (batch, seq_len) int32 -> logits (batch, seq_len, vocab) float32, shape pinned."""

    def __init__(self, model: Transformer, batch: int, seq_len: int) -> None:
        super().__init__()
        if seq_len > model.args.max_seq_len:
            raise ValueError(f"seq_len {seq_len} exceeds max_seq_len {model.args.max_seq_len}")
        self.model = model
        self.batch, self.seq_len = batch, seq_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tuple(tokens.shape) != (self.batch, self.seq_len):
            raise ValueError(
                f"tokens must have the exported shape {(self.batch, self.seq_len)}, "
                f"got {tuple(tokens.shape)}"
            )
        return self.model(tokens.long())

    def example_input(self, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A held-out (inputs int32, targets int64) batch of the exported shape."""
        return eval_batch(self.model.args.vocab_size, self.batch, self.seq_len, seed)


# A step of the synthetic stream far past any training run: a batch the model never saw, drawn
# from the same successor table (the table depends on the seed alone).
EVAL_STEP = 1_000_000


def eval_batch(vocab_size: int, batch: int, seq_len: int, seed: int):
    """(inputs (batch, seq_len) int32, next-token targets (batch, seq_len) int64)."""
    inputs, targets = SyntheticTokens(vocab_size, seq_len, batch, seed).batch_at(EVAL_STEP)
    return inputs.to(torch.int32), targets


def train_briefly(model: Transformer, steps: int, *, seed: int, batch: int = 16) -> list[float]:
    """AdamW on the synthetic stream; returns the loss every step (float32, CPU)."""
    if steps == 0:
        return []
    args = model.args
    stream = SyntheticTokens(args.vocab_size, min(args.max_seq_len, 64), batch, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    losses = []
    # One thread: at these sizes intra-op threads cost more in synchronisation than they save
    # (many times over on a busy machine), and one thread makes the run reproducible.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(steps):
            x, y = stream.next_batch()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return losses


def build_export_model(cfg: ExportConfig) -> tuple[FixedShapeLM, list[float]]:
    """The shared transformer, briefly trained, behind the fixed-shape wrapper (eval mode)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model_args(), seed=cfg.seed)
    losses = train_briefly(model, cfg.train_steps, seed=cfg.seed)
    wrapper = FixedShapeLM(model, cfg.batch, cfg.seq_len).eval()
    return wrapper, losses


def parity(out: torch.Tensor, ref: torch.Tensor, targets: torch.Tensor | None = None) -> dict:
    """How far a runtime's logits (B, S, V) are from the PyTorch float32 reference.

    max_abs: the largest absolute difference; rel_l2: ||out - ref|| / ||ref||; top1_agree: the
    share of positions whose arg-max token is the same; loss / loss_delta: next-token
    cross-entropy on `targets` and its change against the reference (nats).
    """
    out, ref = torch.as_tensor(out).float(), torch.as_tensor(ref).float()
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    diff = out - ref
    result = {
        "max_abs": diff.abs().max().item(),
        "rel_l2": (diff.norm() / ref.norm().clamp_min(1e-30)).item(),
        "top1_agree": (out.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    }
    if targets is not None:
        t = torch.as_tensor(targets).long().flatten()
        loss = F.cross_entropy(out.flatten(0, 1), t).item()
        ref_loss = F.cross_entropy(ref.flatten(0, 1), t).item()
        result |= {"loss": loss, "loss_delta": loss - ref_loss}
    return result
