"""`make verify-results`: re-measure the headline figures on this GPU and say, per figure, whether
the new median agrees with the committed one.

    python -m scripts.verify_results                  # every figure in the registry
    python -m scripts.verify_results --only p04       # figures whose key starts with p04
    python -m scripts.verify_results --list           # the registry and the committed values

Each figure names the committed record it comes from (under reports/), where in the record its
value sits, the re-run that measures it again (a benchmark's entry point at reduced size, in a
process of its own, writing into a run folder) and a tolerance with its reason. It prints the
committed value, the new median with its min-max range, the difference and the verdict, with
the GPU's clocks and power at the start and end of each re-run (a slow run is told from a slow
kernel), and writes verify_results.json beside the re-runs' records.

Which figures compare where:
- ratio figures (ours over a baseline measured in the same process) compare on any GPU of the
  same kind (compute capability): clock and thermal state fall on both sides of the ratio;
- absolute figures (ms, tok/s, GB/s, % of a fixed bandwidth) compare only on the GPU model the
  committed record was measured on; elsewhere they are reported as "not comparable here".
Agreement: |new median - committed| <= max(abs, rel x |committed|) of the figure's tolerance.

Exit status: 0 every selected figure was checked and agrees; 1 a figure disagrees, or its
re-run failed or did not produce it; 2 bad arguments; 3 no CUDA GPU here (nothing re-measured:
the committed values are printed); 4 nothing disagreed but some figures could not be checked
here (re-run not wired yet, another GPU model, no committed record), each said by name.
"""

from __future__ import annotations

import datetime as _dt
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared.gpu_state import state_line
from shared.hardware import get_gpu
from shared.repeat import Spread, ratio, read_flat
from shared.results import REPO_ROOT, atomic_write_json, load_result, markdown_table

EXIT_OK, EXIT_DISAGREE, EXIT_NO_GPU, EXIT_UNCHECKED = 0, 1, 3, 4
BUDGET_S = 600.0  # the nightly GPU smoke workflow's allowance for this command on one GPU
P04 = "project04_llm_inference"
P01 = "project01_cuda_kernel"
# The copy bandwidth project04's decode-kernel target is a share of (the H200's, TB/s).
COPY_TB_S = get_gpu("h200-sxm").copy_bandwidth() / 1e12


# --- the registry --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    rel: float = 0.0
    """relative to the committed value"""
    abs: float = 0.0
    """in the figure's unit"""
    reason: str = ""

    def allows(self, committed: float, new: float) -> bool:
        return abs(new - committed) <= max(self.abs, self.rel * abs(committed))

    def text(self, unit: str = "") -> str:
        parts = [f"±{self.rel:.0%}"] if self.rel else []
        parts += [f"±{self.abs:g}{' ' + unit if unit else ''}"] if self.abs else []
        return " or ".join(parts) or "exact"


RATIO = Tolerance(
    rel=0.10,
    reason=(
        "ours over its baseline, measured interleaved in one process: the GPU's clock and thermal "
        "state fall on both sides, so what is left is the run-to-run spread of two medians of five "
        "and the card-to-card spread of one kind; a single run of the project's GEMM benchmark "
        "moves by several percent within an hour (project01's NOTES.md), a median of five less"
    ),
)
ABSOLUTE = Tolerance(
    rel=0.15,
    reason=(
        "an absolute time or rate on the same GPU model: no baseline cancels the SM clock, the power "
        "cap or the host CPU (small-batch decode is partly host-bound), so the allowance is wider "
        "than a ratio's; the GPU state of both runs is printed to tell a slow run from slow code"
    ),
)
HOST_BOUND_RATE = Tolerance(
    rel=0.20,
    reason=(
        "the offline engine's rate on the same GPU model, partly host-bound (scheduling, building "
        "inputs and appending tokens for up to 256 sequences a step): the same code on two "
        "machines of one GPU model ran the same steps with the same device time and different "
        "host time, and a freshly started machine runs slower at first (project04's NOTES.md, "
        "2026-12-04). 20% covers the two hosts seen; the records' cpu_model tells them apart"
    ),
)
BANDWIDTH = Tolerance(
    rel=0.10,
    reason=(
        "achieved memory bandwidth as a share of a fixed copy bandwidth on the same GPU model: a "
        "memory-bound kernel depends on the HBM clock, which does not boost, more than on the SM "
        "clock, so it moves less than a compute-bound time"
    ),
)
PREFIX_OVERHEAD = Tolerance(
    abs=4.0,
    reason=(
        "a difference of a few percent between two wall times of seconds each: a relative "
        "tolerance on a value near zero means nothing, so it is absolute, in percentage points: "
        "a median of five paired runs moves by about the spread of the middle three, which in "
        "prefix_caching.json is under 4 points. Agreement says the cost reproduces to that; the "
        "<= 2% target is read from the record"
    ),
)
CHECKPOINT = Tolerance(
    rel=0.25,
    reason=(
        "time training is held by a checkpoint save: it depends on the filesystem and host memory "
        "bandwidth as much as on the GPU, so it compares only on the same GPU model and loosely"
    ),
)
GEMM_SHARE = Tolerance(
    rel=0.10,
    reason=(
        "a kernel's share of cuBLAS at one shape, the two alternating in one process, so most of "
        "the clock and thermal state falls on both; but the clock a compute-bound kernel settles "
        "at under the power limit depends on its own power draw, so it need not cancel "
        "completely: between two sessions of one day cuBLAS itself moved by about 5% "
        "(project01's NOTES.md), and the allowance is twice that. The repetitions' range is in "
        "gemm.json"
    ),
)
ATTENTION_RATIO = Tolerance(
    rel=0.10,
    reason=(
        "ours over an SDPA backend at one shape, alternating in one process; the committed figures "
        "are medians of five repetitions of short measurements (triton's do_bench defaults), in "
        "which SDPA FLASH alone moved by about 5% between two runs at one shape (project01's "
        "csrc/attention/NOTES.md); the allowance is twice that"
    ),
)
MFU = Tolerance(
    rel=0.10,
    reason=(
        "model FLOP utilisation on the same GPU model: a compute-bound training step, so the SM "
        "clock moves it; the peak it is divided by is the same datasheet figure both times"
    ),
)


