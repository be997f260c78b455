"""Offline benchmarks of the engine against its baselines, one JSON record each (GPU).

    python -m project04_llm_inference.bench.offline throughput --reports-dir runs/h200
    python -m project04_llm_inference.bench.offline latency    --reports-dir runs/h200
    python -m project04_llm_inference.bench.offline memory     --reports-dir runs/h200
    python -m project04_llm_inference.bench.offline prefix     --reports-dir runs/h200

- throughput: N seeded random requests (prompt and output lengths uniform in ranges), every one
  run to exactly its output length (ignore_eos); the engine's output and total tok/s next to the
  static-batch CUDA-graph baseline, transformers `generate` and vLLM on the same requests.
- latency: decode ms/step at batch x context from the engine's step log (pure decode steps only),
  next to the static CUDA-graph baseline at the same shapes and the bandwidth floor.
- memory: sequences held at once in a fixed KV budget, paged (measured) vs static max-length
  allocation (computed).
- prefix: a shared 1,024-token prefix with and without prefix caching; and the cost of caching
  when nothing is shared.

Records go to `<reports_dir>/project04_llm_inference/<name>.json`; `reports_dir` defaults to an
untracked `runs/<UTC time>/` (publishing to `reports/` is a separate, deliberate step).
`python -m project04_llm_inference.report.render <reports_dir>` turns them into tables and charts.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .baselines import Workload, free_cuda, not_measured

PROJECT = "project04_llm_inference"
# Engine counters that accumulate over the engine's life: a run reports their increase.
COUNTERS = ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
            "prefill_tokens_computed", "decode_tokens")  # fmt: skip


# --- configs ---------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    """What every offline benchmark shares."""

    shape: str = "llama-3.2-1b"
    """dummy-weight shape (project04_llm_inference.config.DUMMY_SHAPES) of every system"""
    seed: int = 0
    """seed of the workload (token ids and lengths) and of the dummy weights"""
    gpu_memory_utilization: float = 0.90
    """share of GPU memory the engine may use (weights, activations, KV pool)"""
    reports_dir: str = ""
    """folder of the JSON records (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""


@dataclass
class ThroughputConfig(BenchConfig):
    """Offline throughput on random requests: the engine vs static batching, transformers, vLLM."""

    num_requests: int = 2000
    """requests in the workload"""
    prompt_len: tuple[int, int] = (128, 2048)
    """prompt length range, tokens, uniform, both ends included"""
    output_len: tuple[int, int] = (64, 1024)
    """output length range, tokens, uniform, both ends included; every request runs to its length"""
    max_model_len: int = 4096
    """engine context limit (>= longest prompt + longest output)"""
    static_requests: int = 0
    """requests run through the static CUDA-graph baseline: the first n of the workload; 0: all"""
    static_batch: int = 256
    """static CUDA-graph baseline batch size"""
    transformers_requests: int = 64
    """requests run through transformers generate (~90 ms per step at any batch: all 2,000 would
    take most of an hour); 0 skips it"""
    transformers_batch: int = 64
    """transformers generate batch size"""
    vllm: bool = True
    """also run vLLM where it imports"""
    vllm_gpu_memory_utilization: float = 0.85
    """vLLM's share of GPU memory (the engine is freed before vLLM starts)"""
    num_scheduler_steps: int = 8
    """the engine's decode steps per host round trip (EngineArgs.num_scheduler_steps)"""
    single_step: bool = True
    """also run the engine one step at a time (num_scheduler_steps 1), the same workload"""


@dataclass
class LatencyConfig(BenchConfig):
    """Decode step time vs batch size and context: engine step log, CUDA-graph baseline, floor."""

    batches: tuple[int, ...] = (1, 8, 64, 256)
    """decode batch sizes (sequences per step)"""
    contexts: tuple[int, ...] = (1024, 8192)
    """prompt length of every sequence, tokens: the context at the first decode step"""
    decode_steps: int = 64
    """pure decode steps wanted per shape (after every sequence has finished its prefill)"""
    max_num_batched_tokens: int = 32768
    """engine token budget per step: larger budgets finish the batch's prefill in fewer steps"""
    bandwidth_tb_s: float = 4.3
    """memory bandwidth of the floor, TB/s (H200 measured copy bandwidth, shared/GPU.md)"""
    baseline: bool = True
    """also time the static CUDA-graph baseline at the same shapes"""
    num_scheduler_steps: int = 8
    """also time the engine with this many decode steps per host round trip (1: only single)"""


@dataclass
class MemoryConfig(BenchConfig):
    """Sequences held at once in a fixed KV budget: paged (measured) vs static allocation."""

    num_gpu_blocks: int = 1024
    """KV pool of the engine, blocks (fixed, not sized from free memory)"""
    block_size: int = 16
    """tokens per KV block"""
    max_model_len: int = 4096
    """longest sequence: what a static cache must reserve for every sequence"""
    num_requests: int = 512
    """requests in the workload"""
    prompt_len: tuple[int, int] = (64, 512)
    """prompt length range, tokens, uniform"""
    output_len: tuple[int, int] = (64, 256)
    """output length range, tokens, uniform"""
    max_num_seqs: int = 256
    """engine cap on running sequences (a peak at the cap was bound by it, not by memory)"""


@dataclass
class PrefixConfig(BenchConfig):
    """Prefix caching on a shared prefix, and its cost when nothing is shared."""

    num_requests: int = 500
    """requests per workload"""
    prefix_len: int = 1024
    """tokens every request of the shared workload starts with"""
    unique_len: int = 64
    """tokens after the prefix, different for each request"""
    output_len: int = 64
    """tokens generated per request"""
    overhead_repeats: int = 3
    """timed runs per setting on the unshared workload (median taken; fresh prompts each run)"""
    overhead_target_pct: float = 2.0
    """most slow-down that caching may cost when nothing is shared, %"""


# --- workloads -------------------------------------------------------------------------------


def _token_range(vocab_size: int) -> tuple[int, int]:
    """Ids clear of those tokenizers reserve (Llama-3 keeps its specials in the last 256)."""
    return 3, vocab_size - (256 if vocab_size > 1024 else 0)


def random_workload(n: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
                    vocab_size: int, seed: int) -> Workload:  # fmt: skip
    """n requests with lengths uniform in the closed ranges and uniform random token ids."""
    if n < 1 or prompt_len[0] < 1 or output_len[0] < 1:
        raise ValueError(f"need n >= 1 and positive lengths, got {n}, {prompt_len}, {output_len}")
    if prompt_len[0] > prompt_len[1] or output_len[0] > output_len[1]:
        raise ValueError(f"ranges must be (low, high), got {prompt_len}, {output_len}")
    rng = np.random.default_rng(seed)
    lo, hi = _token_range(vocab_size)
    plens = rng.integers(prompt_len[0], prompt_len[1], size=n, endpoint=True)
    olens = rng.integers(output_len[0], output_len[1], size=n, endpoint=True)
    prompts = [rng.integers(lo, hi, size=int(k)).tolist() for k in plens]
    return Workload(prompts, [int(k) for k in olens])


def shared_prefix_workload(n: int, prefix_len: int, unique_len: int, output_len: int,
                           vocab_size: int, seed: int) -> Workload:  # fmt: skip
    """n requests: one random prefix of prefix_len tokens, then unique_len tokens of their own."""
    rng = np.random.default_rng(seed)
    lo, hi = _token_range(vocab_size)
    prefix = rng.integers(lo, hi, size=prefix_len).tolist()
    return Workload(
        [prefix + rng.integers(lo, hi, size=unique_len).tolist() for _ in range(n)],
        [output_len] * n,
    )


def describe(wl: Workload) -> dict:
    p, o = [len(x) for x in wl.prompts], wl.output_lens
    return {"requests": len(wl), "prompt_tokens": wl.prompt_tokens, "output_tokens": wl.output_tokens,
            "prompt_len_min": min(p), "prompt_len_max": max(p), "prompt_len_mean": statistics.fmean(p),
            "output_len_min": min(o), "output_len_max": max(o), "output_len_mean": statistics.fmean(o)}  # fmt: skip


# --- arithmetic: bytes and floors ------------------------------------------------------------


def _head_dim(c: dict) -> int:
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def param_count(c: dict) -> int:
    """Parameters of a Llama HF config: embeddings (once if tied), attention, MLP, norms."""
    h, d, inter = c["hidden_size"], _head_dim(c), c["intermediate_size"]
    attn = h * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])  # q, o; k, v
    layer = attn + 3 * h * inter + 2 * h  # + gate, up, down; two RMSNorm weights
    emb = c["vocab_size"] * h * (1 if c.get("tie_word_embeddings") else 2)
    return emb + c["num_hidden_layers"] * layer + h


