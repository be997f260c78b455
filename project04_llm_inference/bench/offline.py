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

Headline figures are medians over repetitions with their min-max range (`shared.repeat`):
latency repeats every shape (default 5; the engine one step at a time and multi-step
interleaved), prefix repeats each setting on the unshared workload (default 5, paired by
prompts), throughput runs once per system unless --repeats says otherwise (a 2,000-request run
takes about a minute). Each record's environment holds the GPU's clocks, temperature and power
at the start and end of the run (`shared.gpu_state`).
- memory: sequences held at once in a fixed KV budget, paged (measured) vs static max-length
  allocation (computed).
- prefix: a shared 1,024-token prefix with and without prefix caching; and the cost of caching
  when nothing is shared.

Records go to `<reports_dir>/project04_llm_inference/<name>.json`; `reports_dir` defaults to an
untracked `runs/<UTC time>/` (publishing to `reports/` is a separate, deliberate step).
`python -m project04_llm_inference.report.render <reports_dir>` turns them into tables and charts.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from project04_llm_inference import PROJECT
from shared.hardware import get_gpu
from shared.repeat import Spread, flat, interleave

from .baselines import Workload, free_cuda, not_measured

# The decode floor moves bytes at the copy bandwidth of the H200 (the hardware table), TB/s.
COPY_TB_S = get_gpu("h200-sxm").copy_bandwidth() / 1e12

# Engine counters that accumulate over the engine's life: a run reports their increase.
COUNTERS = (
    "num_preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefill_tokens_computed",
    "decode_tokens",
)


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
    """requests run through transformers generate (far slower than the engine: the whole
    workload would take most of an hour); 0 skips it"""
    transformers_batch: int = 64
    """transformers generate batch size"""
    vllm: bool = True
    """also run vLLM where it imports"""
    vllm_gpu_memory_utilization: float = 0.85
    """vLLM's share of GPU memory (the engine is freed before vLLM starts)"""
    num_scheduler_steps: int = 8
    """the engine's decode steps per host round trip (EngineArgs.num_scheduler_steps)"""
    max_num_seqs: int = 256
    """the engine's running-batch cap (EngineArgs.max_num_seqs); decode steps up to it are
    captured in CUDA graphs"""
    single_step: bool = True
    """also run the engine one step at a time (num_scheduler_steps 1), the same workload"""
    static_baseline: bool = True
    """also run the static CUDA-graph baseline (on the first --static-requests requests)"""
    repeats: int = 1
    """runs of the workload per engine configuration, median and min-max recorded; runs after
    the first draw fresh token ids of the same lengths, so that no prefix of an earlier run is
    cached. The default is one run, and the record says how many there were. Baselines run
    once."""

    def __post_init__(self) -> None:
        _check_repeats("ThroughputConfig.repeats", self.repeats)
        if self.max_num_seqs < 1:
            raise ValueError(f"ThroughputConfig.max_num_seqs must be >= 1, got {self.max_num_seqs}")


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
    bandwidth_tb_s: float = COPY_TB_S
    """memory bandwidth of the floor, TB/s (default: the H200's copy bandwidth in shared.hardware)"""
    baseline: bool = True
    """also time the static CUDA-graph baseline at the same shapes"""
    sync_single_step: bool = False
    """also time one step at a time with asynchronous scheduling off (EngineArgs.async_scheduling
    False), alternating with the default engine: the same-run baseline of the overlap"""
    gpt_fast: bool = False
    """also time the gpt-fast recipe at the same shapes: the static decode step under
    torch.compile(mode="reduce-overhead", fullgraph=True) (compiles once per shape)"""
    num_scheduler_steps: int = 8
    """also time the engine with this many decode steps per host round trip (1: only single)"""
    repeats: int = 5
    """repetitions per shape, each a full run whose median pure-decode step time is one value;
    the engine one step at a time and multi-step alternate. The static baseline repeats its
    timing on one captured graph after the engine is freed (the engine's KV pool holds most of
    the GPU's memory, so the two cannot be resident together)"""

    max_model_len: int = 0
    """engine context limit; 0: what the plan's longest sequence needs. The decode kernel sizes
    its launch by it, so runs over different shape lists compare only at the same value"""

    def __post_init__(self) -> None:
        _check_repeats("LatencyConfig.repeats", self.repeats)
        if self.max_model_len < 0:
            raise ValueError(f"LatencyConfig.max_model_len must be >= 0, got {self.max_model_len}")


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
    overhead_repeats: int = 5
    """timed runs per setting on the unshared workload (fresh prompts each run; run i of both
    settings has the same prompts, so the overhead is the median of the paired runs' overheads)"""
    overhead_target_pct: float = 2.0
    """most slow-down that caching may cost when nothing is shared, %"""

    def __post_init__(self) -> None:
        _check_repeats("PrefixConfig.overhead_repeats", self.overhead_repeats)