@dataclass(frozen=True)
class Rerun:
    """How a committed record is measured again, at reduced size, in a process of its own:
    `python -m <module> <command> <flags...> --reports-dir <run folder>`."""

    key: str
    record: str
    """the record it writes, relative to a reports folder (the committed one is under reports/)"""
    what: str = ""
    """one line: what is run, and how it is reduced"""
    module: str = ""
    command: str = ""
    flags: tuple[str, ...] = ()
    from_committed: tuple[str, ...] = ()
    """config keys of the committed record passed on as flags, so both runs share them"""
    derive: Callable[[dict], list[str]] | None = None
    """more flags computed from the committed record"""
    not_wired: str = ""
    """why this re-run is not wired yet (the figures it serves are reported as such)"""
    timeout_s: int = 600

    def argv(self, committed: dict | None) -> list[str]:
        cfg = (committed or {}).get("config") or {}
        out = [self.module, self.command, *self.flags]
        for key in self.from_committed:
            if key in cfg:
                out += _flag(key, cfg[key])
        if self.derive and committed:
            out += self.derive(committed)
        return out


def _flag(key: str, value) -> list[str]:
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [name if value else "--no-" + key.replace("_", "-")]
    if isinstance(value, (list, tuple)):
        return [name, *map(str, value)]
    return [name, str(value)]


@dataclass(frozen=True)
class Figure:
    key: str
    title: str
    unit: str
    kind: str
    """'ratio' (compares on GPUs of one compute capability) or 'absolute' (same GPU model)"""
    tol: Tolerance
    rerun: str
    path: tuple = ()
    """where the value sits in the record; its `_min`/`_max`/`_reps` siblings give the range"""
    extract: Callable[[dict], Spread | None] | None = None
    """instead of `path`: the value computed from the record"""
    scale: float = 1.0
    """the record's unit times this is the figure's unit (a fraction shown in %)"""
    gpus: int = 1
    """GPUs the figure needs: with fewer, a re-run without it is 'not comparable here'"""

    def value(self, record: dict) -> Spread | None:
        s = self.extract(record) if self.extract else lookup(record, self.path)
        return s.map(lambda v: v * self.scale) if s is not None and self.scale != 1.0 else s


def lookup(record: dict, path: tuple) -> Spread | None:
    """The figure at `path` in `record`: each step a dict key (str), a list index (int) or a
    dict matcher (the one list element whose fields equal the matcher's). The last key's
    `_reps` (shared.repeat.flat) or a {"values": [...]} dict give the repetitions. None when the
    path leads nowhere; ValueError when a matcher fits more than one element."""
    node = record
    for step in path[:-1]:
        if isinstance(step, dict):
            hits = (
                [
                    x
                    for x in node
                    if isinstance(x, dict) and all(x.get(k) == v for k, v in step.items())
                ]
                if isinstance(node, list)
                else []
            )
            if len(hits) > 1:
                raise ValueError(f"{step} matches {len(hits)} elements")
            node = hits[0] if hits else None
        elif isinstance(step, int):
            node = node[step] if isinstance(node, list) and -len(node) <= step < len(node) else None
        else:
            node = node.get(step) if isinstance(node, dict) else None
        if node is None:
            return None
    if not isinstance(node, dict):
        return None
    leaf = node.get(path[-1])
    if isinstance(leaf, dict) and leaf.get("values"):
        return Spread.of(leaf["values"])
    return read_flat(node, path[-1])


