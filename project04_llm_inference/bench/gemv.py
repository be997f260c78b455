"""The decode-step projections (csrc/gemv.cu) against cuBLAS, in achieved HBM bandwidth.

    python -m project04_llm_inference gemv-kernel [--reports-dir DIR]

Per projection of a Llama-3.2-1B layer (and its LM head), bf16, for 1, 2, 4 and 8 tokens:
- ours: `kernels.linear`, or `kernels.norm_linear` where the engine folds the RMSNorm (with the
  residual add) in front and silu-and-mul behind: one launch;
- cublas: what the engine ran before this kernel existed, same process: `F.linear` (cuBLAS),
  preceded by the fused add+RMSNorm kernel and followed by silu-and-mul where ours folds them in.
Bytes = the weight + the activations read and written once; GB/s = bytes / median time
(`triton.testing.do_bench`, which flushes L2 between runs, as a decode step finds the weights:
2.5 GB of them pass through a 60 MB L2 every step). The H200's copy ceiling is about 4,300 GB/s.

Each shape is timed in `repeats` repetitions (default 5), ours and cuBLAS alternating
(`shared.repeat.interleave`); figures are medians with `_min`/`_max`, the speedup the median of
per-repetition ratios.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from shared.repeat import DEFAULT_REPEATS, flat, interleave

PROJECT = "project04_llm_inference"

# (name, weight rows, K, fold): fold = "norm" (RMSNorm with the residual add in front),
# "norm_silu" (and silu-and-mul behind), or "" (a plain projection). Llama-3.2-1B's shapes.
SHAPES_1B = (
    ("qkv", 3072, 2048, "norm"),
    ("o", 2048, 2048, ""),
    ("gate_up", 16384, 2048, "norm_silu"),
    ("down", 2048, 8192, ""),
    ("lm_head", 128256, 2048, ""),
)


@dataclass
class GemvBenchConfig:
    """Time the decode-step projections (GEMV kernel vs cuBLAS) of a Llama-3.2-1B layer."""

    tokens: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """rows of the activation (decode tokens in the step)"""
    dtype: str = "bfloat16"
    seed: int = 0
    repeats: int = DEFAULT_REPEATS
    """repetitions per shape, ours and cuBLAS alternating; figures are medians with min-max"""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""


def run_shape(name: str, n: int, k: int, fold: str, t: int, cfg: GemvBenchConfig) -> dict:
    from triton.testing import do_bench

    from project04_llm_inference.kernels import gemv
    from project04_llm_inference.kernels.norm_act import fused_add_rms_norm, silu_and_mul

    dtype = getattr(torch, cfg.dtype)
    elt = torch.finfo(dtype).bits // 8
    w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
    x = torch.randn(t, k, device="cuda", dtype=dtype)
    res = torch.randn(t, k, device="cuda", dtype=dtype)
    nw = 1 + 0.1 * torch.randn(k, device="cuda", dtype=dtype)
    n_out = n // 2 if fold == "norm_silu" else n
    act_bytes = t * k * elt * (3 if fold else 1) + t * n_out * elt  # x (+ residual in and out)
    row = {
        "name": name,
        "tokens": t,
        "rows": n,
        "k": k,
        "fold": fold or "none",
        "bytes": n * k * elt + act_bytes,
    }
    silu = fold == "norm_silu"

    if fold:

        def ours():
            return gemv.norm_linear(x, res, nw, w, 1e-5, silu_mul=silu)[0]

        def cublas():
            h, _ = fused_add_rms_norm(x.clone(), res.clone(), nw, 1e-5)
            y = F.linear(h, w)
            return silu_and_mul(y) if silu else y

        def cublas_timed():  # the clones are not what the engine ran: time on scratch copies
            h, _ = fused_add_rms_norm(xs, rs, nw, 1e-5)
            y = F.linear(h, w)
            return silu_and_mul(y) if silu else y

        xs, rs = x.clone(), res.clone()
    else:

        def ours():
            return gemv.linear(x, w)

        def cublas():
            return F.linear(x, w)

        cublas_timed = cublas
    row["uses_gemv_kernel"] = gemv.gemv_applies(x, w)
    row["max_abs_diff_vs_cublas"] = (ours().float() - cublas().float()).abs().max().item()

    def timed(fn):
        return lambda: do_bench(fn, warmup=10, rep=40, return_mode="median")

    reps = interleave({"ours": timed(ours), "cublas": timed(cublas_timed)}, cfg.repeats)
    for key in ("ours", "cublas"):
        ms = reps.spread(key)
        row.update(flat(f"{key}_us", ms.map(lambda v: v * 1e3)))
        row.update(flat(f"{key}_gbps", ms.map(lambda v: row["bytes"] / (v * 1e-3) / 1e9)))
    row.update(flat("speedup_vs_cublas", reps.ratio("cublas", "ours")))
    return row


def run(cfg: GemvBenchConfig) -> dict:
    """Time every (projection, tokens) shape, save the JSON record, return it with its path."""
    from shared.gpu_state import gpu_state, state_line
    from shared.results import REPO_ROOT, save_result

    if not torch.cuda.is_available():
        raise RuntimeError("the GEMV kernel benchmark needs a CUDA GPU")
    if cfg.repeats < 1:
        raise ValueError(f"GemvBenchConfig.repeats must be >= 1, got {cfg.repeats}")
    if not cfg.tokens or any(not 1 <= t <= 8 for t in cfg.tokens):
        raise ValueError(f"GemvBenchConfig.tokens must be in 1..8, got {cfg.tokens}")
    start = gpu_state()
    print(f"GPU at start: {state_line(start)}")
    torch.manual_seed(cfg.seed)
    rows = []
    for name, n, k, fold in SHAPES_1B:
        for t in cfg.tokens:
            rows.append(run_shape(name, n, k, fold, t, cfg))
            r = rows[-1]
            print(
                f"{name:8s} T={t}  ours {r['ours_us']:7.1f} us {r['ours_gbps']:6.0f} GB/s   "
                f"cuBLAS {r['cublas_us']:7.1f} us {r['cublas_gbps']:6.0f} GB/s   "
                f"x{r['speedup_vs_cublas']:.2f}"
            )
    reports_dir = cfg.reports_dir or str(
        REPO_ROOT / "runs" / _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    )
    results = {"rows": rows, "copy_ceiling_gbps": 4294, "repeats": cfg.repeats}
    path = save_result(
        PROJECT,
        "gemv_kernel",
        results,
        baseline=(
            "cuBLAS (F.linear) with the separate fused add+RMSNorm and silu-and-mul kernels, "
            "same process"
        ),
        config=asdict(cfg),
        reports_dir=reports_dir,
        gpu_state_start=start,
    )
    print(f"wrote {path}")
    return {**results, "path": str(Path(path))}