def _check_repeats(name: str, n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")


# --- workloads -------------------------------------------------------------------------------


def _token_range(vocab_size: int) -> tuple[int, int]:
    """Ids clear of those tokenizers reserve (Llama-3 keeps its specials in the last 256)."""
    return 3, vocab_size - (256 if vocab_size > 1024 else 0)


def random_workload(
    n: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab_size: int, seed: int
) -> Workload:
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


def fresh_ids(wl: Workload, vocab_size: int, seed: int) -> Workload:
    """The same prompt and output lengths with new random token ids: a repeated run whose
    prompts no prefix cache holds."""
    rng = np.random.default_rng(seed)
    lo, hi = _token_range(vocab_size)
    return Workload(
        [rng.integers(lo, hi, size=len(p)).tolist() for p in wl.prompts], list(wl.output_lens)
    )


def shared_prefix_workload(
    n: int, prefix_len: int, unique_len: int, output_len: int, vocab_size: int, seed: int
) -> Workload:
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
    return {
        "requests": len(wl),
        "prompt_tokens": wl.prompt_tokens,
        "output_tokens": wl.output_tokens,
        "prompt_len_min": min(p),
        "prompt_len_max": max(p),
        "prompt_len_mean": statistics.fmean(p),
        "output_len_min": min(o),
        "output_len_max": max(o),
        "output_len_mean": statistics.fmean(o),
    }


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


def decode_floor_ms(c: dict, batch: int, context: int, bandwidth_tb_s: float = COPY_TB_S) -> float:
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
    args = dict(
        load_format="dummy",
        dummy_shape=cfg.shape,
        seed=cfg.seed,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
    )
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
        "steps": llm.engine.step_log[n_steps:],  # not saved: callers summarise
    }


def _drop_steps(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "steps"}


def _save(
    cfg: BenchConfig,
    name: str,
    results: dict,
    baseline=None,
    *,
    gpu_state_start: dict | None = None,
) -> Path:
    from shared.results import output_root, save_result

    # a new runs/<UTC time>/ unless given; later benchmarks of this process join it
    cfg.reports_dir = str(output_root(cfg.reports_dir))
    path = save_result(
        PROJECT,
        name,
        results,
        baseline=baseline,
        config=asdict(cfg),
        reports_dir=cfg.reports_dir,
        gpu_state_start=gpu_state_start,
    )
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


def _gpu_state() -> dict:
    from shared.gpu_state import gpu_state, state_line

    state = gpu_state()
    print(f"GPU at start: {state_line(state)}")
    return state


