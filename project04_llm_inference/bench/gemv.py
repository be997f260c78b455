"""The decode-step projections (csrc/gemv.cu) against cuBLAS, in achieved HBM bandwidth.

    python -m project04_llm_inference gemv-kernel [--reports-dir DIR]
    python -m project04_llm_inference gemv-kernel --mma-max-tokens 8 --tokens 3 4 5 6 7 8 \
        --chain-tokens 4 8    # the tensor-core variant (3-8 tokens): gemv_kernel_mma.json

Per projection of a Llama-3.2-1B layer (and its LM head), bf16, for 1, 2, 4 and 8 tokens:
- ours: `kernels.linear`, or `kernels.norm_linear` where the engine folds the RMSNorm (with the
  residual add) in front and silu-and-mul behind: one launch;
- cublas: what the engine ran before this kernel existed, same process: `F.linear` (cuBLAS),
  preceded by the fused add+RMSNorm kernel and followed by silu-and-mul where ours folds them in.
Bytes = the weight + the activations read and written once; GB/s = bytes / median time
(`triton.testing.do_bench`, which flushes L2 between runs, as a decode step finds the weights:
the weights of a step are far larger than L2). The record carries the copy bandwidth of
`shared.hardware` it is compared with.

Each shape is timed in `repeats` repetitions (default 5), ours and cuBLAS alternating
(`shared.repeat.interleave`); figures are medians with `_min`/`_max`, the speedup the median of
per-repetition ratios.

Rows of 3..8 tokens run the tensor-core variant where the engine does (`kernels.gemv.MMA_MAX_TOKENS`,
8 on sm_80 and newer). `mma_max_tokens` (3..8) sets that bound for the run and writes the record
as `gemv_kernel_mma.json` (the tensor-core study) instead of `gemv_kernel.json`. Each row says which path `ours` took
(`path`: simt, mma, or cublas where the kernel does not take the shape).

FP8 (`fp8`, on by default; compute capability >= 8.9): each projection again with its weight
quantized to e4m3 with one scale per row (`kernels.fp8.Fp8Weight`, as `--quantization fp8`
loads it), in `fp8_rows`: ours is the engine's dispatch (`path`: the GEMV kernel's FP8 variant
at one and two tokens, `_scaled_mm` from three on), the baseline the `_scaled_mm` path (W8A8:
the separate norm kernel, the activations quantized per token, `torch._scaled_mm`, then
silu-and-mul), same process. Bytes = the e4m3 weight, its float32 scales and the activations;
`copy_share` is ours as a share of the copy bandwidth, `speedup_vs_bf16` the bf16 row's median
time over this one's (the same projection and tokens with 16-bit weights, timed in the same
process).

Chain: the four projections of every layer of the model back to back (16 layers: 1.95 GB of
weights per pass), as a decode step runs them, captured in one CUDA graph per variant and timed
by replaying it: the GEMV kernel with programmatic dependent launch (the engine's default on
sm_90), the GEMV kernel with ordinary launches, and the cuBLAS path; with `fp8` and one or two
tokens, also the GEMV kernel's FP8 variant with PDL on the same weights quantized (`fp8_*`,
bytes counted in e4m3 plus the scales and the bf16 norm weights). What PDL saves shows here
and not in the single-projection rows, which time one launch after an L2 flush.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from project04_llm_inference import PROJECT
from shared.hardware import detect_gpu, get_gpu
from shared.repeat import DEFAULT_REPEATS, flat, interleave

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
    chain_tokens: list[int] = field(default_factory=lambda: [1, 2])
    """rows of the layer-chain timing (empty: skip it)"""
    chain_layers: int = 16
    """layers in the chain (Llama-3.2-1B has 16)"""
    fp8: bool = True
    """also time every projection (and the chain) with FP8 weights: the GEMV kernel's FP8
    variant against the `_scaled_mm` path (needs compute capability >= 8.9, else skipped)"""
    mma_max_tokens: int = 0
    """3..8: steps of 3..N tokens run the tensor-core variant (kernels.gemv.MMA_MAX_TOKENS for
    this run), record gemv_kernel_mma.json; 0: the engine's setting, record gemv_kernel.json"""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""