def weight_bytes(c: dict, dtype_bytes: int = 2) -> int:
    """Bytes of weights a decode step reads: all of them (the LM head reads the whole
    embedding; the embedding lookup's few rows are noise), bf16 by default."""
    return param_count(c) * dtype_bytes


def kv_bytes_per_token(c: dict, dtype_bytes: int = 2) -> int:
    """K and V of one token over all layers, bytes."""
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * _head_dim(c) * dtype_bytes


def decode_floor_ms(c: dict, batch: int, context: int, bandwidth_tb_s: float = 4.3) -> float:
    """Least time of one decode step if it only moved its bytes: weights once plus every
    sequence's KV cache, over the bandwidth (TB/s)."""
    nbytes = weight_bytes(c) + batch * context * kv_bytes_per_token(c)
    return nbytes / (bandwidth_tb_s * 1e12) * 1e3


def decode_ms_from_step_log(steps, batch: int) -> tuple[float | None, int]:
    """Median duration (ms) of the pure decode steps of `batch` sequences: no prefill token in
    the step, and exactly `batch` sequences decoding. A multi-step record (k decode steps run
    back to back) counts as k steps of its duration / k. Returns (median or None, steps)."""
    pure = [s for s in steps if s.prefill_tokens == 0 and s.decode_seqs == batch]
    per_step = [s.duration_s / getattr(s, "num_steps", 1) for s in pure]
    n = sum(getattr(s, "num_steps", 1) for s in pure)
    return (statistics.median(per_step) * 1e3 if pure else None), n