def worst_decode_bandwidth_share(record: dict) -> Spread | None:
    """project04's kernel target: the slowest shape at batch 64/256, context >= 8k, in % of the
    copy bandwidth (the report's definition), with that shape's range."""
    rows = [
        r
        for r in record.get("results", {}).get("rows", [])
        if r.get("batch") in (64, 256) and r.get("context", 0) >= 8192 and r.get("ours_gbps")
    ]
    if not rows:
        return None
    worst = min(rows, key=lambda r: r["ours_gbps"])
    return read_flat(worst, "ours_gbps").map(lambda g: g / 1e3 / COPY_TB_S * 100)


def _latency_max_model_len(committed: dict) -> list[str]:
    """The committed run's engine context limit: the decode kernel's launch depends on it, so
    the reduced run (fewer shapes, a shorter longest sequence) is pinned to it."""
    n = committed.get("results", {}).get("max_model_len")
    if not n:
        from project04_llm_inference.bench.offline import LatencyConfig, latency_plan

        cfg = committed.get("config") or {}
        keys = ("batches", "contexts", "decode_steps", "max_num_batched_tokens")
        plan = latency_plan(LatencyConfig(**{k: cfg[k] for k in keys if k in cfg}))
        n = max(p["context"] + p["max_tokens"] for p in plan)
    return ["--max-model-len", str(n)]


def best_gemm_share(dtype: str, size: int) -> Callable[[dict], Spread | None]:
    """project01's GEMM targets: the % of cuBLAS of the best ladder kernel in `dtype` at size³
    (the report's definition, `report.gemm.best_row`), with that row's range."""

    def extract(record: dict) -> Spread | None:
        from project01_cuda_kernel.report.gemm import best_row

        if not (record.get("results") or {}).get("rows"):
            return None
        row = best_row(record, dtype, size)
        return read_flat(row, "pct_of_cublas") if row else None

    return extract


def attention_ratio(
    mode: str,
    base: str | Callable[[dict], str | None],
    *,
    head_dim: int = 128,
    seq_len: int = 4096,
    causal: bool = False,
    provider: str = "ours",
) -> Callable[[dict], Spread | None]:
    """`provider` (ours, or a variant such as ours_hbwd) / `base` in TFLOP/s for one attention
    shape and mode: per repetition (the rows' `tflops_reps`, paired by repetition) or the plain
    ratio for a record of one run. `base` may be a function of the record naming the provider
    (None: the record has none)."""
    shape = dict(head_dim=head_dim, seq_len=seq_len, causal=causal, mode=mode)

    def extract(record: dict) -> Spread | None:
        name = base(record) if callable(base) else base
        if name is None:
            return None
        ours = lookup(record, ("results", "rows", {**shape, "provider": provider}, "tflops"))
        ref = lookup(record, ("results", "rows", {**shape, "provider": name}, "tflops"))
        if ours is None or ref is None or any(v == 0 for v in ref.values):
            return None
        return ratio(ours, ref)

    return extract


def _fa2_backward(record: dict) -> str | None:
    """The provider that ran the FlashAttention-2 backward in an attention record: ours_fa2bwd,
    or ours in records made while "auto" was FA2's (bench.attention.fa2_backward_provider)."""
    from project01_cuda_kernel.bench.attention import fa2_backward_provider

    return fa2_backward_provider(record.get("results") or {})


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch, no driver: the caller's GPU check says why
        return 0


def p02_scaling_flags(committed: dict, gpus: int | None = None) -> list[str]:
    """The training flags of project02's committed scaling record (its `train` config), and the
    world sizes: 1, and 2 where two GPUs are visible (`gpus`: how many; default: this machine's)."""
    train = (committed.get("config") or {}).get("train") or {}
    out = ["--gpus", "1,2" if (visible_gpus() if gpus is None else gpus) >= 2 else "1"]
    keys = ("preset", "global_batch", "micro_batch", "seq_len", "steps", "warmup_steps")
    for key in (*keys, "compile", "attention"):
        if key in train:
            out += _flag(key, train[key])
    return out


def _attention_flags(*providers: str) -> tuple[str, ...]:
    """bench-attention at the figures' one shape (head dim 128, seq 4,096, non-causal), the given
    providers, 5 interleaved repetitions, no charts."""
    return (
        *("--head-dims", "128", "--seq-lens", "4096", "--causal", "False"),
        *("--providers", *providers),
        *("--repeats", "5", "--no-charts"),
    )


