"""Benchmark our FlashAttention against SDPA's backends, in one process, on the papers' shapes.

Shapes (FlashAttention-2 paper, section 4.1): 16k tokens per batch (batch = 16384 / seq), hidden
2048 (heads = 2048 / head_dim), head dims 64 and 128, sequence 512 to 16k, causal and not.
For each shape: forward, backward and forward+backward of ours and of SDPA's FLASH (the
FlashAttention-2 kernels in PyTorch), CUDNN, EFFICIENT and MATH backends (MATH only up to
`math_max_seq`: it materialises the S x S matrix). Each figure is the median of
`triton.testing.do_bench` (L2 flushed); FLOPs as in the papers: 4·B·H·S²·D forward (half when
causal), 2.5x that backward. Also the peak memory of one forward+backward and our output's
error against SDPA FLASH at every shape (the run fails if it is out of line).

Writes <reports-dir>/project01_cuda_kernel/attention.json (with the environment); the charts
attention_{fwd,bwd,fwd_bwd}.png and attention_memory.png are drawn from it (report.attention).

    python -m project01_cuda_kernel bench-attention [--quick]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

PROJECT = "project01_cuda_kernel"
PROVIDERS = ("ours", "ours_fa2", "ours_r16", "ours_k64", "flash", "cudnn", "efficient", "math")
# Kernel variants of ours, measured in one mode only: the FlashAttention-2 forward (32 and 16 query
# rows a warp; on a Hopper GPU "ours" runs the wgmma/TMA forward instead), the backward with 64
# keys a CTA (its kernels called directly, after one forward).
VARIANT_MODE = {"ours_fa2": "fwd", "ours_r16": "fwd", "ours_k64": "bwd"}
MODES = ("fwd", "bwd", "fwd_bwd")
Provider = Literal[
    "ours", "ours_fa2", "ours_r16", "ours_k64", "flash", "cudnn", "efficient", "math"
]


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
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    """input dtype"""
    providers: tuple[Provider, ...] = PROVIDERS
    """ours and its variants, and SDPA's backends pinned one at a time"""
    math_max_seq: int = 1024
    """longest sequence for SDPA's MATH backend (it materialises (B, H, S, S) float32 scores)"""
    warmup_ms: float = 10.0
    """warm-up time before each measurement, ms"""
    rep_ms: float = 50.0
    """time spent on the timed repetitions of each measurement, ms"""
    quick: bool = False
    """head dim 128, sequences 1k and 4k only (a smoke run)"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: the repository's reports/)"""
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
        for name in ("warmup_ms", "rep_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {v}")
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


def attention_fn(provider: str, causal: bool) -> Callable:
    """(q, k, v) -> out for one provider; SDPA pinned to one backend (no silent fallback)."""
    if provider == "ours":
        from project01_cuda_kernel.attention import flash_attention

        return lambda q, k, v: flash_attention(q, k, v, causal=causal)
    if provider == "ours_k64":
        return None  # timed through backward_k64_fn
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
    """Our backward kernels with 4 warps (64 keys) a CTA, on one saved forward."""
    from project01_cuda_kernel.attention import check_inputs, flash_backward, flash_forward

    scale = check_inputs(q, k, v, causal, None)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out, lse = flash_forward(qd, kd, vd, causal, scale)
    return lambda: flash_backward(do, qd, kd, vd, out, lse, causal, scale, warps=4)


