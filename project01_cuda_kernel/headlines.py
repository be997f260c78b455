"""The front page's claims: each headline figure, the record it comes from, and its target.

`make readme` renders these into the README's results table (`shared.front_page`). The detail
behind each figure (every shape, every kernel) is in the record and its summary.
"""

from __future__ import annotations

from shared.front_page import Claim, spread_of

GEMM = "gemm.json"
GEMM_FP8 = "gemm_fp8.json"  # the FP8 step beside step 9 and their baselines, one run
ATTENTION = "attention.json"


def _best_row(rec: dict, dtype: str, size: int) -> dict | None:
    from project01_cuda_kernel.report.gemm import best_row

    return best_row(rec, dtype, size)


def _best_pct(dtype: str, size: int):
    def measure(rec: dict) -> float | None:
        row = _best_row(rec, dtype, size)
        return row["pct_of_cublas"] if row else None

    return measure


def _best_pct_spread(dtype: str, size: int):
    return lambda rec: spread_of(_best_row(rec, dtype, size), "pct_of_cublas")


def _worst_ratio(role: str, mode: str, base: str = "flash", min_seq: int = 2048):
    """The lowest ours / base ratio at head dim 128, seq >= min_seq (every causal setting):
    the shape a target is judged by. `role`: "fa2" (the FlashAttention-2-style kernel) or
    "hopper" (the wgmma + TMA kernel "ours" runs on compute capability 9.0)."""
    worst = _worst_spread(role, mode, base, min_seq)

    def measure(rec: dict) -> float | None:
        s = worst(rec)
        return None if s is None else s.median

    return measure


def _worst_range(role: str, mode: str, base: str = "flash", min_seq: int = 2048):
    """The repetitions' range of the ratio at the worst shape."""
    worst = _worst_spread(role, mode, base, min_seq)

    def spread(rec: dict) -> tuple[float, float] | None:
        s = worst(rec)
        return None if s is None or len(s.values) < 2 else (min(s.values), max(s.values))

    return spread


def _worst_spread(role: str, mode: str, base: str, min_seq: int):
    def worst(rec: dict):
        from project01_cuda_kernel.report.attention import _by_key, backward_kernels
        from shared.repeat import row_ratio

        res = rec["results"]
        hopper_fwd = res.get("ours_forward_kernel") == "hopper"
        hopper_bwd = backward_kernels(res).get(128) == "hopper"
        if role == "hopper":
            provider = "ours"
        elif mode == "fwd":
            provider = "ours_fa2" if hopper_fwd else "ours"
        else:
            provider = "ours_fa2bwd" if hopper_bwd else "ours"
        t = _by_key(res["rows"])
        ratios = [
            r
            for (d, s, causal, m, p), row in t.items()
            if p == provider and m == mode and d == 128 and s >= min_seq
            for r in [row_ratio(row, t.get((d, s, causal, m, base)), "tflops")]
            if r is not None
        ]
        return min(ratios, key=lambda r: r.median) if ratios else None

    return worst


CLAIMS = [
    Claim(
        "FP8 step 10 (e4m3, bf16 out), 8192³",
        GEMM_FP8,
        _best_pct("float8_e4m3fn", 8192),
        "% of torch._scaled_mm",
        90.0,
        spread=_best_pct_spread("float8_e4m3fn", 8192),
    ),
    Claim(
        "best float32 matmul, 4096³",
        GEMM,
        _best_pct("float32", 4096),
        "% of cuBLAS",
        90.0,
        spread=_best_pct_spread("float32", 4096),
        root=True,
    ),
    Claim(
        "best bfloat16 matmul, 4096³",
        GEMM,
        _best_pct("bfloat16", 4096),
        "% of cuBLAS",
        90.0,
        spread=_best_pct_spread("bfloat16", 4096),
        root=True,
    ),
    Claim(
        "best bfloat16 matmul, 8192³",
        GEMM,
        _best_pct("bfloat16", 8192),
        "% of cuBLAS",
        90.0,
        spread=_best_pct_spread("bfloat16", 8192),
    ),
    Claim(
        "FA2-style forward, worst shape (d 128, seq >= 2k)",
        ATTENTION,
        _worst_ratio("fa2", "fwd"),
        "x SDPA FLASH",
        0.90,
        fmt=".2f",
        spread=_worst_range("fa2", "fwd"),
    ),
    Claim(
        "FA2-style backward, worst shape (d 128, seq >= 2k)",
        ATTENTION,
        _worst_ratio("fa2", "bwd"),
        "x SDPA FLASH",
        0.75,
        fmt=".2f",
        spread=_worst_range("fa2", "bwd"),
    ),
    Claim(
        "Hopper forward (wgmma + TMA), worst shape",
        ATTENTION,
        _worst_ratio("hopper", "fwd"),
        "x SDPA FLASH",
        1.30,
        fmt=".2f",
        spread=_worst_range("hopper", "fwd"),
    ),
    Claim(
        "Hopper forward + backward, worst shape (seq >= 4k)",
        ATTENTION,
        _worst_ratio("hopper", "fwd_bwd", base="cudnn", min_seq=4096),
        "x SDPA cuDNN",
        0.85,
        fmt=".2f",
        root=True,
        spread=_worst_range("hopper", "fwd_bwd", base="cudnn", min_seq=4096),
    ),
]