def static_max_seqs(budget_bytes: int, max_model_len: int, bytes_per_token: int) -> int:
    """Sequences a static cache holds in the budget: each reserves max_model_len tokens."""
    return budget_bytes // (max_model_len * bytes_per_token)


# --- running the engine ----------------------------------------------------------------------


def _engine():
    """The engine's public API, imported only when a benchmark runs (tests replace this)."""
    from project04_llm_inference import LLM, EngineArgs, SamplingParams

    return LLM, EngineArgs, SamplingParams


def _has_gpu(what: str) -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    print(f"{what}: needs a CUDA GPU and none is visible; skipped (nothing measured, no record)")
    return False


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _shape(cfg: BenchConfig) -> dict:
    from project04_llm_inference.config import DUMMY_SHAPES

    if cfg.shape not in DUMMY_SHAPES:
        raise ValueError(f"shape: unknown {cfg.shape!r}; expected one of {sorted(DUMMY_SHAPES)}")
    return DUMMY_SHAPES[cfg.shape]


def build_llm(cfg: BenchConfig, **engine_kwargs):
    LLM, EngineArgs, _ = _engine()
    args = dict(load_format="dummy", dummy_shape=cfg.shape, seed=cfg.seed,
                gpu_memory_utilization=cfg.gpu_memory_utilization)  # fmt: skip
    return LLM(EngineArgs(**{**args, **engine_kwargs}))


def warm_up(llm, vocab_size: int, seed: int = 12345) -> None:
    """A few short requests before timing: kernel loading, allocator, lazy capture."""
    wl = random_workload(8, (16, 32), (4, 8), vocab_size, seed)  # fits any max_model_len >= 40
    generate(llm, wl, use_tqdm=False)