RERUNS: dict[str, Rerun] = {
    r.key: r
    for r in (
        Rerun(
            "p04-latency",
            f"{P04}/decode_latency.json",
            "decode latency at batch 1 and 256, context 1,024 (the committed run: more shapes), "
            "5 repetitions, no static baseline; engine settings and context limit as committed",
            P04,
            "latency",
            ("--batches", "1", "256", "--contexts", "1024", "--no-baseline", "--repeats", "5"),
            (
                "decode_steps",
                "max_num_batched_tokens",
                "num_scheduler_steps",
                "shape",
                "gpu_memory_utilization",
            ),
            _latency_max_model_len,
        ),
        Rerun(
            "p04-throughput",
            f"{P04}/offline_throughput.json",
            "offline throughput on the committed workload (the rate depends on its size: fewer "
            "requests leave a larger share of the run draining at low batch), the engine alone, "
            "3 runs (a run takes about a minute)",
            P04,
            "throughput",
            (
                "--no-single-step",
                "--no-static-baseline",
                "--no-vllm",
                "--transformers-requests",
                "0",
                "--repeats",
                "3",
            ),
            (
                "num_requests",
                "prompt_len",
                "output_len",
                "max_model_len",
                "num_scheduler_steps",
                "shape",
                "seed",
                "gpu_memory_utilization",
            ),
        ),
        Rerun(
            "p04-decode-kernel",
            f"{P04}/decode_attention.json",
            "paged decode kernel vs SDPA at batch 64 and 256, contexts 8k-32k (the target's "
            "shapes), 5 interleaved repetitions",
            P04,
            "decode-kernel",
            ("--batches", "64", "256", "--contexts", "8192", "16384", "32768", "--repeats", "5"),
        ),
        Rerun(
            "p04-prefix",
            f"{P04}/prefix_caching.json",
            "prefix caching's cost with nothing shared, the committed workload, 5 paired runs",
            P04,
            "prefix",
            ("--overhead-repeats", "5"),
            ("num_requests", "prefix_len", "unique_len", "output_len", "shape", "seed"),
        ),
        Rerun(
            "p01-gemm",
            f"{P01}/gemm.json",
            "the ladder's top steps (7 in float32, 8 and 9 in bfloat16) against cuBLAS at 4096³ and "
            "8192³ only (the committed run: every step on seven shapes), 5 interleaved repetitions, "
            "timing budgets as committed",
            P01,
            "bench-gemm",
            (
                "--sizes",
                "4096",
                "8192",
                "--shapes",
                "--kernels",
                "sgemm_07_warptiling",
                "hgemm_08_mma_sync",
                "hgemm_09_wgmma_tma",
                "--repeats",
                "5",
                "--no-charts",
            ),
            ("half_dtypes", "warmup_ms", "rep_ms"),
        ),
        Rerun(
            "p01-attention",
            f"{P01}/attention.json",
            "attention forward, backward and fwd+bwd of ours, SDPA FLASH and SDPA cuDNN at head "
            "dim 128, seq 4,096, non-causal, batch 4 x 16 heads (the committed run: 24 shapes, "
            "nine providers), 5 interleaved repetitions, timing budgets as committed",
            P01,
            "bench-attention",
            _attention_flags("ours", "flash", "cudnn"),
            ("total_tokens", "hidden", "dtype", "warmup_ms", "rep_ms"),
        ),
        Rerun(
            "p01-hbwd",
            f"{P01}/attention_hbwd.json",
            "the Hopper backward (ours_hbwd) with ours, the FA2 backward (ours_fa2bwd), SDPA "
            "FLASH and SDPA cuDNN at head dim 128, seq 4,096, non-causal, batch 4 x 16 heads (the committed run: "
            "12 shapes), 5 interleaved repetitions, timing budgets as committed",
            P01,
            "bench-attention",
            (
                *_attention_flags("ours", "ours_hbwd", "ours_fa2bwd", "flash", "cudnn"),
                *("--name", "attention_hbwd"),
            ),
            ("total_tokens", "hidden", "dtype", "warmup_ms", "rep_ms"),
        ),
        Rerun(
            "p02-scaling",
            "project02_fsdp_scaling/scaling_gpu.json",
            "FSDP2 training of the committed preset, batch, steps, compile and attention on one "
            "GPU, and on two where two are visible (the committed run: 1 and 2 GPUs), 3 "
            "interleaved repetitions of each (a 1b job takes about a minute), without the "
            "one-GPU sweep and the profile",
            "project02_fsdp_scaling",
            "scaling",
            ("--no-sweep", "--no-readme", "--no-profile", "--repeats", "3"),
            derive=p02_scaling_flags,
            timeout_s=900,
        ),
        Rerun(
            "p03-checkpoint",
            "project03_capstone_infra/checkpoint_bench.json",
            "sync and async checkpoints of the committed preset and batch on one GPU, as "
            "committed (interval, write threads, steady saves, stager), 3 interleaved repetitions "
            "(each holds training for a sync save), without the pre-staging and resume phases "
            "the figures do not read",
            "project03_capstone_infra",
            "bench-checkpoint",
            ("--no-prestage", "--no-resume", "--repeats", "3"),
            (
                "preset",
                "global_batch",
                "seq_len",
                "ckpt_interval",
                "warmup_steps",
                "timed_steps",
                "write_threads",
                "steady_saves",
                "stager",
            ),
        ),
    )
}


