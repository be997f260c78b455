"""The repo's own code model: a small Llama-shaped transformer trained on the Python standard
library's source with its own byte-level BPE, exported as a Hugging Face folder that `serve`
reads, so there is real text end to end without downloading anything.

    python -m project04_llm_inference train-code-model                  # this machine's size
    python -m project04_llm_inference serve models/code-model --max-model-len 512

`--preset auto` takes `full` on a GPU (the speculative benchmark's target size) and `tiny` on a
CPU (a few hundred thousand parameters and a few hundred steps: it learns Python's surface,
indentation, keywords and common names, not programs). The folder holds config.json,
model.safetensors (`shared.hf_export`), tokenizer.json and a tokenizer_config.json naming the
end-of-text token; train_record.json beside the weights records the losses and the settings.
The corpus, tokenizer and training loop are the speculative benchmark's
(`spec/train_corpus.py`), so both train the same kind of model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

# name -> (corpus files (0: all), vocab, window, batch, steps, lr, dim, layers, heads, kv, ffn,
# longest position)
PRESETS: dict[str, dict] = {
    # about a minute on a few CPU cores: make demo's model
    "tiny": dict(
        max_files=60,
        vocab_size=1024,
        seq_len=128,
        batch_size=8,
        max_steps=200,
        lr=3e-3,
        warmup_steps=30,
        dim=128,
        layers=2,
        heads=4,
        kv_heads=2,
        ffn=384,
        max_seq_len=512,
    ),
    # the speculative benchmark's target (125m-like), on a GPU
    "full": dict(
        max_files=0,
        vocab_size=8192,
        seq_len=256,
        batch_size=32,
        max_steps=2000,
        lr=1e-3,
        warmup_steps=100,
        dim=768,
        layers=12,
        heads=12,
        kv_heads=4,
        ffn=2048,
        max_seq_len=2048,
    ),
}


@dataclass
class CodeModelConfig:
    """Train the code model on the Python standard library and export it as a Hugging Face
    folder with its tokenizer (what `serve MODEL` reads)."""

    out_dir: str = "models/code-model"
    """Folder that receives the model (replaced if present)."""
    preset: Literal["auto", "tiny", "full"] = "auto"
    """'auto': 'full' on a GPU, 'tiny' on a CPU."""
    max_steps: int | None = None
    """Optimizer steps (default: the preset's)."""
    corpus_dir: str | None = None
    """Folder of .py files; default: the running Python's standard library."""
    seed: int = 0
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """'auto': cuda when a GPU is visible."""

    def __post_init__(self) -> None:
        if not self.out_dir.strip():
            raise ValueError("CodeModelConfig.out_dir: empty path")
        if self.preset not in ("auto", *PRESETS):
            raise ValueError(
                f"CodeModelConfig.preset: expected one of {['auto', *PRESETS]}, got {self.preset!r}"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"CodeModelConfig.max_steps must be >= 1, got {self.max_steps}")


def resolve_preset(cfg: CodeModelConfig, cuda: bool) -> str:
    if cfg.preset != "auto":
        return cfg.preset
    return "full" if cuda and cfg.device != "cpu" else "tiny"


def run(cfg: CodeModelConfig) -> dict:
    import torch

    from shared.hf_export import export_hf
    from shared.model import ModelArgs, build_model
    from shared.results import atomic_write_json

    from .spec import train_corpus as tc

    cuda = torch.cuda.is_available()
    preset = resolve_preset(cfg, cuda)
    p = dict(PRESETS[preset])
    if cfg.max_steps is not None:
        p["max_steps"] = cfg.max_steps
    device = torch.device(("cuda" if cuda else "cpu") if cfg.device == "auto" else cfg.device)
    train_cfg = tc.TrainCorpusConfig(
        models_dir=cfg.out_dir,
        corpus_dir=cfg.corpus_dir,
        max_files=p["max_files"],
        vocab_size=p["vocab_size"],
        seq_len=p["seq_len"],
        max_seq_len=p["max_seq_len"],
        batch_size=p["batch_size"],
        max_steps=p["max_steps"],
        lr=p["lr"],
        warmup_steps=min(p["warmup_steps"], p["max_steps"]),
        eval_batches=4 if preset == "tiny" else 20,
        seed=cfg.seed,
    )
    train_files, held_files = tc.corpus_files(train_cfg)
    print(f"code model ({preset}, {device}): {len(train_files)} training files")
    tok = tc.train_tokenizer(train_files, train_cfg.vocab_size)
    out = Path(cfg.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok_path = out.with_name(f".{out.name}.tokenizer.json")
    tok.save(str(tok_path))
    train, val = tc.encode(tok, train_files), tc.encode(tok, held_files)
    eos = tok.token_to_id(tc.EOS)
    args = ModelArgs(
        dim=p["dim"],
        n_layers=p["layers"],
        n_heads=p["heads"],
        n_kv_heads=p["kv_heads"],
        ffn_hidden=p["ffn"],
        vocab_size=tok.get_vocab_size(),
        max_seq_len=p["max_seq_len"],
    )
    torch.manual_seed(cfg.seed)
    model = build_model(args, seed=cfg.seed).to(device)
    print(f"{model.num_params() / 1e6:.2f} M parameters, {len(train):,} training tokens")
    train_loss, val_loss, seconds = tc.train_one(model, train, val, train_cfg, device)
    try:
        folder = export_hf(
            model.cpu(), out, tokenizer_json=tok_path, eos_token_id=eos, overwrite=True
        )
    finally:
        tok_path.unlink(missing_ok=True)
    # what chat templates and clients read: the end-of-text token and the longest prompt
    atomic_write_json(
        folder / "tokenizer_config.json",
        {
            "eos_token": tc.EOS,
            "model_max_length": p["max_seq_len"],
            "clean_up_tokenization_spaces": False,
        },
    )
    record = {
        "preset": preset,
        "config": asdict(cfg),
        "settings": p,
        "params": model.num_params(),
        "train_tokens": len(train),
        "heldout_tokens": len(val),
        "train_loss": train_loss,
        "heldout_loss": val_loss,
        "train_seconds": seconds,
        "device": str(device),
    }
    atomic_write_json(folder / "train_record.json", record)
    print(f"train loss {train_loss:.3f}, held-out loss {val_loss:.3f} -> {folder}")
    return record