def generate(llm, wl: Workload, *, use_tqdm: bool = True) -> dict:
    """Run wl through the engine, greedy and exactly output_len tokens each; wall time, the
    engine counters' increase and the step records of this run."""
    _, _, SamplingParams = _engine()
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in wl.output_lens
    ]
    before, n_steps = dict(llm.engine.stats()), len(llm.engine.step_log)
    _sync()
    t0 = time.perf_counter()
    outs = llm.generate(wl.prompts, params, use_tqdm=use_tqdm)
    _sync()
    wall = time.perf_counter() - t0
    after = dict(llm.engine.stats())
    stats = {k: (v - before.get(k, 0) if k in COUNTERS else v) for k, v in after.items()}
    produced = sum(len(o.token_ids) for o in outs)
    return {
        "measured": True,
        "requests": len(wl),
        "prompt_tokens": wl.prompt_tokens,
        "output_tokens": wl.output_tokens,
        "produced_output_tokens": produced,  # == output_tokens unless a request stopped early
        "wall_s": wall,
        "output_tok_s": produced / wall,  # tokens/s
        "total_tok_s": (wl.prompt_tokens + produced) / wall,  # tokens/s
        "stats": stats,
        "steps": list(llm.engine.step_log)[n_steps:],  # not saved: callers summarise
    }


def _drop_steps(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "steps"}


def _save(cfg: BenchConfig, name: str, results: dict, baseline=None) -> Path:
    from shared.results import REPO_ROOT, save_result

    if not cfg.reports_dir:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        cfg.reports_dir = str(
            REPO_ROOT / "runs" / stamp
        )  # later benchmarks of this process join it
    path = save_result(PROJECT, name, results, baseline=baseline, config=asdict(cfg),
                       reports_dir=cfg.reports_dir)  # fmt: skip
    print(f"wrote {path}")
    return path