def _cell(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _subsample_note(n: int, total: int) -> str | None:
    if n >= total:
        return None
    return (
        f"ran the first {n} of {total} requests (same arrival order); its rates are measured "
        "on those, nothing is scaled"
    )


# --- throughput ------------------------------------------------------------------------------


def merge_runs(runs: list[dict]) -> dict:
    """Repeated engine runs of one workload as one entry: rates and wall time are the medians
    with `_min`, `_max` and `_reps` (shared.repeat.flat); counters and the rest are the first
    run's. One run is returned as it is."""
    if len(runs) == 1:
        return runs[0]
    out = {**runs[0], "repeats": len(runs)}
    for key in ("output_tok_s", "total_tok_s", "wall_s"):
        out.update(flat(key, Spread.of(r[key] for r in runs)))
    out["produced_output_tokens"] = min(r["produced_output_tokens"] for r in runs)
    out["stats_note"] = "stats: the first run's"
    return out


def run_throughput(cfg: ThroughputConfig) -> dict | None:
    if not _has_gpu("throughput"):
        return None
    from .baselines import generate_static, run_transformers, run_vllm

    start = _gpu_state()
    c = _shape(cfg)
    wl = random_workload(
        cfg.num_requests, cfg.prompt_len, cfg.output_len, c["vocab_size"], cfg.seed
    )
    res: dict = {
        "workload": describe(wl),
        "repeats": cfg.repeats,
        "repeats_note": _throughput_repeats_note(cfg.repeats),
    }

    runs = [("engine", cfg.num_scheduler_steps)]
    if cfg.single_step and cfg.num_scheduler_steps != 1:
        runs.append(("engine_single_step", 1))
    for key, k in runs:
        llm = build_llm(
            cfg,
            max_model_len=cfg.max_model_len,
            num_scheduler_steps=k,
            max_num_seqs=cfg.max_num_seqs,
            cuda_graph_max_batch=cfg.max_num_seqs,
        )
        warm_up(llm, c["vocab_size"])
        done = []
        for r in range(cfg.repeats):
            w = wl if r == 0 else fresh_ids(wl, c["vocab_size"], cfg.seed + 7919 * r)
            print(
                f"engine: {len(wl)} requests, {k} decode step(s) per host round trip"
                + (f", run {r + 1} of {cfg.repeats}" if cfg.repeats > 1 else "")
            )
            done.append(_drop_steps(generate(llm, w)))
        res[key] = {**merge_runs(done), "num_scheduler_steps": k}
        del llm
        free_cuda()

    n = cfg.static_requests or len(wl)
    if cfg.static_baseline:
        res["static_cuda_graph"] = generate_static(c, wl.head(n), batch_size=cfg.static_batch)
        res["static_cuda_graph"]["subsample"] = _subsample_note(n, len(wl))
    else:
        res["static_cuda_graph"] = not_measured("skipped: --no-static-baseline")
    if cfg.transformers_requests:
        n = min(cfg.transformers_requests, len(wl))
        res["transformers"] = run_transformers(c, wl.head(n), batch_size=cfg.transformers_batch)
        res["transformers"]["subsample"] = _subsample_note(n, len(wl))
    else:
        res["transformers"] = not_measured("skipped: --transformers-requests 0")
    res["vllm"] = (
        run_vllm(
            wl,
            c,
            max_model_len=cfg.max_model_len,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            seed=cfg.seed,
        )
        if cfg.vllm
        else not_measured("skipped: --no-vllm")
    )
    res["ratios"] = throughput_ratios(res)
    _save(
        cfg,
        "offline_throughput",
        res,
        gpu_state_start=start,
        baseline={k: res[k].get("output_tok_s") for k in BASELINES},
    )
    rows = [
        {"system": k, **res[k]} for k in ("engine", "engine_single_step", *BASELINES) if k in res
    ]
    _table(
        "offline throughput (output tok/s, total tok/s: useful tokens over wall time)",
        rows,
        [
            ("system", "system"),
            ("requests", "requests"),
            ("output_tok_s", "output tok/s"),
            ("total_tok_s", "total tok/s"),
            ("wall_s", "wall s"),
            ("reason", "note"),
        ],
    )
    return res


BASELINES = ("static_cuda_graph", "transformers", "vllm")


def _throughput_repeats_note(n: int) -> str:
    if n == 1:
        return (
            "one run per system: a 2,000-request run takes about a minute, so repetitions "
            "are asked for with --repeats"
        )
    return (
        f"the engine's rates are the median of {n} runs of the workload (runs after the "
        "first with fresh token ids of the same lengths), min-max in *_min / *_max; each "
        "engine configuration runs its repetitions back to back (each is a separate engine "
        "instance, not interleaved); the baselines run once"
    )


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
    from . import baselines

    start = _gpu_state()
    c = _shape(cfg)
    plan = latency_plan(cfg)
    max_len = max(p["context"] + p["max_tokens"] for p in plan)
    if cfg.max_model_len:
        if cfg.max_model_len < max_len:
            raise ValueError(
                f"max_model_len: {cfg.max_model_len} is below the {max_len} tokens "
                "the longest shape of the plan needs"
            )
        max_len = cfg.max_model_len
    llm = build_llm(
        cfg,
        max_model_len=max_len,
        max_num_seqs=max(cfg.batches),
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enable_prefix_caching=False,
        cuda_graph_max_batch=max(cfg.batches),
    )
    warm_up(llm, c["vocab_size"])
    rows = []
    k_multi = cfg.num_scheduler_steps
    for i, p in enumerate(plan):
        b, ctx = p["batch"], p["context"]
        wl = random_workload(b, (ctx, ctx), (p["max_tokens"],) * 2, c["vocab_size"], cfg.seed + i)
        print(
            f"engine: batch {b}, context {ctx}, {p['max_tokens']} tokens each, "
            f"{cfg.repeats} repetition(s)"
            + (
                f", one step and {k_multi} steps per round trip (next run queued ahead or not) "
                "alternating"
                if k_multi > 1
                else ""
            )
        )
        counts: dict[int, list[tuple[int, int | None]]] = {1: [], k_multi: [], -k_multi: []}

        def engine_run(k: int, queue_ahead: bool = True, llm=llm, wl=wl, b=b, counts=counts):
            def measure() -> float | None:
                # the same engine (weights, pool, graphs); k decode steps per host round trip,
                # the next step or run queued before the last one's tokens are read (or not)
                llm.engine.args.num_scheduler_steps = k
                llm.engine.args.async_multi_step = queue_ahead
                llm.engine.args.async_scheduling = queue_ahead
                r = generate(llm, wl, use_tqdm=False)
                ms, n = decode_ms_from_step_log(r["steps"], b)
                counts[k if queue_ahead else -k].append((n, r["stats"].get("num_preemptions")))
                return ms

            return measure

        fns = {"engine": engine_run(1)}
        if cfg.sync_single_step:
            counts[-1] = []
            fns["engine_sync"] = engine_run(1, queue_ahead=False)
        if k_multi > 1:
            fns["engine_multi"] = engine_run(k_multi)
            fns["engine_multi_sync"] = engine_run(k_multi, queue_ahead=False)
        reps = interleave(fns, cfg.repeats)
        floor = decode_floor_ms(c, b, ctx, cfg.bandwidth_tb_s)
        eng = reps.spread("engine")
        row = {
            "batch": b,
            "context": ctx,
            "context_max": ctx + p["max_tokens"],
            **flat("engine_ms", eng),
            "engine_pure_steps": min(n for n, _ in counts[1]),
            "engine_preemptions": max((x or 0) for _, x in counts[1]),
            **_per_rep(eng, "engine_tok_s", lambda ms, b=b: b / ms * 1e3),
            "floor_ms": floor,
            "engine_vs_floor": eng.median / floor if eng else None,
        }
        if k_multi > 1:
            multi = reps.spread("engine_multi")
            row.update(
                {
                    "multi_step_k": k_multi,
                    **flat("engine_multi_ms", multi),
                    "engine_multi_pure_steps": min(n for n, _ in counts[k_multi]),
                    **_per_rep(multi, "engine_multi_tok_s", lambda ms, b=b: b / ms * 1e3),
                    "engine_multi_vs_floor": multi.median / floor if multi else None,
                    **flat("engine_multi_sync_ms", reps.spread("engine_multi_sync")),
                    **_per_rep(
                        reps.spread("engine_multi_sync"),
                        "engine_multi_sync_tok_s",
                        lambda ms, b=b: b / ms * 1e3,
                    ),
                }
            )
        if cfg.sync_single_step:
            sync = reps.spread("engine_sync")
            row.update(
                {
                    **flat("engine_sync_ms", sync),
                    **_per_rep(sync, "engine_sync_tok_s", lambda ms, b=b: b / ms * 1e3),
                }
            )
        if reps.errors:
            row["engine_errors"] = reps.errors
        rows.append(row)
    # the timed closures hold the engine (their default argument): drop them with it, or its KV
    # pool stays allocated beside the baselines (at batch 256 they then ran out of memory)
    engine_run = fns = reps = None  # noqa: F841
    del llm
    free_cuda()
    for row in rows:
        row["static_cuda_graph_ms"] = None
        if cfg.baseline:
            print(f"static CUDA-graph baseline: batch {row['batch']}, context {row['context']}")
            try:
                times = baselines.decode_step_times(c, row["batch"], row["context"], cfg.repeats)
                row.update(flat("static_cuda_graph_ms", Spread.of(times)))
            except Exception as e:  # an OOM at one shape must not lose the others
                row["static_cuda_graph_error"] = f"{type(e).__name__}: {e}"[:300]
                free_cuda()
        if cfg.gpt_fast:
            print(f"gpt-fast baseline: batch {row['batch']}, context {row['context']}")
            try:
                times = baselines.decode_step_times_compiled(
                    c, row["batch"], row["context"], cfg.repeats
                )
                row.update(flat("gpt_fast_ms", Spread.of(times)))
                row["gpt_fast_tok_s"] = row["batch"] / row["gpt_fast_ms"] * 1e3
            except Exception as e:  # a compile failure at one shape must not lose the others
                row["gpt_fast_error"] = f"{type(e).__name__}: {e}"[:300]
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
        "max_model_len": max_len,
        "repeats": cfg.repeats,
        "note": "engine ms: in each repetition, the median of its pure decode steps (no prefill "
        "token, all `batch` sequences decoding), whose context grows from `context` to at most "
        f"`context_max`; the figure is the median over {cfg.repeats} repetition(s), min-max in "
        "*_min / *_max. Floor and baseline are at `context`. multi-step: the same engine running "
        "`multi_step_k` decode steps per host round trip (EngineArgs.num_scheduler_steps), "
        "the next run queued before the last one's tokens are read (EngineArgs.async_multi_step), "
        "and, as its same-run baseline, without that; the three alternate in every repetition; "
        "multi-step ms per step is each run's duration / k. The static baseline's repetitions run "
        "after the engine is freed; "
        "engine / static is the ratio of their medians.",
    }
    _save(
        cfg,
        "decode_latency",
        res,
        gpu_state_start=start,
        baseline={"static_cuda_graph_ms": [r["static_cuda_graph_ms"] for r in rows]},
    )
    _table(
        "decode step (ms; tok/s = batch / step time)",
        rows,
        [
            ("batch", "batch"),
            ("context", "context"),
            ("engine_ms", "engine ms"),
            ("engine_tok_s", "engine tok/s"),
            ("engine_multi_ms", "multi-step ms"),
            ("engine_multi_tok_s", "multi-step tok/s"),
            ("engine_multi_sync_ms", "multi-step, no queue-ahead ms"),
            ("static_cuda_graph_ms", "static graph ms"),
            ("floor_ms", "floor ms"),
            ("engine_pure_steps", "steps"),
        ],
    )
    return res


