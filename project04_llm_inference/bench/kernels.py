"""Paged decode attention (csrc/paged_decode.cu) against PyTorch SDPA, in achieved HBM bandwidth.

    python -m project04_llm_inference.bench.kernels [--reports-dir DIR]

Per (batch, context) shape, bf16, Llama-3.2-1B attention (32 query heads, 8 KV heads, head dim
64), block size 16 with the blocks shuffled in the pool, every sequence at the full context:
- ours: `paged_decode_attention`, K/V read through the block tables;
- sdpa: `F.scaled_dot_product_attention` with `enable_gqa=True` (K/V stay at 8 heads, no
  expansion) over a contiguous (B, Hkv, S, D) copy of the same cache, q as (B, Hq, 1, D); the
  backend is SDPA's own choice.
Both are captured in a CUDA graph and timed by replaying it, as the engine runs its decode
steps: the time is the GPU's, not the host's (launched one Python call at a time, a small
shape would measure the wrapper's host time instead of the kernel).
Bytes = K and V of every context token read once + q + out; GB/s = bytes / median time
(`triton.testing.do_bench`, which flushes L2 between runs), against the copy bandwidth of
`shared.hardware`. Shapes whose two caches (paged + contiguous) would not fit are skipped.

With `--kv-cache-dtype fp8` the paged cache holds the same values rounded to float8_e4m3fn
(scales 1; the kernel's FP8 variant), its bytes counted at one per element, against SDPA over
the same bfloat16 contiguous cache: the ratio is what an FP8 cache buys the decode step. That
record is `decode_attention_kvfp8.json`.

Each shape is timed in `repeats` repetitions (default 5), ours and SDPA alternating
(`shared.repeat.interleave`); every figure is the median over repetitions with `_min`, `_max`
and `_reps` beside it, the speedup the median of the per-repetition ratios. The record's
environment holds the GPU's clocks, temperature and power at the start and the end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from project04_llm_inference import PROJECT
from shared.hardware import get_gpu
from shared.repeat import DEFAULT_REPEATS, flat, interleave


@dataclass
class KernelBenchConfig:
    """Time the paged decode attention kernel against SDPA over a contiguous cache (GPU)."""

    batches: list[int] = field(default_factory=lambda: [1, 64, 256])
    """sequences per launch"""
    contexts: list[int] = field(default_factory=lambda: [1024, 4096, 8192, 16384, 32768])
    """tokens of context of every sequence"""
    n_heads: int = 32
    """query heads (Llama-3.2-1B: 32)"""
    n_kv_heads: int = 8
    """key/value heads (Llama-3.2-1B: 8)"""
    head_dim: int = 64
    """dimensions per head: 64 or 128"""
    block_size: int = 16
    """tokens per KV-cache block"""
    dtype: str = "bfloat16"
    """bfloat16 or float16"""
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    """'auto': the paged cache in `dtype`; 'fp8': in float8_e4m3fn (SDPA keeps `dtype`)"""
    seed: int = 0
    """seed of the random cache and queries"""
    memory_fraction: float = 0.6
    """share of free GPU memory the two caches (paged and contiguous) may take; larger shapes
    are skipped"""
    repeats: int = DEFAULT_REPEATS
    """repetitions per shape, ours and SDPA alternating; figures are medians with min-max"""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""


def _caches(b: int, s: int, cfg: KernelBenchConfig, dtype):
    """Dense (B, Hkv, S, D) K/V, the same tokens in a shuffled paged cache, and the tables."""
    bs, hkv, d = cfg.block_size, cfg.n_kv_heads, cfg.head_dim
    per_seq = (s + bs - 1) // bs
    perm = torch.randperm(b * per_seq, device="cuda")
    tables = perm.view(b, per_seq).to(torch.int32)
    dense, paged = [], []
    for _ in range(2):  # K, then V: one temporary at a time
        x = torch.randn(b, hkv, per_seq * bs, d, device="cuda", dtype=dtype)
        # (B, Hkv, nblk, bs, D) -> (B * nblk, bs, Hkv, D): block j of sequence i at perm[i, j]
        blocks = x.view(b, hkv, per_seq, bs, d).permute(0, 2, 3, 1, 4).reshape(-1, bs, hkv, d)
        cache = torch.empty(blocks.shape, device="cuda", dtype=dtype)  # contiguous
        cache[perm] = blocks
        del blocks
        dense.append(x[:, :, :s])
        paged.append(cache)
    return dense, paged, tables


def run_shape(b: int, s: int, cfg: KernelBenchConfig) -> dict:
    from triton.testing import do_bench

    from project04_llm_inference.kernels.decode import paged_decode_attention, split_plan

    dtype, hq, hkv, d = getattr(torch, cfg.dtype), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    elt = torch.finfo(dtype).bits // 8
    fp8 = cfg.kv_cache_dtype == "fp8"
    kv_bytes = 2 * b * s * hkv * d * elt  # K and V, every context token once (16-bit)
    ours_kv_bytes = kv_bytes // elt if fp8 else kv_bytes  # the paged cache's: 1 byte in FP8
    row = {"batch": b, "context": s, "bytes": ours_kv_bytes + 2 * b * hq * d * elt}
    row["sdpa_bytes"] = kv_bytes + 2 * b * hq * d * elt
    free, _ = torch.cuda.mem_get_info()
    if 2 * kv_bytes > cfg.memory_fraction * free:
        return {**row, "skipped": f"needs {2 * kv_bytes / 2**30:.1f} GiB for two caches"}
    (k, v), (k_cache, v_cache), tables = _caches(b, s, cfg, dtype)
    scales = (None, None)
    if fp8:  # randn values: scale 1 keeps them in e4m3's normal range
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
        scales = (torch.ones(hkv, device="cuda"), torch.ones(hkv, device="cuda"))
    q = torch.randn(b, hq, d, device="cuda", dtype=dtype)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    scale = d**-0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    row["partition_size"], row["num_splits"] = split_plan(b, hkv, s, sms)

    def ours():
        return paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, s, *scales)

    def sdpa():
        return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)

    row["max_abs_diff_vs_sdpa"] = (ours().float() - sdpa()[:, :, 0].float()).abs().max().item()

    def graphed(fn):
        """fn captured in a CUDA graph (after an eager warm-up): replaying it launches the same
        kernels with no Python in between."""
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    def timed(fn):
        try:
            replay = graphed(fn)
        except RuntimeError:  # not capturable on this build: time the eager calls, and say so
            row["graph_capture_failed"] = row.get("graph_capture_failed", []) + [fn.__name__]
            replay = fn
        return lambda: do_bench(replay, warmup=25, rep=200, return_mode="median")

    # RuntimeError: e.g. no SDPA backend for this case on this build
    reps = interleave(
        {"ours": timed(ours), "sdpa": timed(sdpa)}, cfg.repeats, catch=(RuntimeError,)
    )
    for key in ("ours", "sdpa"):
        if key in reps.errors:
            row[f"{key}_error"] = reps.errors[key].splitlines()[0]
        ms = reps.spread(key)
        if ms is not None:
            row.update(flat(f"{key}_ms", ms))
            n = row["bytes"] if key == "ours" else row["sdpa_bytes"]
            row.update(flat(f"{key}_gbps", ms.map(lambda t, n=n: n / (t * 1e-3) / 1e9)))
    speedup = reps.ratio("sdpa", "ours")
    if speedup is not None:
        row.update(flat("speedup_vs_sdpa", speedup))
    return row


def run(cfg: KernelBenchConfig) -> dict:
    """Time every (batch, context) shape of `cfg`, save the JSON record, return it with its path."""
    from shared.gpu_state import gpu_state, state_line
    from shared.results import output_root, save_result

    if not torch.cuda.is_available():
        raise RuntimeError("the decode kernel benchmark needs a CUDA GPU")
    if cfg.repeats < 1:
        raise ValueError(f"KernelBenchConfig.repeats must be >= 1, got {cfg.repeats}")
    start = gpu_state()
    print(f"GPU at start: {state_line(start)}")
    torch.manual_seed(cfg.seed)
    rows = []
    for b in cfg.batches:
        for s in cfg.contexts:
            rows.append(run_shape(b, s, cfg))
            torch.cuda.empty_cache()  # the shape's caches are gone: give their memory back
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()})
    reports_dir = str(output_root(cfg.reports_dir))
    results = {
        "rows": rows,
        "copy_ceiling_gbps": get_gpu("h200-sxm").copy_bandwidth_gbs.value,
        "repeats": cfg.repeats,
    }
    path = save_result(
        PROJECT,
        "decode_attention_kvfp8" if cfg.kv_cache_dtype == "fp8" else "decode_attention",
        results,
        baseline="SDPA (enable_gqa=True, backend of its choice) over a contiguous cache, same process",
        config={**asdict(cfg), "timing": "cuda_graph"},
        reports_dir=reports_dir,
        gpu_state_start=start,
    )
    print(f"wrote {path}")
    return {**results, "path": str(Path(path))}


def main(argv: list[str] | None = None) -> None:
    """`python -m <this module>`: the package's `decode-kernel` command (one CLI, one --help)."""
    import sys

    from project04_llm_inference.__main__ import main as package_main

    package_main(["decode-kernel", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