def peak_memory_mib(fn: Callable[[], object]) -> float:
    """Peak device memory one call of fn allocates beyond what was allocated before, MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


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
    with progress(len(shapes), "attention", unit="shape", every=1) as bar:
        for d, s, causal in shapes:
            b, h = cfg.total_tokens // s, cfg.hidden // d
            gen = torch.Generator(device="cuda").manual_seed(s * 1000 + d)
            q, k, v, do = (
                torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4)
            )
            for t in (q, k, v):
                t.requires_grad_(True)
            shape = {"head_dim": d, "seq_len": s, "batch": b, "heads": h, "causal": causal}
            # Correctness at every benchmarked shape: ours vs SDPA FLASH, same inputs.
            with torch.no_grad():
                ours_out = attention_fn("ours", causal)(q, k, v)
                ref_out = attention_fn("flash", causal)(q, k, v)
            err = (ours_out.float() - ref_out.float()).abs().max().item()
            checks.append({**shape, "max_abs_diff_vs_flash": err})
            if not math.isfinite(err) or err > 0.05:
                raise RuntimeError(f"ours differs from SDPA FLASH by {err} at {shape}")
            del ours_out, ref_out
            for provider in cfg.providers:
                if provider == "math" and s > cfg.math_max_seq:
                    continue
                attn = attention_fn(provider, causal)
                modes = (VARIANT_MODE[provider],) if provider in VARIANT_MODE else MODES
                try:
                    if provider not in VARIANT_MODE:
                        mem = peak_memory_mib(mode_fn(attn, "fwd_bwd", q, k, v, do))
                        memory.append({**shape, "provider": provider, "peak_mib": mem})
                    for mode in modes:
                        fn = (
                            backward_k64_fn(q, k, v, do, causal)
                            if provider == "ours_k64"
                            else mode_fn(attn, mode, q, k, v, do)
                        )
                        t = benchmark(fn, warmup_ms=cfg.warmup_ms, rep_ms=cfg.rep_ms)
                        flops = attention_flops(b, h, s, s, d, causal=causal, mode=mode)
                        rows.append(
                            {
                                **shape,
                                "provider": provider,
                                "mode": mode,
                                "median_ms": t.median_ms,
                                "p20_ms": t.p20_ms,
                                "p80_ms": t.p80_ms,
                                "tflops": t.tflops(flops),
                                "flops": flops,
                            }
                        )
                        del fn
                except RuntimeError as e:  # a backend that does not take this shape
                    skipped.append({**shape, "provider": provider, "reason": str(e)[:200]})
                torch.cuda.empty_cache()
            del q, k, v, do
            torch.cuda.empty_cache()
            bar.advance(status=f"head dim {d}, seq {s}, {'causal' if causal else 'non-causal'}")
    from project01_cuda_kernel.attention import resolve_fwd_kernel

    return {
        "rows": rows,
        "checks": checks,
        "memory": memory,
        "skipped": skipped,
        "ours_forward_kernel": resolve_fwd_kernel("auto"),  # what "ours" ran forward
    }


def ratios(rows: list[dict], base: str = "flash") -> list[dict]:
    """ours / base throughput for every (shape, mode) both were measured at."""
    key = ("head_dim", "seq_len", "causal", "mode")
    by = {(tuple(r[k] for k in key), r["provider"]): r["tflops"] for r in rows}
    out = []
    for r in rows:
        if r["provider"] != "ours":
            continue
        b = by.get((tuple(r[k] for k in key), base))
        if b:
            out.append(
                {**{k: r[k] for k in key}, "ours": r["tflops"], base: b, "ratio": r["tflops"] / b}
            )
    return out


def print_summary(result: dict) -> None:
    from shared.results import markdown_table

    table = [
        {
            "D": r["head_dim"],
            "S": r["seq_len"],
            "causal": r["causal"],
            "mode": r["mode"],
            "ours TFLOP/s": r["ours"],
            "FLASH TFLOP/s": r["flash"],
            "ours/FLASH": r["ratio"],
        }
        for r in ratios(result["rows"])
    ]
    print(markdown_table(table, floatfmt=".3g"))


def run(cfg: AttentionBenchConfig) -> Path:
    """Measure and write <reports-dir>/project01_cuda_kernel/<name>.json (with the environment);
    returns its path."""
    from shared.cli import writable_dir
    from shared.results import REPORTS_DIR, save_result

    reports_dir = Path(cfg.reports_dir) if cfg.reports_dir is not None else REPORTS_DIR
    writable_dir("--reports-dir", reports_dir / PROJECT)  # before the GPU work, not after
    result = measure(cfg)
    result["ratios_vs_flash"] = ratios(result["rows"])
    return save_result(
        PROJECT,
        cfg.name,
        result,
        baseline="SDPA backends (FLASH, CUDNN, EFFICIENT, MATH) measured in the same process",
        config={k: v for k, v in asdict(cfg).items() if k != "reports_dir"},
        reports_dir=reports_dir,
    )


def main(cfg: AttentionBenchConfig) -> int:
    """`bench-attention`: run, then the charts from the record, and a summary table."""
    from shared.results import load_result

    from ..report.attention import render_charts

    path = run(cfg)
    print(f"wrote {path}")
    if cfg.charts:
        for p in render_charts(path):
            print(f"wrote {p}")
    print_summary(load_result(path)["results"])
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["bench-attention", *sys.argv[1:]]))