def _per_rep(spread: Spread | None, name: str, f) -> dict:
    """flat() of a figure derived from each repetition (tok/s from ms): its own median and range."""
    return flat(name, spread.map(f) if spread else None)


# --- memory ----------------------------------------------------------------------------------


def run_memory(cfg: MemoryConfig) -> dict | None:
    if not _has_gpu("memory"):
        return None
    start = _gpu_state()
    c = _shape(cfg)
    wl = random_workload(
        cfg.num_requests, cfg.prompt_len, cfg.output_len, c["vocab_size"], cfg.seed
    )
    llm = build_llm(
        cfg,
        num_gpu_blocks=cfg.num_gpu_blocks,
        block_size=cfg.block_size,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        enable_prefix_caching=False,
    )
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
    _save(cfg, "kv_memory", res, baseline={"static_max_seqs": static}, gpu_state_start=start)
    _table(
        f"sequences held at once in {budget / 2**30:.2f} GiB of KV ({blocks * bs:,} tokens)",
        [res],
        [
            ("paged_peak_running_seqs", "paged (measured)"),
            ("static_max_seqs", "static max-length (computed)"),
            ("paged_vs_static", "ratio"),
            ("num_preemptions", "preemptions"),
        ],
    )
    return res


# --- prefix caching --------------------------------------------------------------------------