def run_shape(name: str, n: int, k: int, fold: str, t: int, cfg: GemvBenchConfig) -> dict:
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
    row["path"] = (
        ("simt" if t <= gemv.GEMV_MAX_TOKENS else "mma") if row["uses_gemv_kernel"] else "cublas"
    )
    row["max_abs_diff_vs_cublas"] = (ours().float() - cublas().float()).abs().max().item()

    return _time_against(row, ours, "cublas", cublas_timed, cfg)


def _time_against(row: dict, ours, name: str, baseline, cfg) -> dict:
    """Time ours and the baseline interleaved (`cfg.repeats` medians each): row gains each one's
    us and GB/s (over row["bytes"]) with their spreads, and ours' speed-up over `name`."""
    from triton.testing import do_bench

    def timed(fn):
        return lambda: do_bench(fn, warmup=10, rep=40, return_mode="median")

    reps = interleave({"ours": timed(ours), name: timed(baseline)}, cfg.repeats)
    for key in ("ours", name):
        ms = reps.spread(key)
        row.update(flat(f"{key}_us", ms.map(lambda v: v * 1e3)))
        row.update(flat(f"{key}_gbps", ms.map(lambda v: row["bytes"] / (v * 1e-3) / 1e9)))
    row.update(flat(f"speedup_vs_{name}", reps.ratio(name, "ours")))
    return row


def run_shape_fp8(name: str, n: int, k: int, fold: str, t: int, cfg: GemvBenchConfig) -> dict:
    """One projection with e4m3 weights: the engine's dispatch against the `_scaled_mm` path."""
    from project04_llm_inference.kernels import gemv
    from project04_llm_inference.kernels.fp8 import Fp8Weight, fp8_linear
    from project04_llm_inference.kernels.norm_act import fused_add_rms_norm, silu_and_mul

    dtype = getattr(torch, cfg.dtype)
    elt = torch.finfo(dtype).bits // 8
    fw = Fp8Weight.from_float(torch.randn(n, k, device="cuda", dtype=dtype) * 0.02)
    x = torch.randn(t, k, device="cuda", dtype=dtype)
    res = torch.randn(t, k, device="cuda", dtype=dtype)
    nw = 1 + 0.1 * torch.randn(k, device="cuda", dtype=dtype)
    silu = fold == "norm_silu"
    n_out = n // 2 if silu else n
    act_bytes = t * k * elt * (3 if fold else 1) + t * n_out * elt
    cap = torch.cuda.get_device_capability()
    row = {
        "name": name,
        "tokens": t,
        "rows": n,
        "k": k,
        "fold": fold or "none",
        "weight": "float8_e4m3fn",
        "bytes": n * k + 4 * n + act_bytes,  # e4m3 weight, float32 scales, activations
        "path": gemv.fp8_route(t, n, k, dtype, "cuda", cap),
    }
    xs, rs = x.clone(), res.clone()  # the composed path updates its inputs in place

    if fold:

        def ours():
            return gemv.norm_linear(x, res, nw, fw, 1e-5, silu_mul=silu)[0]

        def scaled_mm():
            h, _ = fused_add_rms_norm(xs, rs, nw, 1e-5)
            y = fp8_linear(h, fw)
            return silu_and_mul(y) if silu else y

        def scaled_mm_fresh():  # on the same inputs as ours, for the difference
            xs.copy_(x), rs.copy_(res)
            return scaled_mm()
    else:

        def ours():
            return gemv.linear(x, fw)

        def scaled_mm():
            return fp8_linear(x, fw)

        scaled_mm_fresh = scaled_mm
    # the baseline first: from three tokens on ours is the composed path too, which updates x
    # and res in place
    want = scaled_mm_fresh().float()
    row["max_abs_diff_vs_scaled_mm"] = (ours().float() - want).abs().max().item()

    return _time_against(row, ours, "scaled_mm", scaled_mm, cfg)