def _table(title: str, rows: list[dict], columns: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for _, header in columns:
        t.add_column(header, justify="right")
    for r in rows:
        t.add_row(*(_cell(r.get(k)) for k, _ in columns))
    Console().print(t)


def _cell(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _subsample_note(n: int, total: int) -> str | None:
    if n >= total:
        return None
    return (f"ran the first {n} of {total} requests (same arrival order); its rates are measured "
            "on those, nothing is scaled")  # fmt: skip


# --- throughput ------------------------------------------------------------------------------


def run_throughput(cfg: ThroughputConfig) -> dict | None:
    if not _has_gpu("throughput"):
        return None
    from .baselines import generate_static, run_transformers, run_vllm

    c = _shape(cfg)
    wl = random_workload(
        cfg.num_requests, cfg.prompt_len, cfg.output_len, c["vocab_size"], cfg.seed
    )
    res: dict = {"workload": describe(wl)}

    runs = [("engine", cfg.num_scheduler_steps)]
    if cfg.single_step and cfg.num_scheduler_steps != 1:
        runs.append(("engine_single_step", 1))
    for key, k in runs:
        llm = build_llm(cfg, max_model_len=cfg.max_model_len, num_scheduler_steps=k)
        warm_up(llm, c["vocab_size"])
        print(f"engine: {len(wl)} requests, {k} decode step(s) per host round trip")
        res[key] = {**_drop_steps(generate(llm, wl)), "num_scheduler_steps": k}
        del llm
        free_cuda()

    n = cfg.static_requests or len(wl)
    res["static_cuda_graph"] = generate_static(c, wl.head(n), batch_size=cfg.static_batch)
    res["static_cuda_graph"]["subsample"] = _subsample_note(n, len(wl))
    if cfg.transformers_requests:
        n = min(cfg.transformers_requests, len(wl))
        res["transformers"] = run_transformers(c, wl.head(n), batch_size=cfg.transformers_batch)
        res["transformers"]["subsample"] = _subsample_note(n, len(wl))
    else:
        res["transformers"] = not_measured("skipped: --transformers-requests 0")
    res["vllm"] = (
        run_vllm(wl, c, max_model_len=cfg.max_model_len,
                 gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, seed=cfg.seed)
        if cfg.vllm else not_measured("skipped: --no-vllm")
    )  # fmt: skip
    res["ratios"] = throughput_ratios(res)
    _save(cfg, "offline_throughput", res,
          baseline={k: res[k].get("output_tok_s") for k in BASELINES})  # fmt: skip
    rows = [
        {"system": k, **res[k]} for k in ("engine", "engine_single_step", *BASELINES) if k in res
    ]
    _table("offline throughput (output tok/s, total tok/s: useful tokens over wall time)", rows,
           [("system", "system"), ("requests", "requests"), ("output_tok_s", "output tok/s"),
            ("total_tok_s", "total tok/s"), ("wall_s", "wall s"), ("reason", "note")])  # fmt: skip
    return res


BASELINES = ("static_cuda_graph", "transformers", "vllm")


def throughput_ratios(res: dict) -> dict:
    """Engine output tok/s over each measured baseline's (None where a side was not measured)."""
    ours = res.get("engine", {}).get("output_tok_s")
    out = {}
    for k in ("engine_single_step", *BASELINES):
        theirs = res.get(k, {}).get("output_tok_s")
        out[f"engine_vs_{k}"] = ours / theirs if ours and theirs else None
    return out


# --- latency ---------------------------------------------------------------------------------


def latency_plan(cfg: LatencyConfig) -> list[dict]:
    """Per (batch, context): the output length that keeps every sequence decoding for
    `decode_steps` steps after the last prefill chunk (early sequences decode while later ones
    prefill, one token per step), with a 25% margin for imperfect packing."""
    plan = []
    for ctx in cfg.contexts:
        for b in cfg.batches:
            prefill_steps = math.ceil(b * ctx / cfg.max_num_batched_tokens)
            max_tokens = math.ceil(1.25 * prefill_steps) + cfg.decode_steps + 16
            plan.append({"batch": b, "context": ctx, "max_tokens": max_tokens})
    return plan


def run_latency(cfg: LatencyConfig) -> dict | None:
    if not _has_gpu("latency"):
        return None
    from .baselines import decode_step_ms

    c = _shape(cfg)
    plan = latency_plan(cfg)
    max_len = max(p["context"] + p["max_tokens"] for p in plan)
    llm = build_llm(cfg, max_model_len=max_len, max_num_seqs=max(cfg.batches),
                    max_num_batched_tokens=cfg.max_num_batched_tokens, enable_prefix_caching=False,
                    cuda_graph_max_batch=max(cfg.batches))  # fmt: skip
    warm_up(llm, c["vocab_size"])
    rows = []
    for i, p in enumerate(plan):
        b, ctx = p["batch"], p["context"]
        wl = random_workload(b, (ctx, ctx), (p["max_tokens"],) * 2, c["vocab_size"], cfg.seed + i)
        print(f"engine: batch {b}, context {ctx}, {p['max_tokens']} tokens each")
        llm.engine.args.num_scheduler_steps = 1
        r = generate(llm, wl, use_tqdm=False)
        ms, n = decode_ms_from_step_log(r["steps"], b)
        floor = decode_floor_ms(c, b, ctx, cfg.bandwidth_tb_s)
        row = {
            "batch": b, "context": ctx, "context_max": ctx + p["max_tokens"],
            "engine_ms": ms, "engine_pure_steps": n, "engine_preemptions": r["stats"].get("num_preemptions"),
            "engine_tok_s": b / ms * 1e3 if ms else None, "floor_ms": floor,
            "engine_vs_floor": ms / floor if ms else None,
        }  # fmt: skip
        if cfg.num_scheduler_steps > 1:
            # the same engine (weights, pool, graphs) with multi-step decoding switched on
            k = llm.engine.args.num_scheduler_steps = cfg.num_scheduler_steps
            print(f"engine, {k} steps per round trip: batch {b}, context {ctx}")
            r = generate(llm, wl, use_tqdm=False)
            ms_k, n_k = decode_ms_from_step_log(r["steps"], b)
            row.update({"multi_step_k": k, "engine_multi_ms": ms_k, "engine_multi_pure_steps": n_k,
                        "engine_multi_tok_s": b / ms_k * 1e3 if ms_k else None,
                        "engine_multi_vs_floor": ms_k / floor if ms_k else None})  # fmt: skip
        rows.append(row)
    del llm
    free_cuda()
    for row in rows:
        row["static_cuda_graph_ms"] = None
        if cfg.baseline:
            print(f"static CUDA-graph baseline: batch {row['batch']}, context {row['context']}")
            try:
                row["static_cuda_graph_ms"] = decode_step_ms(c, row["batch"], row["context"])
            except Exception as e:  # an OOM at one shape must not lose the others
                row["static_cuda_graph_error"] = f"{type(e).__name__}: {e}"[:300]
                free_cuda()
        s = row["static_cuda_graph_ms"]
        row["static_cuda_graph_tok_s"] = row["batch"] / s * 1e3 if s else None
        row["engine_vs_static_cuda_graph"] = (
            s / row["engine_ms"] if s and row["engine_ms"] else None
        )
    res = {
        "rows": rows,
        "bandwidth_tb_s": cfg.bandwidth_tb_s,
        "weight_bytes": weight_bytes(c),
        "params": param_count(c),
        "kv_bytes_per_token": kv_bytes_per_token(c),
        "note": "engine ms: median of pure decode steps (no prefill token, all `batch` sequences "
        "decoding); their context grows from `context` to at most `context_max` during those "
        "steps. Floor and baseline are at `context`. multi-step: the same engine running "
        "`multi_step_k` decode steps per host round trip (EngineArgs.num_scheduler_steps); its "
        "ms per step is each run's duration / k.",
    }
    _save(cfg, "decode_latency", res,
          baseline={"static_cuda_graph_ms": [r["static_cuda_graph_ms"] for r in rows]})  # fmt: skip
    _table("decode step (ms; tok/s = batch / step time)", rows,
           [("batch", "batch"), ("context", "context"), ("engine_ms", "engine ms"),
            ("engine_tok_s", "engine tok/s"), ("engine_multi_ms", "multi-step ms"),
            ("engine_multi_tok_s", "multi-step tok/s"), ("static_cuda_graph_ms", "static graph ms"),
            ("floor_ms", "floor ms"), ("engine_pure_steps", "steps")])  # fmt: skip
    return res


# --- memory ----------------------------------------------------------------------------------


def run_memory(cfg: MemoryConfig) -> dict | None:
    if not _has_gpu("memory"):
        return None
    c = _shape(cfg)
    wl = random_workload(
        cfg.num_requests, cfg.prompt_len, cfg.output_len, c["vocab_size"], cfg.seed
    )
    llm = build_llm(cfg, num_gpu_blocks=cfg.num_gpu_blocks, block_size=cfg.block_size,
                    max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
                    enable_prefix_caching=False)  # fmt: skip
    r = generate(llm, wl)
    del llm
    free_cuda()
    st = r["stats"]
    per_token = kv_bytes_per_token(c)
    blocks, bs = st.get("num_kv_blocks", cfg.num_gpu_blocks), st.get("block_size", cfg.block_size)
    budget = blocks * bs * per_token
    static = static_max_seqs(budget, cfg.max_model_len, per_token)
    peak = st.get("peak_running_seqs")
    res = {
        "workload": describe(wl),
        "num_kv_blocks": blocks,
        "block_size": bs,
        "kv_bytes_per_token": per_token,
        "budget_bytes": budget,
        "budget_tokens": blocks * bs,
        "max_model_len": cfg.max_model_len,
        "paged_peak_running_seqs": peak,
        "paged_capped_by_max_num_seqs": peak is not None and peak >= cfg.max_num_seqs,
        "static_max_seqs": static,
        "paged_vs_static": peak / static if peak and static else None,
        "num_preemptions": st.get("num_preemptions"),
        "output_tok_s": r["output_tok_s"],
    }
    _save(cfg, "kv_memory", res, baseline={"static_max_seqs": static})
    _table(f"sequences held at once in {budget / 2**30:.2f} GiB of KV ({blocks * bs:,} tokens)",
           [res], [("paged_peak_running_seqs", "paged (measured)"),
                   ("static_max_seqs", "static max-length (computed)"),
                   ("paged_vs_static", "ratio"), ("num_preemptions", "preemptions")])  # fmt: skip
    return res


# --- prefix caching --------------------------------------------------------------------------


def run_prefix(cfg: PrefixConfig) -> dict | None:
    if not _has_gpu("prefix"):
        return None
    v = _shape(cfg)["vocab_size"]
    total = cfg.prefix_len + cfg.unique_len
    shared = shared_prefix_workload(cfg.num_requests, cfg.prefix_len, cfg.unique_len,
                                    cfg.output_len, v, cfg.seed)  # fmt: skip
    res: dict = {"shared": {}, "unshared": {}}
    for caching in (False, True):
        key = "on" if caching else "off"
        llm = build_llm(
            cfg, max_model_len=total + cfg.output_len + 64, enable_prefix_caching=caching
        )
        warm_up(llm, v)
        walls = []
        for rep in range(cfg.overhead_repeats):  # fresh random prompts: nothing to hit
            wl = random_workload(cfg.num_requests, (total, total), (cfg.output_len,) * 2, v,
                                 cfg.seed + 1000 + rep)  # fmt: skip
            r = generate(llm, wl, use_tqdm=False)
            walls.append(r["wall_s"])
        res["unshared"][key] = {"wall_s": walls, "median_wall_s": statistics.median(walls),
                                "output_tok_s": wl.output_tokens / statistics.median(walls)}  # fmt: skip
        r = generate(llm, shared)
        res["shared"][key] = {
            **{k: r[k] for k in ("wall_s", "output_tok_s", "total_tok_s")},
            "prefill_tokens_computed": r["stats"].get("prefill_tokens_computed"),
            "prefix_cache_hit_tokens": r["stats"].get("prefix_cache_hits"),
            "prefix_cache_query_tokens": r["stats"].get("prefix_cache_queries"),
        }
        del llm
        free_cuda()
    off, on = res["unshared"]["off"]["median_wall_s"], res["unshared"]["on"]["median_wall_s"]
    res["unshared"]["overhead_pct"] = (on - off) / off * 100
    res["unshared"]["target_pct"] = cfg.overhead_target_pct
    s_off, s_on = res["shared"]["off"], res["shared"]["on"]
    res["shared"]["speedup"] = s_off["wall_s"] / s_on["wall_s"]
    res["shared"]["prompt_tokens"] = shared.prompt_tokens
    res["ttft"] = None
    res["ttft_note"] = ("left to the serving benchmark: the engine's step log does not say which "
                        "request a step served, so time to first token per request is not derived")  # fmt: skip
    _save(cfg, "prefix_caching", res, baseline={"caching_off": s_off})
    _table(f"shared {cfg.prefix_len}-token prefix, {cfg.num_requests} requests",
           [{"caching": k, **res["shared"][k]} for k in ("off", "on")],
           [("caching", "caching"), ("prefill_tokens_computed", "prefill tokens computed"),
            ("output_tok_s", "output tok/s"), ("wall_s", "wall s")])  # fmt: skip
    print(
        f"nothing shared: caching on costs {res['unshared']['overhead_pct']:+.2f}% wall time "
        f"(target <= {cfg.overhead_target_pct}%)"
    )
    return res


# --- command line ----------------------------------------------------------------------------

RUNNERS = {ThroughputConfig: run_throughput, LatencyConfig: run_latency,
           MemoryConfig: run_memory, PrefixConfig: run_prefix}  # fmt: skip
COMMANDS = {"throughput": ThroughputConfig, "latency": LatencyConfig, "memory": MemoryConfig,
            "prefix": PrefixConfig}  # fmt: skip


def main(argv: list[str] | None = None) -> dict | None:
    import tyro

    cfg = tyro.extras.subcommand_cli_from_dict(COMMANDS, args=argv)
    return RUNNERS[type(cfg)](cfg)


if __name__ == "__main__":
    main()