def run_prefix(cfg: PrefixConfig) -> dict | None:
    if not _has_gpu("prefix"):
        return None
    start = _gpu_state()
    v = _shape(cfg)["vocab_size"]
    total = cfg.prefix_len + cfg.unique_len
    shared = shared_prefix_workload(
        cfg.num_requests, cfg.prefix_len, cfg.unique_len, cfg.output_len, v, cfg.seed
    )
    res: dict = {"shared": {}, "unshared": {}}
    # Both engines resident, so their runs alternate and the GPU's clock and thermal drift fall
    # on both sides of each pair: caching off takes half the memory budget, caching on the same
    # number of KV blocks (the workload needs a fraction of either).
    max_len = total + cfg.output_len + 64
    llms = {
        "off": build_llm(
            cfg,
            max_model_len=max_len,
            enable_prefix_caching=False,
            gpu_memory_utilization=cfg.gpu_memory_utilization / 2,
        )
    }
    blocks = llms["off"].engine.stats().get("num_kv_blocks")
    llms["on"] = build_llm(
        cfg, max_model_len=max_len, enable_prefix_caching=True, num_gpu_blocks=blocks
    )
    for key in llms:
        warm_up(llms[key], v)
    walls: dict[str, list[float]] = {"off": [], "on": []}
    for rep in range(cfg.overhead_repeats):  # fresh random prompts: nothing to hit
        wl = random_workload(
            cfg.num_requests, (total, total), (cfg.output_len,) * 2, v, cfg.seed + 1000 + rep
        )
        for key in ("off", "on") if rep % 2 == 0 else ("on", "off"):  # who goes first alternates
            walls[key].append(generate(llms[key], wl, use_tqdm=False)["wall_s"])
    for key in ("off", "on"):
        w = walls[key]
        res["unshared"][key] = {
            "wall_s": w,
            "median_wall_s": statistics.median(w),
            "min_wall_s": min(w),
            "max_wall_s": max(w),
            "output_tok_s": wl.output_tokens / statistics.median(w),
        }
        r = generate(llms[key], shared)
        res["shared"][key] = {
            **{k: r[k] for k in ("wall_s", "output_tok_s", "total_tok_s")},
            "prefill_tokens_computed": r["stats"].get("prefill_tokens_computed"),
            "prefix_cache_hit_tokens": r["stats"].get("prefix_cache_hits"),
            "prefix_cache_query_tokens": r["stats"].get("prefix_cache_queries"),
        }
    res["num_kv_blocks"] = blocks
    del llms
    free_cuda()
    # Run i of both settings had the same prompts: the overhead is the median of the pairs'.
    off, on = (Spread.of(res["unshared"][k]["wall_s"]) for k in ("off", "on"))
    overhead = Spread.of((b - a) / a * 100 for a, b in zip(off.values, on.values))
    res["unshared"].update(flat("overhead_pct", overhead))
    res["unshared"]["target_pct"] = cfg.overhead_target_pct
    res["unshared"]["note"] = (
        "overhead_pct: median over the paired runs (run i of each setting has the same prompts) "
        "of (on - off) / off; both engines resident (the same number of KV blocks), their runs "
        "alternating and who goes first alternating by pair"
    )
    s_off, s_on = res["shared"]["off"], res["shared"]["on"]
    res["shared"]["speedup"] = s_off["wall_s"] / s_on["wall_s"]
    res["shared"]["prompt_tokens"] = shared.prompt_tokens
    res["ttft"] = None
    res["ttft_note"] = (
        "left to the serving benchmark: the engine's step log does not say which "
        "request a step served, so time to first token per request is not derived"
    )
    _save(cfg, "prefix_caching", res, baseline={"caching_off": s_off}, gpu_state_start=start)
    _table(
        f"shared {cfg.prefix_len}-token prefix, {cfg.num_requests} requests",
        [{"caching": k, **res["shared"][k]} for k in ("off", "on")],
        [
            ("caching", "caching"),
            ("prefill_tokens_computed", "prefill tokens computed"),
            ("output_tok_s", "output tok/s"),
            ("wall_s", "wall s"),
        ],
    )
    print(
        f"nothing shared: caching on costs {overhead.median:+.2f}% wall time (median of "
        f"{overhead.n}, {overhead.min:+.2f}% to {overhead.max:+.2f}%; target <= "
        f"{cfg.overhead_target_pct}%)"
    )
    return res


# --- command line ----------------------------------------------------------------------------

RUNNERS = {
    ThroughputConfig: run_throughput,
    LatencyConfig: run_latency,
    MemoryConfig: run_memory,
    PrefixConfig: run_prefix,
}
COMMANDS = {
    "throughput": ThroughputConfig,
    "latency": LatencyConfig,
    "memory": MemoryConfig,
    "prefix": PrefixConfig,
}


def main(argv: list[str] | None = None) -> dict | None:
    import tyro

    cfg = tyro.extras.subcommand_cli_from_dict(COMMANDS, args=argv)
    return RUNNERS[type(cfg)](cfg)


if __name__ == "__main__":
    main()
