"""What structured output costs per token: decode steps of a batch whose requests all follow a
JSON schema, against the same batch decoding freely.

    python -m project04_llm_inference.bench.structured --batches 1 64
    python -m project04_llm_inference.bench.structured --model MODEL_DIR   # its tokenizer

Dummy weights of `shape`; the vocabulary the grammar works over is the model folder's
tokenizer.json (`--model`), or, without one, a synthetic byte-level vocabulary of the shape's
size (the 256 byte symbols and random lowercase words up to the vocabulary size: the mask's work
grows with the vocabulary, not with which words it holds). Each batch size is timed three ways,
in one engine: free requests with asynchronous scheduling (the default), free requests with
synchronous scheduling, and constrained requests (which run synchronously: see `llm_engine`).
The overhead is constrained / free (asynchronous) - 1, the figure a user sees; the record also
keeps the synchronous time, which separates the mask's own work from the overlap it gives up.
One record: `structured_cost.json`.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from shared.cli import main_guard

# a list of records, realistic structure; its minItems keeps every timed step under the
# grammar (a list that could close would let a random-weight request finish its JSON early)
SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 100_000,
            "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["id", "name"],
            },
        }
    },
    "required": ["items"],
}


@dataclass
class StructuredBenchConfig:
    """Per-token cost of the structured-output mask at several batch sizes."""

    batches: list[int] = field(default_factory=lambda: [1, 64])
    """Sequences decoding together."""
    steps: int = 64
    """Decode steps timed per mode (after the prefill and a warm-up)."""
    context: int = 128
    """Prompt tokens per request."""
    repeats: int = 3
    """Runs of each mode; the fastest is kept (the others lost time to something else)."""
    shape: str = "llama-3.2-1b"
    """Dummy-weight shape (its vocabulary size sets the synthetic vocabulary's)."""
    model: str | None = None
    """A model folder whose config.json and tokenizer.json to use (weights stay dummy)."""
    device: str = "auto"
    """'cuda', 'cpu' or 'auto'."""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty:
    runs/<UTC time>/"""


def synthetic_model_dir(shape: str, seed: int = 0, vocab_size: int | None = None) -> Path:
    """A folder with the shape's config.json and a byte-level BPE tokenizer.json of its
    vocabulary size, or `vocab_size` (no merges: any id decodes; encoding falls back to bytes).
    <unk> <s> </s> (0 1 2) are special tokens: the end-of-text token decodes to no text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from ..config import DUMMY_SHAPES

    cfg = dict(DUMMY_SHAPES[shape], model_type="llama")
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
    # 3 special ids and the 256 byte symbols at least: a smaller shape's vocabulary grows
    v = cfg["vocab_size"] = max(cfg["vocab_size"], 259)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(vocab) < v:
        w = ("Ġ" if rng.random() < 0.5 else "") + "".join(
            rng.choice(letters) for _ in range(rng.randint(2, 9))
        )
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    d = Path(tempfile.mkdtemp(prefix="structured-bench-"))
    tok.save(str(d / "tokenizer.json"))
    cfg |= dict(bos_token_id=1, eos_token_id=2)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(llm, batch: int, steps: int, context: int, constrained: bool, asyn: bool) -> dict:
    """ms per decode step of `batch` requests, after their prefill and a warm-up."""
    from .. import SamplingParams, StructuredOutputsParams

    eng = llm.engine
    eng.args.async_scheduling = asyn
    so = StructuredOutputsParams(json=SCHEMA) if constrained else None
    g = torch.Generator().manual_seed(batch)
    for i in range(batch):
        ids = torch.randint(3, min(1000, eng.vocab_size), (context,), generator=g).tolist()
        p = SamplingParams(
            max_tokens=steps + 32, temperature=1.0, seed=i, ignore_eos=True, structured_outputs=so
        )
        eng.add_request(f"{batch}-{constrained}-{asyn}-{i}", ids, p)
    while eng.scheduler.waiting or any(
        s.num_computed_tokens < len(s.prompt_token_ids) for s in eng.scheduler.running
    ):
        eng.step()
    for _ in range(4):
        eng.step()
    seqs = list(eng.scheduler.running)
    _sync(eng.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    _sync(eng.device)
    ms = (time.perf_counter() - t0) / steps * 1e3
    # tokens sampled under an active grammar (one that took EOS constrains no more)
    active = sum(s.grammar is not None and s.grammar.active for s in seqs)
    while eng.has_unfinished():
        eng.step()
    return {"ms_per_step": ms, "constrained_at_end": active if constrained else 0}


def run(cfg: StructuredBenchConfig) -> dict:
    from .. import LLM

    model = cfg.model or str(synthetic_model_dir(cfg.shape))
    llm = LLM(
        model=model,
        load_format="dummy",
        device=cfg.device,
        max_model_len=cfg.context + cfg.steps + 128,
        max_num_seqs=max(cfg.batches),
        max_num_batched_tokens=max(8192, max(cfg.batches) * cfg.context),
    )
    rows = []
    for b in cfg.batches:

        def best(constrained: bool, asyn: bool, b=b) -> dict:
            runs = [
                time_steps(llm, b, cfg.steps, cfg.context, constrained, asyn)
                for _ in range(cfg.repeats)
            ]
            return min(runs, key=lambda r: r["ms_per_step"])

        free, free_sync, con = best(False, True), best(False, False), best(True, True)
        row = {
            "batch": b,
            "free_ms_per_step": free["ms_per_step"],
            "free_sync_ms_per_step": free_sync["ms_per_step"],
            "constrained_ms_per_step": con["ms_per_step"],
            "constrained_active_at_end": con["constrained_at_end"],
            "overhead": con["ms_per_step"] / free["ms_per_step"] - 1,
            "overhead_vs_sync": con["ms_per_step"] / free_sync["ms_per_step"] - 1,
        }
        print(
            f"batch {b}: free {row['free_ms_per_step']:.3f} ms/step "
            f"(sync {row['free_sync_ms_per_step']:.3f}), constrained "
            f"{row['constrained_ms_per_step']:.3f}: overhead {100 * row['overhead']:.1f}%"
        )
        rows.append(row)
    from shared.results import output_root, save_result

    cfg.reports_dir = str(output_root(cfg.reports_dir))
    res = {
        "rows": rows,
        "vocab_size": llm.engine.vocab_size,
        "device": str(llm.engine.device),
        "schema": SCHEMA,
        "target_overhead_at_64": 0.05,
    }
    out = save_result(
        "project04_llm_inference",
        "structured_cost",
        res,
        config=asdict(cfg),
        reports_dir=cfg.reports_dir,
    )
    print(f"wrote {out}")
    return res


@main_guard
def main(argv: list[str] | None = None) -> None:
    import tyro

    prog = "python -m project04_llm_inference.bench.structured"
    doc = __doc__.split("\n\n")[0]
    run(tyro.cli(StructuredBenchConfig, args=argv, prog=prog, description=doc))


if __name__ == "__main__":
    main()