FIGURES: tuple[Figure, ...] = (
    Figure(
        "p04.decode.b1",
        "decode, batch 1, context 1,024, multi-step",
        "ms/token",
        "absolute",
        ABSOLUTE,
        "p04-latency",
        ("results", "rows", dict(batch=1, context=1024), "engine_multi_ms"),
    ),
    Figure(
        "p04.decode.b256",
        "decode, batch 256, context 1,024, multi-step",
        "tok/s",
        "absolute",
        ABSOLUTE,
        "p04-latency",
        ("results", "rows", dict(batch=256, context=1024), "engine_multi_tok_s"),
    ),
    Figure(
        "p04.throughput",
        "offline throughput, engine",
        "output tok/s",
        "absolute",
        HOST_BOUND_RATE,
        "p04-throughput",
        ("results", "engine", "output_tok_s"),
    ),
    Figure(
        "p04.decode_kernel.share",
        "paged decode kernel, worst shape (batch 64/256, >= 8k)",
        f"% of {COPY_TB_S:.1f} TB/s",
        "absolute",
        BANDWIDTH,
        "p04-decode-kernel",
        extract=worst_decode_bandwidth_share,
    ),
    Figure(
        "p04.decode_kernel.vs_sdpa",
        "paged decode kernel / SDPA, batch 256, context 32,768",
        "x",
        "ratio",
        RATIO,
        "p04-decode-kernel",
        ("results", "rows", dict(batch=256, context=32768), "speedup_vs_sdpa"),
    ),
    Figure(
        "p04.prefix.overhead",
        "prefix caching cost, nothing shared",
        "% wall time",
        "ratio",
        PREFIX_OVERHEAD,
        "p04-prefix",
        ("results", "unshared", "overhead_pct"),
    ),
    Figure(
        "p01.gemm.bf16_4096",
        "best bfloat16 GEMM kernel / cuBLAS, 4096³",
        "% of cuBLAS",
        "ratio",
        GEMM_SHARE,
        "p01-gemm",
        extract=best_gemm_share("bfloat16", 4096),
    ),
    Figure(
        "p01.gemm.bf16_8192",
        "best bfloat16 GEMM kernel / cuBLAS, 8192³",
        "% of cuBLAS",
        "ratio",
        GEMM_SHARE,
        "p01-gemm",
        extract=best_gemm_share("bfloat16", 8192),
    ),
    Figure(
        "p01.gemm.fp32_4096",
        "best float32 GEMM kernel / cuBLAS, 4096³",
        "% of cuBLAS",
        "ratio",
        GEMM_SHARE,
        "p01-gemm",
        extract=best_gemm_share("float32", 4096),
    ),
    Figure(
        "p01.attention.fwd",
        "attention forward / SDPA FLASH, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-attention",
        extract=attention_ratio("fwd", "flash"),
    ),
    Figure(
        "p01.attention.fwd_cudnn",
        "attention forward / SDPA cuDNN, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-attention",
        extract=attention_ratio("fwd", "cudnn"),
    ),
    Figure(
        "p01.attention.fwd_bwd",
        "attention fwd+bwd / SDPA FLASH, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-attention",
        extract=attention_ratio("fwd_bwd", "flash"),
    ),
    Figure(
        "p01.attention.fwd_bwd_cudnn",
        "attention fwd+bwd / SDPA cuDNN, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-attention",
        extract=attention_ratio("fwd_bwd", "cudnn"),
    ),
    Figure(
        "p01.attention.bwd",
        "attention backward / SDPA FLASH, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-attention",
        extract=attention_ratio("bwd", "flash"),
    ),
    Figure(
        "p01.hbwd.fwd_bwd_cudnn",
        "attention fwd+bwd with the Hopper backward / SDPA cuDNN, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-hbwd",
        extract=attention_ratio("fwd_bwd", "cudnn", provider="ours_hbwd"),
    ),
    Figure(
        "p01.hbwd.bwd_vs_fa2",
        "the Hopper backward / the FA2 backward, d128, seq 4,096",
        "x",
        "ratio",
        ATTENTION_RATIO,
        "p01-hbwd",
        extract=attention_ratio("bwd", _fa2_backward, provider="ours_hbwd"),
    ),
    Figure(
        "p02.mfu.ws1",
        "FSDP 1b, one GPU, MFU",
        "%",
        "absolute",
        MFU,
        "p02-scaling",
        ("results", "runs", dict(world_size=1), "mfu"),
        scale=100.0,
    ),
    Figure(
        "p02.efficiency.ws2",
        "FSDP 1b, 2 GPUs, scaling efficiency",
        "%",
        "ratio",
        RATIO,
        "p02-scaling",
        ("results", "runs", dict(world_size=2), "efficiency"),
        scale=100.0,
        gpus=2,
    ),
    Figure(
        "p03.ckpt.async_held",
        "async checkpoint, steady state, time training is held",
        "s",
        "absolute",
        CHECKPOINT,
        "p03-checkpoint",
        ("results", "derived", "steady_state", "median_held_s"),
    ),
    Figure(
        "p03.ckpt.sync_held",
        "sync checkpoint, time training is held",
        "s",
        "absolute",
        CHECKPOINT,
        "p03-checkpoint",
        ("results", "derived", "sync", "held_s"),
    ),
)


