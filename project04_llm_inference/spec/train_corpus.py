"""A target and a draft model that agree often enough for speculation to pay: both trained on
the same text, the Python standard library's own source files, with one byte-level BPE.

    python -m project04_llm_inference.spec.train_corpus --models-dir runs/spec-models
    python -m project04_llm_inference.spec.train_corpus --max-steps 20 --max-files 40   # smoke

1. Corpus: the `.py` files under the running interpreter's standard library (or `--corpus-dir`),
   sorted by path; every `holdout_every`-th file is held out for the validation loss.
2. Tokenizer: a byte-level BPE of `vocab_size` tokens trained by `tokenizers` on the training
   files, with `<|endoftext|>` (id 0) between files; saved as tokenizer.json.
3. Models: `shared.model` transformers (GQA), a target (`target_*` fields; `125m`-like when
   scaled up) and a draft of a few million parameters (`draft_*`), trained on the same random
   windows of the token stream, one after the other: AdamW, linear warm-up, cosine decay;
   bfloat16 autocast on a GPU. With `--distill A` the draft, trained second, learns from the
   target as well: its loss is (1 - A) x the next-token cross-entropy + A x KL(target || draft)
   over the same windows (the target's distribution, not only the next token, is what a
   speculative draft must match). After training, the draft's top-1 agreement with the target
   on held-out windows (the share of positions where both argmaxes match: the per-token
   acceptance of greedy speculation if the draft saw the target's own context) is recorded.
4. Export: `shared.hf_export.export_hf` writes `<models_dir>/target` and `<models_dir>/draft`
   (config.json, safetensors, tokenizer.json), which the engine serves:
   `EngineArgs(model=".../target", speculative_method="draft", speculative_model=".../draft")`.
   `<models_dir>/train_record.json` records the losses, sizes and configuration.
"""

from __future__ import annotations

import json
import math
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

EOS = "<|endoftext|>"


