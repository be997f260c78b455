"""Benchmark our FlashAttention against SDPA's backends, in one process, on the papers' shapes.

Shapes (FlashAttention-2 paper, section 4.1): 16k tokens per batch (batch = 16384 / seq), hidden
2048 (heads = 2048 / head_dim), head dims 64 and 128, sequence 512 to 16k, causal and not.
For each shape: forward, backward and forward+backward of ours and of SDPA's FLASH (the
FlashAttention-2 kernels in PyTorch), CUDNN, EFFICIENT and MATH backends (MATH only up to
`math_max_seq`: it materialises the S x S matrix). A measurement is the median of
`triton.testing.do_bench` (L2 flushed); FLOPs as in the papers: 4·B·H·S²·D forward (half when
causal), 2.5x that backward. Also the peak memory of one forward+backward and our output's
error against SDPA FLASH at every shape (the run fails if it is out of line).

`--kv-heads N` measures grouped-query attention (Llama-3's 8 k/v heads): k and v get N heads and
SDPA is called with `enable_gqa=True` (a backend that does not take it is recorded as skipped);
FLOPs count the query heads, as for multi-head attention.

Each shape and mode is timed `--repeats` times (default 5), ours and the SDPA backends
alternating (`shared.repeat.interleave`: ours, ..., MATH, then the reverse); every figure is the
median over repetitions with `_min`, `_max` and `_reps` beside it, and a ratio (ours / FLASH,
ours / cuDNN) is the median of the per-repetition ratios. The record's environment holds the
GPU's clocks, temperature and power at the start and the end.

Writes <reports-dir>/project01_cuda_kernel/attention.json (with the environment); the charts
attention_{fwd,bwd,fwd_bwd}.png and attention_memory.png are drawn from it (report.attention).

    python -m project01_cuda_kernel bench-attention [--quick]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from project01_cuda_kernel import PROJECT, attention
from shared.repeat import DEFAULT_REPEATS, flat, ratio, read_flat

from .interleaved import time_interleaved, timing_fields

Provider = Literal[
    "ours",
    "ours_fa2",
    "ours_r16",
    "ours_k64",
    "flash",
    "cudnn",
    "efficient",
    "math",
    "ours_hbwd",
    "ours_fa2bwd",
]
PROVIDERS: tuple[str, ...] = get_args(Provider)
# ours with its backward kernel named (`flash_backward(..., bwd_kernel=...)`), forward "auto":
# ours_hbwd the Hopper backward (compute capability 9.0 only; elsewhere it is recorded as skipped
# with the reason), ours_fa2bwd the FlashAttention-2 backward (the 128-keys-a-CTA kernel).
EXPLICIT_BWD = {"ours_hbwd": "hopper", "ours_fa2bwd": "fa2"}


def default_providers(auto_bwd_hopper: bool) -> tuple[str, ...]:
    """DEFAULT_PROVIDERS for a value of attention.AUTO_BWD_HOPPER: every provider but the two
    of EXPLICIT_BWD while "auto" runs the FA2 backward ("ours" is FA2's, and the Hopper one is
    opt-in), and every provider but ours_hbwd once "auto" takes the Hopper backward (then
    ours_fa2bwd keeps the FA2 backward in the record, as the reference the Hopper one is
    compared against)."""
    return tuple(
        p for p in PROVIDERS if p != "ours_hbwd" and (p != "ours_fa2bwd" or auto_bwd_hopper)
    )


# Measured unless --providers names others.
DEFAULT_PROVIDERS = default_providers(attention.AUTO_BWD_HOPPER)
# Kernel variants of ours, measured in one mode only: the FlashAttention-2 forward (32 and 16 query
# rows a warp; on a Hopper GPU "ours" runs the wgmma/TMA forward instead), the FlashAttention-2
# backward named and its variant with 64 keys a CTA (its kernels called directly, after one
# forward).
VARIANT_MODE = {"ours_fa2": "fwd", "ours_r16": "fwd", "ours_k64": "bwd", "ours_fa2bwd": "bwd"}
MODES = ("fwd", "bwd", "fwd_bwd")


@dataclass
class AttentionBenchConfig:
    """Benchmark our FlashAttention forward and backward against SDPA's backends in one process
    (defaults: the FlashAttention-2 paper's sweep)."""

    head_dims: tuple[int, ...] = (64, 128)
    """head dimensions (each divides --hidden)"""
    seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    """sequence lengths (each divides --total-tokens)"""
    causal: tuple[bool, ...] = (False, True)
    """masks measured: non-causal, causal or both"""
    total_tokens: int = 16384
    """tokens per batch: batch = total_tokens // seq_len"""
    hidden: int = 2048
    """model width: heads = hidden // head_dim"""
    kv_heads: int = 0
    """k/v heads: 0 = as many as the query heads (multi-head); fewer (dividing every head
    count) = grouped-query attention, SDPA called with enable_gqa=True"""
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    """input dtype"""
    providers: tuple[Provider, ...] = DEFAULT_PROVIDERS
    """ours and its variants, and SDPA's backends pinned one at a time (ours_hbwd and
    ours_fa2bwd: forward "auto" + the Hopper or the FA2 backward, named; see EXPLICIT_BWD)"""
    math_max_seq: int = 1024
    """longest sequence for SDPA's MATH backend (it materialises (B, H, S, S) float32 scores)"""
    warmup_ms: float = 10.0
    """warm-up time before each measurement, ms"""
    rep_ms: float = 50.0
    """time spent on the timed calls of each measurement, ms"""
    repeats: int = DEFAULT_REPEATS
    """repetitions per shape and mode, ours and the SDPA backends alternating; each figure is
    the median over them with its min-max range"""
    quick: bool = False
    """head dim 128, sequences 1k and 4k only (a smoke run)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: a new runs/<UTC time>/; reports/ only when named)"""
    name: str = "attention"
    """result file stem"""
    charts: bool = True
    """draw the charts from the record once it is written"""

    def __post_init__(self) -> None:
        if self.quick:
            self.head_dims, self.seq_lens = (128,), (1024, 4096)
        bad = [p for p in self.providers if p not in PROVIDERS]
        if bad:
            raise ValueError(f"providers: unknown {bad}; expected some of {PROVIDERS}")
        if self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"dtype must be 'bfloat16' or 'float16', got {self.dtype!r}")
        for name in ("total_tokens", "hidden", "math_max_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for s in self.seq_lens:
            if s < 1 or self.total_tokens % s:
                raise ValueError(f"seq_lens: {s} must divide total_tokens {self.total_tokens}")
        for d in self.head_dims:
            if d < 1 or self.hidden % d:
                raise ValueError(f"head_dims: {d} must divide hidden {self.hidden}")
            if self.kv_heads < 0 or (self.kv_heads and (self.hidden // d) % self.kv_heads):
                raise ValueError(
                    f"kv_heads: {self.kv_heads} must be 0 or divide the {self.hidden // d} "
                    f"query heads of head dim {d}"
                )
        for name in ("warmup_ms", "rep_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"--repeats: expected an integer >= 1, got {self.repeats}")
        if not self.head_dims or not self.seq_lens or not self.causal or not self.providers:
            raise ValueError("head_dims, seq_lens, causal and providers need at least one value")
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name must be a plain file stem like 'attention', got {self.name!r}")
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("reports_dir: expected a folder, got an empty path")


def _sdpa_backend(provider: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[provider]


def attention_fn(provider: str, causal: bool, gqa: bool = False) -> Callable:
    """(q, k, v) -> out for one provider; SDPA pinned to one backend (no silent fallback), with
    enable_gqa when k/v have fewer heads than q (ours takes that natively)."""
    if provider == "ours":
        from project01_cuda_kernel.attention import flash_attention

        return lambda q, k, v: flash_attention(q, k, v, causal=causal)
    if provider == "ours_k64":
        return None  # timed through backward_k64_fn
    if provider in EXPLICIT_BWD:
        return explicit_backward_fn(causal, EXPLICIT_BWD[provider])
    if provider in ("ours_fa2", "ours_r16"):
        from project01_cuda_kernel.attention import check_inputs, flash_forward

        m_tiles = 1 if provider == "ours_r16" else 2

        def forward_fa2(q, k, v):
            scale = check_inputs(q, k, v, causal, None)
            return flash_forward(q, k, v, causal, scale, m_tiles_per_warp=m_tiles, kernel="fa2")[0]

        return forward_fa2
    from torch.nn.attention import sdpa_kernel

    backend = _sdpa_backend(provider)

    def run(q, k, v):
        with sdpa_kernel(backend):
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def mode_fn(attn: Callable, mode: str, q, k, v, do) -> Callable[[], object]:
    """The callable timed for one mode. bwd replays the graph of one saved forward."""
    if mode == "fwd":

        def fwd():
            with torch.no_grad():
                return attn(q, k, v)

        return fwd
    if mode == "bwd":
        out = attn(q, k, v)
        return lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    if mode == "fwd_bwd":
        return lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), do)
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def backward_k64_fn(q, k, v, do, causal: bool) -> Callable[[], object]:
    """Our FlashAttention-2 backward kernels with 4 warps (64 keys) a CTA, on one saved
    forward."""
    from project01_cuda_kernel.attention import check_inputs, flash_backward, flash_forward

    scale = check_inputs(q, k, v, causal, None)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = flash_forward(qd, kd, vd, causal, scale)
    return lambda: flash_backward(
        do, qd, kd, vd, out, lse, causal, scale, warps=4, bwd_kernel="fa2"
    )


def explicit_backward_fn(causal: bool, bwd_kernel: str) -> Callable:
    """(q, k, v) -> out, differentiable: our forward ("auto": the Hopper one on CC 9.0) and the
    backward named by `bwd_kernel` (`flash_backward(..., bwd_kernel=...)`: "hopper" or "fa2"),
    through an autograd.Function, whatever "auto" would run. A GPU or head dim the named
    backward does not take raises RuntimeError, so the bench records it as skipped."""
    from project01_cuda_kernel.attention import (
        check_inputs,
        flash_backward,
        flash_forward,
        select_bwd_kernel,
    )

    provider = next(p for p, k in EXPLICIT_BWD.items() if k == bwd_kernel)

    class ExplicitBackwardAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            scale = check_inputs(q, k, v, causal, None)
            out, lse = flash_forward(q, k, v, causal, scale)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.scale = scale
            return out

        @staticmethod
        def backward(ctx, do):
            q, k, v, out, lse = ctx.saved_tensors
            return flash_backward(do, q, k, v, out, lse, causal, ctx.scale, bwd_kernel=bwd_kernel)

    def run(q, k, v):
        try:
            select_bwd_kernel(bwd_kernel, False, q.shape[-1])
        except ValueError as e:
            raise RuntimeError(f"{provider}: {e}") from e
        return ExplicitBackwardAttention.apply(q, k, v)

    run.causal = causal  # for hbwd_grad_diffs
    return run


def hbwd_grad_diffs(attn: Callable, q, k, v, do) -> dict:
    """max |grad of ours_hbwd - grad of the FA2 backward| for dq, dk, dv (the Hopper backward
    against `flash_attention(..., bwd_kernel="fa2")` on the same forward output), plus the
    largest |grad| of the FA2 one, for scale."""
    from project01_cuda_kernel.attention import flash_attention

    causal = getattr(attn, "causal", False)
    fa2 = torch.autograd.grad(
        flash_attention(q, k, v, causal=causal, bwd_kernel="fa2"), (q, k, v), do
    )
    hbwd = torch.autograd.grad(attn(q, k, v), (q, k, v), do)
    out = {}
    for name, a, b in zip(("dq", "dk", "dv"), hbwd, fa2):
        out[f"hbwd_{name}_max_abs_diff_vs_fa2"] = (a.float() - b.float()).abs().max().item()
        out[f"{name}_max_abs"] = b.float().abs().max().item()
    return out


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Peak device memory one call of fn allocates beyond what was allocated before, MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def time_mode(
    shape: dict,
    mode: str,
    timers: Mapping[str, Callable[[], object]],
    repeats: int,
    flops: float,
) -> tuple[list[dict], dict[str, str]]:
    """The providers of one shape and mode, timed `repeats` times alternating: (one row per
    provider timed in every repetition, {provider: why it was not} for the others).

    timers: provider -> a callable timing it once (returning a `shared.timing.Timing`), in the
    order of the first repetition. A provider whose timing raises a RuntimeError (a backend that
    does not take this shape) is left out, as it always was."""
    timed = time_interleaved(timers, repeats, catch=(RuntimeError,))
    rows, failed = [], {}
    for provider in timers:
        if not timed.ok(provider):
            failed[provider] = timed.error(provider) or "not timed"
            continue
        rows.append(
            {
                **shape,
                "provider": provider,
                "mode": mode,
                **timing_fields(timed.timings[provider], flops),
                "flops": flops,
            }
        )
    return rows, failed


def measure(cfg: AttentionBenchConfig) -> dict:
    """Every provider at every shape of `cfg`, on this GPU: the record's results."""
    from shared.flops import attention_flops
    from shared.progress import progress
    from shared.timing import benchmark

    from .._build import require_cuda

    require_cuda()
    dtype = getattr(torch, cfg.dtype)
    shapes = [(d, s, c) for d in cfg.head_dims for c in cfg.causal for s in cfg.seq_lens]
    rows: list[dict] = []
    checks: list[dict] = []
    memory: list[dict] = []
    skipped: list[dict] = []

    def timer(fn: Callable[[], object]) -> Callable[[], object]:
        return lambda: benchmark(fn, warmup_ms=cfg.warmup_ms, rep_ms=cfg.rep_ms)

    with progress(len(shapes), "attention", unit="shape", every=1) as bar:
        for d, s, causal in shapes:
            b, h = cfg.total_tokens // s, cfg.hidden // d
            hk = cfg.kv_heads or h
            gqa = hk != h
            gen = torch.Generator(device="cuda").manual_seed(s * 1000 + d)
            q, k, v, do = (
                torch.randn(b, n, s, d, device="cuda", dtype=dtype, generator=gen)
                for n in (h, hk, hk, h)
            )
            for t in (q, k, v):
                t.requires_grad_(True)
            shape = {"head_dim": d, "seq_len": s, "batch": b, "heads": h, "causal": causal}
            if gqa:
                shape["kv_heads"] = hk
            # Correctness at every benchmarked shape: ours vs SDPA FLASH, same inputs.
            with torch.no_grad():
                ours_out = attention_fn("ours", causal)(q, k, v)
                ref_out = attention_fn("flash", causal, gqa)(q, k, v)
            err = (ours_out.float() - ref_out.float()).abs().max().item()
            checks.append({**shape, "max_abs_diff_vs_flash": err})
            if not math.isfinite(err) or err > 0.05:
                raise RuntimeError(f"ours differs from SDPA FLASH by {err} at {shape}")
            del ours_out, ref_out

            def skip(provider: str, reason: str, shape: dict = shape) -> None:
                skipped.append({**shape, "provider": provider, "reason": reason[:200]})

            # Peak memory of one forward+backward each, before any timing; a backend that does
            # not take this shape is left out here.
            live: dict[str, Callable] = {}
            for provider in cfg.providers:
                if provider == "math" and s > cfg.math_max_seq:
                    continue
                attn = attention_fn(provider, causal, gqa)
                try:
                    if provider not in VARIANT_MODE:
                        mem = peak_memory_mib(mode_fn(attn, "fwd_bwd", q, k, v, do))
                        memory.append({**shape, "provider": provider, "peak_mib": mem})
                    live[provider] = attn
                except RuntimeError as e:
                    skip(provider, str(e))
                torch.cuda.empty_cache()
            if "ours_hbwd" in live:  # its gradients against the FA2 backward's, recorded
                try:
                    checks.append({**shape, **hbwd_grad_diffs(live["ours_hbwd"], q, k, v, do)})
                except RuntimeError as e:
                    skip("ours_hbwd", str(e))
                    del live["ours_hbwd"]
            # Mode by mode: every provider of the mode timed in each repetition, alternating.
            for mode in MODES:
                timers = {}
                for provider, attn in list(live.items()):
                    if VARIANT_MODE.get(provider, mode) != mode:
                        continue
                    try:
                        fn = (
                            backward_k64_fn(q, k, v, do, causal)
                            if provider == "ours_k64"
                            else mode_fn(attn, mode, q, k, v, do)
                        )
                    except RuntimeError as e:
                        skip(provider, str(e))
                        del live[provider]
                        continue
                    timers[provider] = timer(fn)
                if not timers:
                    continue
                flops = attention_flops(b, h, s, s, d, causal=causal, mode=mode)
                got, failed = time_mode(shape, mode, timers, cfg.repeats, flops)
                rows += got
                for provider, why in failed.items():  # not measured in the later modes either
                    skip(provider, why)
                    live.pop(provider, None)
                del timers
                torch.cuda.empty_cache()
            del q, k, v, do
            torch.cuda.empty_cache()
            bar.advance(status=f"head dim {d}, seq {s}, {'causal' if causal else 'non-causal'}")
    from project01_cuda_kernel.attention import (
        kernel_head_dim,
        resolve_fwd_kernel,
        select_bwd_kernel,
        select_fwd_kernel,
    )

    return {
        "rows": rows,
        "checks": checks,
        "memory": memory,
        "skipped": skipped,
        "repeats": cfg.repeats,
        "ours_forward_kernel": resolve_fwd_kernel("auto"),  # at head dims the Hopper one has
        # what "ours" ran forward at each head dim ("auto" takes fa2 where Hopper has no instance)
        "ours_forward_kernels": {
            str(d): select_fwd_kernel("auto", False, d) for d in cfg.head_dims
        },
        # and backward ("auto": the Hopper one where it has an instance while
        # attention.AUTO_BWD_HOPPER is on, as it is by default; FA2's elsewhere)
        "ours_backward_kernels": {
            str(d): select_bwd_kernel("auto", False, kernel_head_dim(d)) for d in cfg.head_dims
        },
    }


def ratios(rows: list[dict], base: str = "flash", provider: str = "ours") -> list[dict]:
    """provider / base throughput for every (shape, mode) both were measured at: the median of
    the per-repetition ratios with its range (`ratio_min`, `ratio_max`, `ratio_reps`); `ours`
    (the provider's) and `base` are the two throughput medians. Rows of one run give the plain
    ratio."""
    key = ("head_dim", "seq_len", "causal", "mode")
    by = {(tuple(r[k] for k in key), r["provider"]): r for r in rows}
    out = []
    for r in rows:
        if r["provider"] != provider:
            continue
        b = by.get((tuple(r[k] for k in key), base))
        ours, ref = read_flat(r, "tflops"), read_flat(b or {}, "tflops")
        if ours is None or ref is None or not ref.median:
            continue
        out.append(
            {
                **{k: r[k] for k in key},
                "ours": r["tflops"],
                base: b["tflops"],
                **flat("ratio", ratio(ours, ref)),
            }
        )
    return out


def fa2_backward_provider(result: dict) -> str | None:
    """The provider of a record whose backward is the FlashAttention-2 one at every head dim:
    ours_fa2bwd when measured, else "ours" when "auto" ran FA2's backward (records without
    `ours_backward_kernels` were measured before the Hopper backward could be "auto"'s), else
    None."""
    rows = result.get("rows", [])
    if any(r["provider"] == "ours_fa2bwd" for r in rows):
        return "ours_fa2bwd"
    kernels = (result.get("ours_backward_kernels") or {}).values()
    return "ours" if all(k == "fa2" for k in kernels) else None


def hbwd_table(rows: list[dict], fa2: str | None = "ours") -> list[dict]:
    """One row per (shape, mode) where ours_hbwd ran: its TFLOP/s and its ratios to the
    FlashAttention-2 backward (the provider `fa2` names, `fa2_backward_provider`; no column when
    None), cuDNN and FLASH (median ratios of the repetitions)."""
    key = ("head_dim", "seq_len", "causal", "mode")
    bases = (("cudnn", "cuDNN"), ("flash", "FLASH"))
    if fa2:
        bases = ((fa2, "FA2 bwd"), *bases)
    against = {
        base: {tuple(r[k] for k in key): r for r in ratios(rows, base, "ours_hbwd")}
        for base, _ in bases
    }
    shapes = [tuple(r[k] for k in key) for r in rows if r["provider"] == "ours_hbwd"]
    table = []
    for shape in shapes:
        row = dict(zip(("D", "S", "causal", "mode"), shape))
        own = next(
            r for r in rows if r["provider"] == "ours_hbwd" and tuple(r[k] for k in key) == shape
        )
        row["ours_hbwd TFLOP/s"] = own["tflops"]
        for base, label in bases:
            r = against[base].get(shape)
            row[f"hbwd/{label}"] = r["ratio"] if r else None
        table.append(row)
    return table


def print_summary(result: dict) -> None:
    from shared.results import markdown_table

    def cell(r: dict, key: str) -> str:
        if len(r.get(f"{key}_reps") or ()) < 2:
            return f"{r[key]:.3g}"
        return f"{r[key]:.3g} ({r[f'{key}_min']:.3g}-{r[f'{key}_max']:.3g})"

    cudnn = {
        (r["head_dim"], r["seq_len"], r["causal"], r["mode"]): r
        for r in ratios(result["rows"], "cudnn")
    }
    table = [
        {
            "D": r["head_dim"],
            "S": r["seq_len"],
            "causal": r["causal"],
            "mode": r["mode"],
            "ours TFLOP/s": r["ours"],
            "FLASH TFLOP/s": r["flash"],
            "ours/FLASH": cell(r, "ratio"),
            "ours/cuDNN": cell(c, "ratio")
            if (c := cudnn.get((r["head_dim"], r["seq_len"], r["causal"], r["mode"])))
            else None,
        }
        for r in ratios(result["rows"])
    ]
    print(markdown_table(table, floatfmt=".3g"))
    hbwd = hbwd_table(result["rows"], fa2_backward_provider(result))
    if hbwd:
        print("ours_hbwd (forward auto + Hopper backward):")
        print(markdown_table(hbwd, floatfmt=".3g"))
    repeats = result.get("repeats", 1)
    if repeats > 1:
        print(
            f"medians of {repeats} repetitions; ratios: median (min-max) of the "
            "per-repetition ratios"
        )


def run(cfg: AttentionBenchConfig) -> Path:
    """Measure and write <reports-dir>/project01_cuda_kernel/<name>.json (with the environment
    and the GPU's state at the start and the end); returns its path."""
    from shared.cli import writable_dir
    from shared.gpu_state import gpu_state, state_line
    from shared.results import output_root, save_result

    from .._build import require_cuda

    reports_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", reports_dir / PROJECT)  # before the GPU work, not after
    require_cuda()  # no GPU: one line, before anything else is printed
    start = gpu_state()
    print(f"GPU at start: {state_line(start)}", flush=True)
    result = measure(cfg)
    result["ratios_vs_flash"] = ratios(result["rows"])
    result["ratios_vs_cudnn"] = ratios(result["rows"], "cudnn")
    if any(r["provider"] == "ours_hbwd" for r in result["rows"]):
        result["ratios_hbwd_vs_cudnn"] = ratios(result["rows"], "cudnn", "ours_hbwd")
        result["ratios_hbwd_vs_flash"] = ratios(result["rows"], "flash", "ours_hbwd")
        fa2 = fa2_backward_provider(result)
        if fa2:
            result["ratios_hbwd_vs_fa2"] = ratios(result["rows"], fa2, "ours_hbwd")
    return save_result(
        PROJECT,
        cfg.name,
        result,
        baseline="SDPA backends (FLASH, CUDNN, EFFICIENT, MATH) measured in the same process, "
        "alternating with ours",
        config={k: v for k, v in asdict(cfg).items() if k != "reports_dir"},
        reports_dir=reports_dir,
        gpu_state_start=start,
    )


def main(cfg: AttentionBenchConfig) -> int:
    """`bench-attention`: run, then the charts from the record, and a summary table."""
    from shared.gpu_state import state_line
    from shared.results import load_result

    from ..report.attention import render_charts

    path = run(cfg)
    print(f"wrote {path}")
    if cfg.charts:
        for p in render_charts(path):
            print(f"wrote {p}")
    record = load_result(path)
    print_summary(record["results"])
    print(f"GPU at end: {state_line(record['environment'].get('gpu_state', {}).get('end'))}")
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["bench-attention", *sys.argv[1:]]))