# --- comparing -----------------------------------------------------------------------------------

STATUSES = {
    "agree": "agrees",
    "disagree": "DISAGREES",
    "not_comparable": "not comparable here",
    "not_wired": "not checked: re-run not wired yet",
    "no_record": "not checked: no committed record",
    "no_value": "FAILED: the re-run did not produce it",
    "rerun_failed": "FAILED: the re-run failed",
    "not_run": "not re-measured",
}
FAILING = {"disagree", "no_value", "rerun_failed"}
UNCHECKED = {"not_comparable", "not_wired", "no_record", "not_run"}


@dataclass
class Check:
    figure: Figure
    status: str
    committed: Spread | None = None
    new: Spread | None = None
    detail: str = ""

    @property
    def diff(self) -> float | None:
        """(new - committed) / |committed| of the medians."""
        if self.committed is None or self.new is None or not self.committed.median:
            return None
        return (self.new.median - self.committed.median) / abs(self.committed.median)

    def to_dict(self) -> dict:
        f = self.figure
        return {
            "figure": f.key,
            "title": f.title,
            "unit": f.unit,
            "kind": f.kind,
            "status": self.status,
            "detail": self.detail,
            "committed": self.committed.to_dict() if self.committed else None,
            "new": self.new.to_dict() if self.new else None,
            "relative_difference": self.diff,
            "tolerance": {"rel": f.tol.rel, "abs": f.tol.abs, "reason": f.tol.reason},
        }


def gpu_kind(env: dict) -> str | None:
    """What a ratio figure compares across: the compute capability ('9.0')."""
    return env.get("compute_capability") or None


def comparable(fig: Figure, committed_env: dict, new_env: dict) -> str:
    """'' when the figure compares between the two environments, else why not."""
    if fig.kind == "ratio":
        a, b = gpu_kind(committed_env), gpu_kind(new_env)
        if not a or not b:
            return "a ratio figure needs the compute capability of both runs"
        return "" if a == b else f"compute capability {b} here, {a} committed"
    a, b = committed_env.get("gpu"), new_env.get("gpu")
    if not a or not b:
        return "an absolute figure needs the GPU model of both runs"
    return "" if a == b else f"absolute figure: measured on {a}, this is {b}"


def committed_value(fig: Figure, committed: dict | None) -> Spread | None:
    return fig.value(committed) if committed else None


def compare(fig: Figure, committed: dict | None, new: dict | None) -> Check:
    """The verdict for one figure from its committed record and the re-run's (either None when
    absent); the re-run's failure is the caller's to report."""
    if committed is None:
        return Check(fig, "no_record", detail=f"no reports/{RERUNS[fig.rerun].record}")
    old = fig.value(committed)
    if old is None:
        return Check(fig, "no_record", detail="the committed record does not hold this figure")
    if new is None:
        return Check(fig, "not_run", old)
    got = fig.value(new)
    if got is None:
        have = (new.get("environment") or {}).get("gpu_count") or 0
        if fig.gpus > 1 and have < fig.gpus:
            return Check(fig, "not_comparable", old, detail=f"needs {fig.gpus} GPUs, {have} here")
        return Check(fig, "no_value", old, detail="the re-run's record does not hold this figure")
    why = comparable(fig, committed.get("environment") or {}, new.get("environment") or {})
    if why:
        return Check(fig, "not_comparable", old, got, why)
    ok = fig.tol.allows(old.median, got.median)
    return Check(
        fig,
        "agree" if ok else "disagree",
        old,
        got,
        f"{'within' if ok else 'outside'} {fig.tol.text(fig.unit)}",
    )


