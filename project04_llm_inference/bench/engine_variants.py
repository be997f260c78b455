"""The engine against itself in other precisions and splits: FP8 weights, an FP8 KV cache and
tensor parallelism, each timed next to the plain engine (the first variant) in the same process.

A variant is a weight precision, optionally an FP8 KV cache ("-kvfp8") and a tensor-parallel
size ("bf16", "fp8", "bf16-kvfp8", "fp8-kvfp8", "bf16-tp2", "fp8-kvfp8-tp2"). Each row also
records the KV pool's size in blocks that `gpu_memory_utilization` left (an FP8 cache's block
takes half the bytes). FP8 weights: "fp8" is the engine's dispatch, decode steps of one and
two tokens on the GEMV kernel's FP8 variant (e4m3 weights, bf16 activations) and larger ones
on `torch._scaled_mm` (W8A8); "fp8-scaledmm" (one GPU only) runs `_scaled_mm` at every batch
size, as FP8 ran before that variant existed, so the two side by side show what the FP8 GEMV
buys at batch 1. Each row says whether its decode steps took the FP8 GEMV (`fp8_gemv`).
For each batch size, `batch` requests of `context` random prompt tokens generate `output`
tokens greedily (ignore_eos); the same requests with one output token time the prefill, and
the difference is the decode: ms per decode step (the latency a token costs at that batch) and
output tok/s of the decode phase. Tensor-parallel variants also give rank 0's time in the
collectives (two all-reduces a layer, the embedding's and the logits' gather) per decode step,
the same difference taken. Fresh prompts for every timed run (the prefix cache never
hits); medians over `repeats` after a warm-up. The record holds each variant's rows and its
ratios against the first variant.
"""

from __future__ import annotations

import gc
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field

PROJECT = "project04_llm_inference"