@dataclass
class TrainCorpusConfig:
    """Train a target and a draft model on the standard library's source, export both."""

    models_dir: str = "runs/spec-models"
    """Folder that receives target/, draft/ and train_record.json (replaced if present)."""
    corpus_dir: str | None = None
    """Folder of .py files; default: the running Python's standard library."""
    max_files: int = 0
    """Use at most this many files (0: all)."""
    holdout_every: int = 20
    """Every n-th file (sorted by path) is held out for the validation loss."""
    vocab_size: int = 8192
    """BPE vocabulary, special token included (>= 257: the 256 bytes and <|endoftext|>)."""
    seq_len: int = 256
    """Training window, tokens."""
    max_seq_len: int = 2048
    """Longest position the exported models take (max_position_embeddings)."""
    batch_size: int = 32
    max_steps: int = 2000
    """Optimizer steps per model."""
    lr: float = 1e-3
    warmup_steps: int = 100
    eval_batches: int = 20
    target_dim: int = 768
    target_layers: int = 12
    target_heads: int = 12
    target_kv_heads: int = 4
    target_ffn: int = 2048
    draft_dim: int = 256
    draft_layers: int = 2
    draft_heads: int = 4
    draft_kv_heads: int = 2
    draft_ffn: int = 768
    distill: float = 0.0
    """Weight of KL(target || draft) in the draft's loss, in [0, 1] (0: the next-token
    cross-entropy only; 1: the target's distribution only)."""
    seed: int = 0
    device: str = "auto"
    """'auto': cuda when a GPU is visible."""

    def __post_init__(self) -> None:
        if self.vocab_size < 257:
            raise ValueError(
                f"vocab_size must be >= 257 (bytes + <|endoftext|>), got {self.vocab_size}"
            )
        for name in ("seq_len", "batch_size", "max_steps", "holdout_every", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_seq_len < self.seq_len:
            raise ValueError(
                f"max_seq_len must be >= seq_len ({self.seq_len}), got {self.max_seq_len}"
            )
        if not (0.0 <= self.distill <= 1.0):
            raise ValueError(f"distill must be in [0, 1], got {self.distill}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        if self.max_files < 0 or self.warmup_steps < 0:
            raise ValueError("max_files and warmup_steps must be >= 0")
        if not self.models_dir:
            raise ValueError("models_dir: empty path")


def corpus_files(cfg: TrainCorpusConfig) -> tuple[list[Path], list[Path]]:
    root = Path(cfg.corpus_dir or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise FileNotFoundError(f"corpus_dir: {root} is not a folder")
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    if cfg.max_files:
        files = files[: cfg.max_files]
    held = [f for i, f in enumerate(files) if i % cfg.holdout_every == cfg.holdout_every - 1]
    train = [f for i, f in enumerate(files) if i % cfg.holdout_every != cfg.holdout_every - 1]
    if not train or not held:
        raise ValueError(f"corpus_dir: {len(files)} .py files leave no train or held-out file")
    return train, held


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((_read(f) for f in files), trainer)
    return tok


def encode(tok, files: list[Path]) -> torch.Tensor:
    """One stream: each file's tokens followed by <|endoftext|>."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch([_read(f) for f in files]):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def _batch(stream: torch.Tensor, cfg: TrainCorpusConfig, gen: torch.Generator, device):
    n = len(stream) - cfg.seq_len - 1
    starts = torch.randint(0, max(n, 1), (cfg.batch_size,), generator=gen)
    windows = torch.stack([stream[s : s + cfg.seq_len + 1] for s in starts.tolist()])
    windows = windows.to(device)
    return windows[:, :-1], windows[:, 1:]


def _logits(model, x, device) -> torch.Tensor:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        return model(x).float().flatten(0, 1)


def _loss(model, x, y, device) -> torch.Tensor:
    return F.cross_entropy(_logits(model, x, device), y.flatten())


def distill_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, weight: float
) -> torch.Tensor:
    """(1 - weight) x cross-entropy(student, y) + weight x KL(teacher || student), both per
    token averaged; logits (tokens, vocab), y (tokens,)."""
    ce = F.cross_entropy(student_logits, y)
    if weight == 0.0:
        return ce
    kl = F.kl_div(
        F.log_softmax(student_logits, -1),
        F.log_softmax(teacher_logits.detach(), -1),
        log_target=True,
        reduction="batchmean",
    )
    return (1.0 - weight) * ce + weight * kl


@torch.no_grad()
def top1_agreement(draft, target, val: torch.Tensor, cfg: TrainCorpusConfig, device) -> float:
    """Share of held-out positions where the draft's argmax equals the target's (same
    windows as the validation loss)."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    same = total = 0
    for _ in range(cfg.eval_batches):
        x, _ = _batch(val, cfg, gen, device)
        a = _logits(draft, x, device).argmax(-1)
        b = _logits(target, x, device).argmax(-1)
        same += int((a == b).sum())
        total += a.numel()
    return same / total


def train_one(
    model,
    train: torch.Tensor,
    val: torch.Tensor,
    cfg: TrainCorpusConfig,
    device,
    teacher=None,
):
    """Train in place (with `teacher`: distilled from it, cfg.distill the KL weight); returns
    (final train loss, validation loss, seconds). The validation loss is the plain next-token
    cross-entropy whatever the training loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))

    gen = torch.Generator().manual_seed(cfg.seed)  # both models see the same batches
    model.train()
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for step in range(cfg.max_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = _batch(train, cfg, gen, device)
        if teacher is not None and cfg.distill > 0:
            with torch.no_grad():
                teacher_logits = _logits(teacher, x, device)
            loss = distill_loss(_logits(model, x, device), teacher_logits, y.flatten(), cfg.distill)
        else:
            loss = _loss(model, x, y, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == cfg.max_steps - 1:
            print(f"  step {step:5d}  loss {loss.item():.3f}")
    seconds = time.perf_counter() - t0
    model.eval()
    vgen = torch.Generator().manual_seed(cfg.seed + 1)
    with torch.no_grad():
        val_loss = (
            sum(
                _loss(model, *_batch(val, cfg, vgen, device), device).item()
                for _ in range(cfg.eval_batches)
            )
            / cfg.eval_batches
        )
    return loss.item(), val_loss, seconds


def run(cfg: TrainCorpusConfig) -> dict:
    from shared.hf_export import export_hf
    from shared.model import ModelArgs, build_model

    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    )
    train_files, held_files = corpus_files(cfg)
    print(f"corpus: {len(train_files)} training files, {len(held_files)} held out")
    tok = train_tokenizer(train_files, cfg.vocab_size)
    out = Path(cfg.models_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = out / "tokenizer.json"
    tok.save(str(tok_path))
    train, val = encode(tok, train_files), encode(tok, held_files)
    print(f"tokens: {len(train):,} training, {len(val):,} held out; vocab {tok.get_vocab_size()}")
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id(EOS)
    shapes = {
        "target": (
            cfg.target_dim,
            cfg.target_layers,
            cfg.target_heads,
            cfg.target_kv_heads,
            cfg.target_ffn,
        ),
        "draft": (
            cfg.draft_dim,
            cfg.draft_layers,
            cfg.draft_heads,
            cfg.draft_kv_heads,
            cfg.draft_ffn,
        ),
    }
    record: dict = {
        "config": asdict(cfg),
        "vocab_size": vocab,
        "train_tokens": len(train),
        "heldout_tokens": len(val),
        "models": {},
    }
    trained = {}
    for name, (dim, layers, heads, kv, ffn) in shapes.items():
        args = ModelArgs(
            dim=dim,
            n_layers=layers,
            n_heads=heads,
            n_kv_heads=kv,
            ffn_hidden=ffn,
            vocab_size=vocab,
            max_seq_len=cfg.max_seq_len,
        )
        model = build_model(args, seed=cfg.seed).to(device)
        print(f"{name}: {model.num_params() / 1e6:.1f} M parameters")
        teacher = trained.get("target") if name == "draft" else None
        train_loss, val_loss, seconds = train_one(model, train, val, cfg, device, teacher)
        entry = {
            "params": model.num_params(),
            "train_loss": train_loss,  # with --distill, the draft's distillation loss
            "heldout_loss": val_loss,
            "train_seconds": seconds,
        }
        if teacher is not None:
            entry["distill"] = cfg.distill
            entry["top1_agreement"] = top1_agreement(model, teacher, val, cfg, device)
            print(f"draft: top-1 agreement with the target {entry['top1_agreement']:.3f}")
        trained[name] = model
        folder = export_hf(
            model.cpu(), out / name, tokenizer_json=tok_path, eos_token_id=eos, overwrite=True
        )
        model.to(device)
        record["models"][name] = {**entry, "folder": folder.name}
        print(f"{name}: train loss {train_loss:.3f}, held-out loss {val_loss:.3f} -> {folder}")
    (out / "train_record.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> None:
    import tyro

    run(tyro.cli(TrainCorpusConfig, args=argv))


if __name__ == "__main__":
    main()