def _chain_weights(layers: int, dtype: torch.dtype) -> list[dict]:
    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device="cuda", dtype=dtype) * 0.02

    def nw(k: int) -> torch.Tensor:
        return 1 + 0.1 * torch.randn(k, device="cuda", dtype=dtype)

    shapes = {name: (n, k) for name, n, k, _ in SHAPES_1B}
    return [
        {
            "qkv": w(*shapes["qkv"]),
            "o": w(*shapes["o"]),
            "gate_up": w(*shapes["gate_up"]),
            "down": w(*shapes["down"]),
            "norm1": nw(shapes["qkv"][1]),
            "norm2": nw(shapes["gate_up"][1]),
        }
        for _ in range(layers)
    ]


def run_chain(t: int, weights: list[dict], cfg: GemvBenchConfig) -> dict:
    """The layers' projections back to back in one CUDA graph: GEMV with and without PDL, cuBLAS."""
    from project04_llm_inference.kernels import gemv, pdl
    from project04_llm_inference.kernels.norm_act import fused_add_rms_norm, rms_norm, silu_and_mul

    dtype = getattr(torch, cfg.dtype)
    d = weights[0]["o"].shape[0]
    x = torch.randn(t, d, device="cuda", dtype=dtype)
    attn = torch.randn(t, d, device="cuda", dtype=dtype)  # stands for the attention output

    def ours() -> torch.Tensor:
        h, res = x, None
        for lw in weights:
            _, res = gemv.norm_linear(h, res, lw["norm1"], lw["qkv"], 1e-5)
            o = gemv.linear(attn, lw["o"])
            act, res = gemv.norm_linear(o, res, lw["norm2"], lw["gate_up"], 1e-5, silu_mul=True)
            h = gemv.linear(act, lw["down"])
        return h + res

    def cublas() -> torch.Tensor:
        h, res = x.clone(), None
        for lw in weights:
            if res is None:
                hn, res = rms_norm(h, lw["norm1"], 1e-5), h
            else:
                hn, res = fused_add_rms_norm(h, res, lw["norm1"], 1e-5)
            F.linear(hn, lw["qkv"])
            o = F.linear(attn, lw["o"])
            hn, res = fused_add_rms_norm(o, res, lw["norm2"], 1e-5)
            h = F.linear(silu_and_mul(F.linear(hn, lw["gate_up"])), lw["down"])
        return h + res

    def capture(fn, use_pdl: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        saved, pdl.USE_PDL = pdl.USE_PDL, use_pdl
        try:
            fn()  # eager first: extensions loaded, function attributes set
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn()
            graph.replay()
            torch.cuda.synchronize()
            return graph, out
        finally:
            pdl.USE_PDL = saved

    fp8_weights = None
    if cfg.fp8 and _fp8_capable() and t <= gemv.GEMV_MAX_TOKENS:
        from project04_llm_inference.kernels.fp8 import Fp8Weight

        fp8_weights = [
            {
                key: Fp8Weight.from_float(v) if key in ("qkv", "o", "gate_up", "down") else v
                for key, v in lw.items()
            }
            for lw in weights
        ]

    def ours_fp8() -> torch.Tensor:
        h, res = x, None
        for lw in fp8_weights:
            _, res = gemv.norm_linear(h, res, lw["norm1"], lw["qkv"], 1e-5)
            o = gemv.linear(attn, lw["o"])
            act, res = gemv.norm_linear(o, res, lw["norm2"], lw["gate_up"], 1e-5, silu_mul=True)
            h = gemv.linear(act, lw["down"])
        return h + res

    variants = {
        "gemv_pdl": capture(ours, True),
        "gemv": capture(ours, False),
        "cublas": capture(cublas, False),
    }
    if fp8_weights is not None:
        variants["fp8_gemv_pdl"] = capture(ours_fp8, True)
    ref = variants["gemv"][1].float()
    row = {
        "tokens": t,
        "layers": len(weights),
        "bytes": sum(sum(v.numel() * v.element_size() for v in lw.values()) for lw in weights),
        "pdl_bitwise_equal": bool(torch.equal(variants["gemv_pdl"][1].float(), ref)),
        "max_abs_diff_vs_cublas": (variants["cublas"][1].float() - ref).abs().max().item(),
        "pdl_capable": torch.cuda.get_device_capability() >= (9, 0),
    }

    def timed(graph: torch.cuda.CUDAGraph, n: int = 50):
        def measure() -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()
            start.record()
            for _ in range(n):
                graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n  # ms per pass

        return measure

    reps = interleave({k: timed(g) for k, (g, _) in variants.items()}, cfg.repeats)
    for key in variants:
        ms = reps.spread(key)
        row.update(flat(f"{key}_us", ms.map(lambda v: v * 1e3)))
        row.update(flat(f"{key}_gbps", ms.map(lambda v: row["bytes"] / (v * 1e-3) / 1e9)))
    row.update(flat("pdl_speedup", reps.ratio("gemv", "gemv_pdl")))
    row.update(flat("pdl_speedup_vs_cublas", reps.ratio("cublas", "gemv_pdl")))
    if fp8_weights is not None:
        fp8_bytes = sum(
            sum(
                v.qweight.numel() + 4 * v.scale.numel()
                if hasattr(v, "qweight")
                else v.numel() * v.element_size()
                for v in lw.values()
            )
            for lw in fp8_weights
        )
        fp8_ms = reps.spread("fp8_gemv_pdl")
        row["fp8_bytes"] = fp8_bytes
        row.update(flat("fp8_gemv_pdl_us", fp8_ms.map(lambda v: v * 1e3)))
        row.update(flat("fp8_gemv_pdl_gbps", fp8_ms.map(lambda v: fp8_bytes / (v * 1e-3) / 1e9)))
        row.update(flat("fp8_speedup_vs_bf16", reps.ratio("gemv_pdl", "fp8_gemv_pdl")))
    return row


def _fp8_capable() -> bool:
    from project04_llm_inference.kernels.fp8 import MIN_FP8_CAPABILITY

    return torch.cuda.get_device_capability() >= MIN_FP8_CAPABILITY


def check_config(cfg: GemvBenchConfig) -> None:
    """Raise ValueError naming the first bad field."""
    from project04_llm_inference.kernels import gemv

    if cfg.repeats < 1:
        raise ValueError(f"GemvBenchConfig.repeats must be >= 1, got {cfg.repeats}")
    if not cfg.tokens or any(not 1 <= t <= 8 for t in cfg.tokens):
        raise ValueError(f"GemvBenchConfig.tokens must be in 1..8, got {cfg.tokens}")
    if any(not 1 <= t <= 8 for t in cfg.chain_tokens):
        raise ValueError(f"GemvBenchConfig.chain_tokens must be in 1..8, got {cfg.chain_tokens}")
    if cfg.chain_layers < 1:
        raise ValueError(f"GemvBenchConfig.chain_layers must be >= 1, got {cfg.chain_layers}")
    hi = gemv.MMA_KERNEL_MAX_TOKENS
    if cfg.mma_max_tokens and not gemv.GEMV_MAX_TOKENS < cfg.mma_max_tokens <= hi:
        raise ValueError(
            f"GemvBenchConfig.mma_max_tokens must be 0 or in {gemv.GEMV_MAX_TOKENS + 1}..{hi}, "
            f"got {cfg.mma_max_tokens}"
        )


def run(cfg: GemvBenchConfig) -> dict:
    """Time every (projection, tokens) shape, save the JSON record, return it with its path."""
    from project04_llm_inference.kernels import gemv

    check_config(cfg)
    if not torch.cuda.is_available():
        raise RuntimeError("the GEMV kernel benchmark needs a CUDA GPU")
    saved = gemv.MMA_MAX_TOKENS
    if cfg.mma_max_tokens:
        gemv.MMA_MAX_TOKENS = cfg.mma_max_tokens
    try:
        return _run(cfg)
    finally:
        gemv.MMA_MAX_TOKENS = saved


def _run(cfg: GemvBenchConfig) -> dict:
    from project04_llm_inference.kernels import gemv
    from shared.gpu_state import gpu_state, state_line
    from shared.results import output_root, save_result

    mma_on = gemv.max_tokens(torch.cuda.get_device_capability()) > gemv.GEMV_MAX_TOKENS
    start = gpu_state()
    print(f"GPU at start: {state_line(start)}")
    if mma_on:
        print(f"tensor-core variant on for 3..{gemv.MMA_MAX_TOKENS} tokens")
    torch.manual_seed(cfg.seed)
    # the copy bandwidth measured for this GPU where the table has one, else the H200's
    spec = detect_gpu()
    if spec is None or spec.copy_bandwidth_gbs is None:
        spec = get_gpu("h200-sxm")
    copy_ceiling = spec.copy_bandwidth_gbs.value
    rows = []
    for name, n, k, fold in SHAPES_1B:
        for t in cfg.tokens:
            rows.append(run_shape(name, n, k, fold, t, cfg))
            r = rows[-1]
            print(
                f"{name:8s} T={t}  ours {r['ours_us']:7.1f} us {r['ours_gbps']:6.0f} GB/s   "
                f"cuBLAS {r['cublas_us']:7.1f} us {r['cublas_gbps']:6.0f} GB/s   "
                f"x{r['speedup_vs_cublas']:.2f}  ({r['path']}, max |diff| "
                f"{r['max_abs_diff_vs_cublas']:.3g})"
            )
    fp8_rows = []
    if cfg.fp8 and not _fp8_capable():
        print("FP8 rows skipped: they need compute capability >= 8.9")
    elif cfg.fp8:
        bf16 = {(r["name"], r["tokens"]): r for r in rows}
        for name, n, k, fold in SHAPES_1B:
            if name == "lm_head":  # --quantization fp8 keeps the LM head in the model dtype
                continue
            for t in cfg.tokens:
                r = run_shape_fp8(name, n, k, fold, t, cfg)
                r["copy_share"] = r["ours_gbps"] / copy_ceiling
                r["speedup_vs_bf16"] = bf16[name, t]["ours_us"] / r["ours_us"]
                fp8_rows.append(r)
                print(
                    f"{name:8s} T={t} fp8  ours {r['ours_us']:7.1f} us {r['ours_gbps']:6.0f} "
                    f"GB/s ({100 * r['copy_share']:.0f}% of copy)   _scaled_mm "
                    f"{r['scaled_mm_us']:7.1f} us   x{r['speedup_vs_scaled_mm']:.2f}, "
                    f"vs bf16 x{r['speedup_vs_bf16']:.2f}  ({r['path']})"
                )
    chain = []
    if cfg.chain_tokens:
        weights = _chain_weights(cfg.chain_layers, getattr(torch, cfg.dtype))
        for t in cfg.chain_tokens:
            chain.append(run_chain(t, weights, cfg))
            r = chain[-1]
            print(
                f"chain of {r['layers']} layers T={t}: GEMV+PDL {r['gemv_pdl_us']:7.1f} us "
                f"({r['gemv_pdl_gbps']:.0f} GB/s), GEMV {r['gemv_us']:7.1f} us, cuBLAS "
                f"{r['cublas_us']:7.1f} us; PDL x{r['pdl_speedup']:.3f}, "
                f"bitwise equal {r['pdl_bitwise_equal']}"
                + (
                    f"; FP8 GEMV+PDL {r['fp8_gemv_pdl_us']:7.1f} us "
                    f"({r['fp8_gemv_pdl_gbps']:.0f} GB/s, x{r['fp8_speedup_vs_bf16']:.2f} vs bf16)"
                    if "fp8_gemv_pdl_us" in r
                    else ""
                )
            )
        del weights
    reports_dir = str(output_root(cfg.reports_dir))
    results = {
        "rows": rows,
        "fp8_rows": fp8_rows,
        "chain": chain,
        "copy_ceiling_gbps": copy_ceiling,
        "copy_ceiling_gpu": spec.name,
        "repeats": cfg.repeats,
        "mma_max_tokens": gemv.MMA_MAX_TOKENS if mma_on else 0,
    }
    path = save_result(
        PROJECT,
        "gemv_kernel_mma" if cfg.mma_max_tokens else "gemv_kernel",
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
