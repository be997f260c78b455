"""Paged prefill attention (csrc/paged_prefill.cu) against PyTorch SDPA (FLASH backend).

    python -m project04_llm_inference.bench.prefill [--reports-dir DIR]

Per workload (bf16, Llama-3.2-1B attention: 32 query heads, 8 KV heads, head dim 64; block size
16, blocks shuffled in the pool), three timings of the same attention:
- ours: one launch over the packed batch, K/V read through the block tables;
- sdpa_per_seq: SDPA FLASH per sequence on K/V already gathered to contiguous (1, H, S, D)
  tensors (the gather and the GQA head repeat are outside the timing: a lower bound for a paged
  engine that calls SDPA);
- sdpa_padded: SDPA FLASH once over the batch padded to its longest query chunk and context
  (padding rows are computed and thrown away; exact work only when all lengths are equal).
The mask is causal aligned bottom-right (query j of a chunk of q_len after a prefix sits at
position ctx - q_len + j). FLOPs count only the (query, key) pairs the mask keeps, for both
products: 4 * D * Hq * sum_i [q_len_i (ctx_i - q_len_i) + q_len_i (q_len_i + 1) / 2]; every
column uses that same useful count. Times are medians of `triton.testing.do_bench`.

Each workload is timed in `repeats` repetitions (default 5), the three alternating
(`shared.repeat.interleave`); every figure is the median over repetitions with `_min`, `_max`
and `_reps` beside it, speedups the median of the per-repetition ratios. The record's
environment holds the GPU's clocks, temperature and power at the start and the end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from project04_llm_inference import PROJECT
from shared.repeat import DEFAULT_REPEATS, flat, interleave

# name -> (q_len, context_len) per sequence
WORKLOADS = {
    "8x1k_prompts": [(1024, 1024)] * 8,
    "4x2k_after_1k_prefix": [(2048, 3072)] * 4,
    "32x256_prompts": [(256, 256)] * 32,
    "16_mixed_prompts_128_to_2k": [(128 * (i + 1), 128 * (i + 1)) for i in range(16)],
}


@dataclass
class PrefillBenchConfig:
    """Time the paged prefill attention kernel against SDPA FLASH, per sequence and over a padded
    batch (GPU)."""

    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 64
    block_size: int = 16
    dtype: str = "bfloat16"
    seed: int = 0
    repeats: int = DEFAULT_REPEATS
    """repetitions per workload, ours and the SDPA baselines alternating; medians with min-max"""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""


def mask_pairs(specs) -> int:
    """(query, key) pairs the bottom-right causal mask keeps, summed over sequences."""
    return sum(q * (c - q) + q * (q + 1) // 2 for q, c in specs)


def _batch(specs, cfg: PrefillBenchConfig, dtype, dev):
    """Packed q, a shuffled paged cache holding every context, tables, and dense per-seq K/V."""
    bs, hkv, d = cfg.block_size, cfg.n_kv_heads, cfg.head_dim
    n_blocks = [(c + bs - 1) // bs for _, c in specs]
    k_cache = torch.randn(sum(n_blocks), bs, hkv, d, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(sum(n_blocks), device=dev).to(torch.int32)
    tables = torch.zeros(len(specs), max(n_blocks), dtype=torch.int32, device=dev)
    dense, start = [], 0
    for i, (_, c) in enumerate(specs):
        ids = perm[start : start + n_blocks[i]]
        start += n_blocks[i]
        tables[i, : len(ids)] = ids
        dense.append(tuple(x[ids.long()].flatten(0, 1)[:c] for x in (k_cache, v_cache)))
    q_lens = [q for q, _ in specs]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    ctx = torch.tensor([c for _, c in specs], dtype=torch.int32, device=dev)
    q = torch.randn(sum(q_lens), cfg.n_heads, d, device=dev, dtype=dtype)
    return (q, k_cache, v_cache, tables, cu, ctx, max(q_lens), d**-0.5), dense


def _sdpa(q, k, v, scale):
    """q (B, H, Sq, D), k/v (B, H, Sk, D): FLASH backend, causal aligned bottom-right."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        if q.shape[2] == k.shape[2]:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        mask = causal_lower_right(q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def run_workload(name: str, cfg: PrefillBenchConfig) -> dict:
    from triton.testing import do_bench

    from project04_llm_inference.kernels.prefill import paged_prefill_attention

    specs = WORKLOADS[name]
    dtype, dev, g = getattr(torch, cfg.dtype), "cuda", cfg.n_heads // cfg.n_kv_heads
    args, dense = _batch(specs, cfg, dtype, dev)
    q, scale, cu = args[0], args[7], args[4].tolist()
    # Per-sequence SDPA inputs: (1, H, S, D), GQA heads repeated, all made before timing.
    per_seq = []
    for i, (k, v) in enumerate(dense):
        qi = q[cu[i] : cu[i + 1]].transpose(0, 1)[None].contiguous()
        ki, vi = (x.transpose(0, 1).repeat_interleave(g, 0)[None].contiguous() for x in (k, v))
        per_seq.append((qi, ki, vi))
    max_q, max_k = max(s for s, _ in specs), max(c for _, c in specs)
    pad = [
        torch.zeros(len(specs), cfg.n_heads, n, cfg.head_dim, device=dev, dtype=dtype)
        for n in (max_q, max_k, max_k)
    ]
    for i, xs in enumerate(per_seq):
        for p, x in zip(pad, xs):
            p[i, :, : x.shape[2]] = x[0]

    flops = 4 * cfg.head_dim * cfg.n_heads * mask_pairs(specs)
    row = {
        "workload": name,
        "n_seqs": len(specs),
        "q_tokens": sum(s for s, _ in specs),
        "context_tokens": sum(c for _, c in specs),
        "flops": flops,
    }
    # Correctness against SDPA before any timing: max |ours - SDPA| over all rows.
    ours = paged_prefill_attention(*args)
    try:
        ref = torch.cat([_sdpa(*xs, scale)[0].transpose(0, 1) for xs in per_seq])
        row["max_abs_diff_vs_sdpa"] = (ours.float() - ref.float()).abs().max().item()
    except RuntimeError as e:  # no FLASH kernel for this case on this build
        row["sdpa_error"] = str(e).splitlines()[0]
    timed = {
        "ours": lambda: paged_prefill_attention(*args),
        "sdpa_per_seq": lambda: [_sdpa(*xs, scale) for xs in per_seq],
        "sdpa_padded": lambda: _sdpa(*pad, scale),
    }
    reps = interleave(
        {
            key: (lambda fn=fn: do_bench(fn, warmup=25, rep=200, return_mode="median"))
            for key, fn in timed.items()
        },
        cfg.repeats,
        catch=(RuntimeError,),
    )
    for key in timed:
        if key in reps.errors:
            row[f"{key}_error"] = reps.errors[key].splitlines()[0]
        ms = reps.spread(key)
        if ms is not None:
            row.update(flat(f"{key}_ms", ms))
            row.update(flat(f"{key}_tflops", ms.map(lambda t: flops / (t * 1e-3) / 1e12)))
    for base in ("sdpa_per_seq", "sdpa_padded"):
        speedup = reps.ratio(base, "ours")
        if speedup is not None:
            row.update(flat(f"speedup_vs_{base}", speedup))
    return row