def exit_code(checks: list[Check]) -> int:
    if any(c.status in FAILING for c in checks):
        return EXIT_DISAGREE
    if any(c.status in UNCHECKED for c in checks):
        return EXIT_UNCHECKED
    return EXIT_OK


# --- running -------------------------------------------------------------------------------------


def run_rerun(rerun: Rerun, committed: dict | None, out_dir: Path) -> str:
    """Run `rerun` into out_dir; '' on success, else the reason with its log's last lines."""
    argv = [sys.executable, "-m", *rerun.argv(committed), "--reports-dir", str(out_dir)]
    log = out_dir / f"{rerun.key}.log"
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"== {rerun.key}: {' '.join(argv[2:])}", flush=True)
    try:
        with log.open("w") as f:
            p = subprocess.run(
                argv,
                cwd=REPO_ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=rerun.timeout_s,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return f"timed out after {rerun.timeout_s} s (log: {log})"
    if p.returncode != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        return f"exit status {p.returncode} (log: {log}): {tail}"[:600]
    return ""


def _load(path: Path) -> dict | None:
    return load_result(path) if path.is_file() else None


Runner = Callable[[Rerun, dict | None, Path], str]


@dataclass
class Verification:
    checks: list[Check]
    reruns: dict[str, dict] = field(default_factory=dict)
    """per re-run: status ('ok', 'failed', 'not wired', 'not run'), seconds, the GPU state"""


def verify(
    figures: list[Figure], committed_root: Path, out_dir: Path | None, runner: Runner | None = None
) -> Verification:
    """Re-run what `figures` need into out_dir (None: re-run nothing) with `runner` (default
    `run_rerun`) and compare each figure."""
    runner = runner or run_rerun
    if out_dir is not None and out_dir.resolve() == committed_root.resolve():
        raise ValueError(
            f"--reports-dir: {out_dir} is the committed folder; re-runs write elsewhere"
        )
    result = Verification(checks=[])
    new_records: dict[str, dict | None] = {}
    for key in dict.fromkeys(f.rerun for f in figures):
        rr = RERUNS[key]
        committed = _load(committed_root / rr.record)
        info: dict = {"record": rr.record, "what": rr.what or rr.not_wired}
        if rr.not_wired:
            info["status"] = "not wired"
        elif out_dir is None:
            info["status"] = "not run"
        elif committed is None:
            info["status"] = "not run: no committed record to compare with"
        else:
            (out_dir / rr.record).unlink(missing_ok=True)  # never read a stale record as new
            t0 = time.perf_counter()
            err = runner(rr, committed, out_dir)
            info["seconds"] = round(time.perf_counter() - t0, 1)
            new = None if err else _load(out_dir / rr.record)
            if not err and new is None:
                err = f"it wrote no {rr.record}"
            info["status"] = f"failed: {err}" if err else "ok"
            if new is not None:
                info["gpu_state"] = (new.get("environment") or {}).get("gpu_state")
                info["gpu"] = (new.get("environment") or {}).get("gpu")
                # host-bound figures move with the host: name both CPUs (None: not recorded)
                info["cpu_model"] = (new.get("environment") or {}).get("cpu_model")
                info["committed_cpu_model"] = (committed.get("environment") or {}).get("cpu_model")
            new_records[key] = new
        result.reruns[key] = info
    for fig in figures:
        rr = RERUNS[fig.rerun]
        committed = _load(committed_root / rr.record)
        info = result.reruns[fig.rerun]
        if rr.not_wired:
            c = compare(fig, committed, None)
            result.checks.append(
                c
                if c.status == "no_record"
                else Check(fig, "not_wired", c.committed, detail=f"see {fig.rerun} below")
            )
        elif info["status"].startswith("failed"):
            c = compare(fig, committed, None)
            result.checks.append(
                c
                if c.status == "no_record"
                else Check(fig, "rerun_failed", c.committed, detail=f"see {fig.rerun} below")
            )
        else:
            result.checks.append(compare(fig, committed, new_records.get(fig.rerun)))
    return result


# --- printing ------------------------------------------------------------------------------------


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def spread_text(s: Spread | None) -> str:
    if s is None:
        return "n/a"
    if s.n < 2:
        return f"{_num(s.median)} (1 run)"
    return f"{_num(s.median)} ({_num(s.min)}–{_num(s.max)}, n={s.n})"


def table(checks: list[Check]) -> str:
    rows = [
        {
            "figure": c.figure.key,
            "what": c.figure.title,
            "unit": c.figure.unit,
            "committed": spread_text(c.committed),
            "new": spread_text(c.new),
            "difference": "" if c.diff is None else f"{c.diff:+.1%}",
            "tolerance": f"{c.figure.tol.text(c.figure.unit)} ({c.figure.kind})",
            "verdict": STATUSES[c.status]
            + (f": {c.detail}" if c.detail and c.status != "agree" else ""),
        }
        for c in checks
    ]
    return markdown_table(rows)


def report(v: Verification) -> str:
    lines = [table(v.checks), ""]
    for key, info in v.reruns.items():
        line = f"- {key} ({info['record']}): {info['status']}"
        if info["status"] == "not wired":
            line += f": {info['what']}"
        if "seconds" in info:
            line += f" in {info['seconds']:.0f} s"
        state = info.get("gpu_state") or {}
        if state:
            line += (
                f"; {info.get('gpu')}, start: {state_line(state.get('start'))}; "
                f"end: {state_line(state.get('end'))}"
            )
        if "cpu_model" in info:
            line += (
                f"; host CPU: {info['cpu_model'] or 'not recorded'} (the committed record's: "
                f"{info.get('committed_cpu_model') or 'not recorded'})"
            )
        lines.append(line)
    spent = sum(i.get("seconds", 0) for i in v.reruns.values())
    if spent:
        lines.append(f"- re-runs took {spent:.0f} s in all (allowance {BUDGET_S:.0f} s)")
    lines.append("")
    lines.append("Tolerances:")
    for tol in dict.fromkeys(c.figure.tol for c in v.checks):
        used = ", ".join(c.figure.key for c in v.checks if c.figure.tol == tol)
        unit = next(c.figure.unit for c in v.checks if c.figure.tol == tol)
        lines.append(f"- {tol.text(unit)} ({used}): {tol.reason}")
    counts = {s: sum(c.status == s for c in v.checks) for s in STATUSES}
    lines.append("")
    lines.append("; ".join(f"{n} {STATUSES[s]}" for s, n in counts.items() if n))
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------------


@dataclass
class VerifyConfig:
    """Re-measure the headline figures on this GPU and compare them with the committed records."""

    only: tuple[str, ...] = ()
    """figure keys or key prefixes to check (p04, p04.decode); default: every figure"""
    reports_dir: str = ""
    """folder the re-runs write their records into; empty: runs/verify-<UTC time>/"""
    committed_dir: str = "reports"
    """folder of the committed records (relative to the repository root unless absolute)"""
    list: bool = False
    """print the registry with the committed values and exit (no GPU needed)"""


def select(only: tuple[str, ...]) -> list[Figure]:
    if not only:
        return list(FIGURES)
    got = [f for f in FIGURES if any(f.key.startswith(o) for o in only)]
    if not got:
        raise ValueError(
            f"--only: no figure matches {list(only)}; figures: " + ", ".join(f.key for f in FIGURES)
        )
    return got


def main(argv: list[str] | None = None) -> int:
    from shared.cli import main_guard, parse_dataclass

    @main_guard
    def _main() -> int:
        cfg = parse_dataclass(VerifyConfig, argv, prog="python -m scripts.verify_results")
        figures = select(cfg.only)
        committed = Path(cfg.committed_dir)
        committed = committed if committed.is_absolute() else REPO_ROOT / committed
        if cfg.list:
            print(report(verify(figures, committed, None)))
            return EXIT_OK
        import torch

        if not torch.cuda.is_available():
            print(report(verify(figures, committed, None)))
            print(
                "\nverify-results: no CUDA GPU here, so nothing was re-measured; the committed "
                "values are above. Run it on the GPU the figures were measured on."
            )
            return EXIT_NO_GPU
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path(cfg.reports_dir) if cfg.reports_dir else REPO_ROOT / "runs" / f"verify-{stamp}"
        v = verify(figures, committed, out)
        print(report(v))
        code = exit_code(v.checks)
        atomic_write_json(
            out / "verify_results.json",
            {
                "exit_code": code,
                "checks": [c.to_dict() for c in v.checks],
                "reruns": v.reruns,
                "committed_dir": str(committed),
            },
        )
        print(f"\nwrote {out / 'verify_results.json'}; exit status {code}")
        return code

    return _main()


if __name__ == "__main__":
    sys.exit(main())