@dataclass
class EngineVariantsConfig:
    """Decode latency and throughput of FP8 and tensor-parallel engines against bf16."""

    variants: list[str] = field(default_factory=lambda: ["bf16", "fp8"])
    """'<bf16|fp8|fp8-scaledmm>[-kvfp8][-tp<N>]' ('fp8-scaledmm': FP8 weights without the GEMV
    kernel's FP8 variant, one GPU only); the first is the baseline of the ratios."""
    shape: str = "llama-3.2-1b"
    """dummy-weight shape (project04_llm_inference.config.DUMMY_SHAPES)"""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 64])
    context: int = 1024
    """prompt tokens of every request"""
    output: int = 128
    """generated tokens of every request"""
    repeats: int = 5
    device: str = "auto"
    """'auto', 'cuda' or 'cpu' (the CPU runs float32 for 'bf16': a check of the plumbing)"""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""

    def __post_init__(self) -> None:
        for v in self.variants:
            parse_variant(v)
        if not self.variants:
            raise ValueError("EngineVariantsConfig.variants: give at least one")
        for name in ("context", "output", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineVariantsConfig.{name} must be >= 1")
        if self.output < 2:
            raise ValueError("EngineVariantsConfig.output must be >= 2 (decode steps to time)")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError("EngineVariantsConfig.batch_sizes must be >= 1")


def parse_variant(v: str) -> tuple[str, int, str]:
    """'fp8-kvfp8-tp2' -> ('fp8', 2, 'fp8'): weights, TP size, KV cache dtype ('auto' or 'fp8');
    'fp8-scaledmm' -> ('fp8-scaledmm', 1, 'auto')."""
    m = re.fullmatch(r"(bf16|fp8(?:-scaledmm)?)(-kvfp8)?(?:-tp([1-9][0-9]*))?", v)
    # fp8-scaledmm's switch is a module flag of this process: TP workers would not see it
    if m is None or (m.group(1) == "fp8-scaledmm" and int(m.group(3) or 1) > 1):
        raise ValueError(
            f"variant {v!r}: expected 'bf16' or 'fp8' (or 'fp8-scaledmm', one GPU), optionally "
            "'-kvfp8', then '-tp<N>'"
        )
    return m.group(1), int(m.group(3) or 1), "fp8" if m.group(2) else "auto"


def _time_generate(llm, prompts, n_out: int) -> float:
    import torch

    from project04_llm_inference import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=n_out, ignore_eos=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_variant(cfg: EngineVariantsConfig, variant: str) -> list[dict]:
    import torch

    from project04_llm_inference import LLM, EngineArgs
    from project04_llm_inference.config import DUMMY_SHAPES
    from project04_llm_inference.engine.tp_worker import shutdown
    from project04_llm_inference.kernels import gemv

    prec, tp, kv = parse_variant(variant)
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    vocab = DUMMY_SHAPES[cfg.shape]["vocab_size"]
    saved_fp8_gemv = gemv.FP8_GEMV
    gemv.FP8_GEMV = prec != "fp8-scaledmm"  # read at every call, and when graphs are captured
    try:
        llm = LLM(
            EngineArgs(
                load_format="dummy",
                dummy_shape=cfg.shape,
                device="cuda" if cuda else "cpu",
                max_model_len=cfg.context + cfg.output + 16,
                max_num_seqs=max(cfg.batch_sizes),
                quantization="fp8" if prec.startswith("fp8") else "none",
                tensor_parallel_size=tp,
                kv_cache_dtype=kv,
            )
        )
    except BaseException:
        gemv.FP8_GEMV = saved_fp8_gemv
        raise
    rng = random.Random(0)
    rows = []
    fp8_gemv_route = cuda and prec == "fp8"
    capability = torch.cuda.get_device_capability() if cuda else (0, 0)
    hidden = DUMMY_SHAPES[cfg.shape]["hidden_size"]
    try:
        for b in cfg.batch_sizes:

            def prompts(b=b):
                return [[rng.randrange(vocab) for _ in range(cfg.context)] for _ in range(b)]

            _time_generate(llm, prompts(), cfg.output)  # warm-up
            decode, comm = [], []
            timer = llm.engine.runner.model.tp.timer
            timer.enabled = tp > 1
            for _ in range(cfg.repeats):
                timer.reset()
                full = _time_generate(llm, prompts(), cfg.output)
                full_comm = timer.seconds()
                timer.reset()
                prefill = _time_generate(llm, prompts(), 1)
                comm.append(max(full_comm - timer.seconds(), 0.0))
                decode.append(max(full - prefill, 1e-9))
            timer.enabled = False
            med = statistics.median(decode)
            steps = cfg.output - 1
            rows.append(
                {
                    "variant": variant,
                    "batch": b,
                    "tensor_parallel_size": tp,
                    "kv_cache_dtype": kv,
                    "kv_blocks": llm.engine.runner.num_blocks,
                    "decode_ms_per_step": 1e3 * med / steps,
                    "decode_tok_s": b * steps / med,
                    "collective_ms_per_step": (
                        1e3 * statistics.median(comm) / steps if tp > 1 else None
                    ),
                    "fp8_gemv": fp8_gemv_route
                    and gemv.fp8_route(b, hidden, hidden, torch.bfloat16, "cuda", capability)
                    == "gemv",
                    "decode_s_runs": decode,
                }
            )
            print({k: v for k, v in rows[-1].items() if k != "decode_s_runs"})
    finally:
        gemv.FP8_GEMV = saved_fp8_gemv
        shutdown(llm.engine.runner.model)
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def run(cfg: EngineVariantsConfig) -> dict:
    """Time every variant, save the JSON record, return it."""
    from shared.results import output_root, save_result

    rows = [r for v in cfg.variants for r in run_variant(cfg, v)]
    base = {r["batch"]: r for r in rows if r["variant"] == cfg.variants[0]}
    for r in rows:
        b = base[r["batch"]]
        r["tok_s_vs_baseline"] = r["decode_tok_s"] / b["decode_tok_s"]
    results = {"rows": rows, "baseline_variant": cfg.variants[0]}
    path = save_result(
        PROJECT,
        "engine_variants",
        results,
        baseline=f"the {cfg.variants[0]} engine, same process",
        config=asdict(cfg),
        reports_dir=str(output_root(cfg.reports_dir)),
    )
    print(f"wrote {path}")
    return {**results, "path": str(path)}