def run(cfg: PrefillBenchConfig) -> dict:
    """Time every workload of `cfg`, save the JSON record, return it (rows and its path)."""
    from shared.gpu_state import gpu_state, state_line
    from shared.results import output_root, save_result

    if not torch.cuda.is_available():
        raise RuntimeError("the prefill benchmark needs a CUDA GPU")
    if cfg.repeats < 1:
        raise ValueError(f"PrefillBenchConfig.repeats must be >= 1, got {cfg.repeats}")
    start = gpu_state()
    print(f"GPU at start: {state_line(start)}")
    torch.manual_seed(cfg.seed)
    rows = []
    for name in cfg.workloads:
        rows.append(run_workload(name, cfg))
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()})
    reports_dir = str(output_root(cfg.reports_dir))
    results = {
        "rows": rows,
        "workloads": {n: WORKLOADS[n] for n in cfg.workloads},
        "repeats": cfg.repeats,
    }
    path = save_result(
        PROJECT,
        "prefill_attention",
        results,
        baseline="SDPA FLASH per sequence (pre-gathered K/V) and over one padded batch",
        config=asdict(cfg),
        reports_dir=reports_dir,
        gpu_state_start=start,
    )
    print(f"wrote {path}")
    return {**results, "path": str(Path(path))}


def main(argv: list[str] | None = None) -> None:
    """`python -m <this module>`: the package's `prefill-kernel` command (one CLI, one --help)."""
    import sys

    from project04_llm_inference.__main__ import main as package_main

    package_main(["prefill-kernel", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
